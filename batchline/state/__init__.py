"""Per-key state (SPEC D): GroupState, the operator, its versioned store, offline access
(reading, rescaling and writing state), and a tester that runs a state function without Spark."""

from batchline.state.admin import (
    WriteStateResult,
    read_state,
    rescale_state,
    state_operators,
    state_versions,
    write_state,
)
from batchline.state.contract import StateFunctionError
from batchline.state.group_state import AtEnd, GroupState, GroupStateTimeout, NoStateError, TimeoutNotEnabledError
from batchline.state.schema import StateSchemaError
from batchline.state.store import FileStateStore, MemoryStateStore, StateStore, StateStoreError, StateVersionError
from batchline.state.tester import StateFunctionTester

__all__ = [
    "AtEnd",
    "FileStateStore",
    "GroupState",
    "GroupStateTimeout",
    "MemoryStateStore",
    "NoStateError",
    "StateFunctionError",
    "StateFunctionTester",
    "StateSchemaError",
    "StateStore",
    "StateStoreError",
    "StateVersionError",
    "TimeoutNotEnabledError",
    "WriteStateResult",
    "read_state",
    "rescale_state",
    "state_operators",
    "state_versions",
    "write_state",
]
