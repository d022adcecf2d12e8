"""Per-key state (SPEC D): GroupState, the operator, its versioned store, offline access
(reading, rescaling and writing state), and a tester that runs a state function without Spark.

Names are imported when first used (see batchline/__init__.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (PEP 562)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where[0])
    value = module if where[1] == "" else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
