"""Timer, event loop, job generation, the batches themselves and job scheduling (SPEC A1–A7).

A batch lives in ``batch_run.BatchRun``, from its timer tick to its commit. The generator
makes one per due batch and knows the pipeline only through its ``Batches`` protocol (which
the recovery room's batch commit implements); it hands each run to the scheduler through a
callable. The scheduler runs them, keeping what is about many batches (slots, threads,
cancelling); each run commits itself through the pipeline it was made with. The generator
and the scheduler do not import each other.
"""
