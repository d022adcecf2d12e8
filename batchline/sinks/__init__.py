"""Outputs: console, files (SPEC C2); foreach_batch is a plain function."""
