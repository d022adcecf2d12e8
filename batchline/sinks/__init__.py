"""Outputs (SPEC C2) on the ``Sink`` interface (``batchline.streams.sink``): console, files,
PostgreSQL; ``foreach_batch`` wraps a plain function."""
