"""The user-facing stream API: StreamingContext, Stream, KeyedStream."""
