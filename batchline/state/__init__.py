"""Per-key state: GroupState and the index of timeouts (SPEC D1, D2)."""
