"""Inputs (SPEC B): directory, socket receiver, generator, DataFrame, queue, Redis Streams,
and a list for tests.

Every input but the receivers is a ``Source`` (``source.py``): a description that plans each
batch from a JSON position and reads it, with no engine in it. ``source_input.py`` is the
one engine-side implementation that runs any of them: it logs and replays each batch, keeps
the position in the checkpoint, and counts good rows and dead letters. The socket/receiver
input still runs on the internal input node of ``streams`` (its blocks, write-ahead log and
receiving threads have no ``Source`` hooks yet).
"""
