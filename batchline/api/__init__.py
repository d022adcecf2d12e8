"""The top floor: ``StreamingContext`` and the streams a user builds (``Stream``,
``KeyedStream``). It turns the description into runtimes at ``start()`` and wires the rooms
below it: sources, state, sinks, the stream model, recovery and the scheduler."""
