"""Recovery: the batch commit protocol and the restart that resumes it (SPEC E1–E3).

``batch_commit`` is the one place where a batch becomes durable, step by step; ``restart``
reads back what those steps left at the checkpoint location and decides which batches run
again, with which inputs.
"""

from batchline.recovery.batch_commit import BatchCommit
from batchline.recovery.restart import RestartPlan, plan_restart

__all__ = ["BatchCommit", "RestartPlan", "plan_restart"]
