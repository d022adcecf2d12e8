"""Timer, event loop, job generation and job scheduling (SPEC A1–A7)."""
