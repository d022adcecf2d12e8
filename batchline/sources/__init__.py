"""Inputs (SPEC B): directory, socket receiver, generator, queue, and a list for tests.

Each source is two classes on the stream model: a node that describes it (path, schema,
rate, name; no side effects) and a reader, its runtime, that allocates each batch's data,
logs and replays it, and builds the batch's DataFrame.
"""
