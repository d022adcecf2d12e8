"""Inputs: directory, socket receiver, generator, queue (SPEC B)."""
