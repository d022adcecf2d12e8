"""Timer, event loop, job generation and job scheduling (SPEC A1–A7).

The generator knows the pipeline only through its ``Batches`` protocol (which the recovery
room's batch commit implements) and hands job sets to the scheduler through a callable;
the scheduler commits a finished batch through one. Neither imports the other.
"""
