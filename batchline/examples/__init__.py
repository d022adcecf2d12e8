"""Examples that ship with the package, so that Python workers can import them (the demo runs one)."""
