"""Checkpoints, the batch log, the lease and their storage (SPEC A6, A8, E1–E5)."""
