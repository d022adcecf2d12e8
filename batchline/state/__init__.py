"""Per-key state (SPEC D): GroupState, the operator, its versioned store, and offline access."""

from batchline.state.admin import read_state, rescale_state, state_operators, state_versions
from batchline.state.execution import StateFunctionError
from batchline.state.group_state import GroupState, GroupStateTimeout, NoStateError, TimeoutNotEnabledError
from batchline.state.schema import StateSchemaError
from batchline.state.store import StateVersionError

__all__ = [
    "GroupState",
    "GroupStateTimeout",
    "NoStateError",
    "StateFunctionError",
    "StateSchemaError",
    "StateVersionError",
    "TimeoutNotEnabledError",
    "read_state",
    "rescale_state",
    "state_operators",
    "state_versions",
]
