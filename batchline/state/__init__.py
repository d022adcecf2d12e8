"""Per-key state (SPEC D): GroupState, the operator, its versioned store, offline access
(reading, rescaling and writing state), and a tester that runs a state function without Spark.

Names are imported when first used (``batchline.lazy_names``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchline.lazy_names import lazy_names

if TYPE_CHECKING:
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

_WHERE = {
    "WriteStateResult": ("batchline.state.admin", "WriteStateResult"),
    "read_state": ("batchline.state.admin", "read_state"),
    "rescale_state": ("batchline.state.admin", "rescale_state"),
    "state_operators": ("batchline.state.admin", "state_operators"),
    "state_versions": ("batchline.state.admin", "state_versions"),
    "write_state": ("batchline.state.admin", "write_state"),
    "StateFunctionError": ("batchline.state.contract", "StateFunctionError"),
    "AtEnd": ("batchline.state.group_state", "AtEnd"),
    "GroupState": ("batchline.state.group_state", "GroupState"),
    "GroupStateTimeout": ("batchline.state.group_state", "GroupStateTimeout"),
    "NoStateError": ("batchline.state.group_state", "NoStateError"),
    "TimeoutNotEnabledError": ("batchline.state.group_state", "TimeoutNotEnabledError"),
    "StateSchemaError": ("batchline.state.schema", "StateSchemaError"),
    "FileStateStore": ("batchline.state.store", "FileStateStore"),
    "MemoryStateStore": ("batchline.state.store", "MemoryStateStore"),
    "StateStore": ("batchline.state.store", "StateStore"),
    "StateStoreError": ("batchline.state.store", "StateStoreError"),
    "StateVersionError": ("batchline.state.store", "StateVersionError"),
    "StateFunctionTester": ("batchline.state.tester", "StateFunctionTester"),
}
"""Each public name: the module that defines it, and its name there."""

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


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
