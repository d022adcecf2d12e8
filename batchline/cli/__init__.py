"""The ``batchline`` command."""
