"""Inputs (SPEC B): directory, socket receiver, generator, DataFrame, queue, Redis Streams,
and a list for tests.

Every input is a ``Source`` (``source.py``): a description that plans each batch from a
JSON position and reads it, with no engine in it; the receivers' blocks (``receiver.py``)
too, held on the driver and written ahead to the checkpoint location. ``source_input.py`` is
the one engine-side implementation that runs any of them: it logs and replays each batch,
keeps the position in the checkpoint, and counts good rows and dead letters.
"""
