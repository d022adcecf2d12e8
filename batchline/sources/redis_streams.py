"""Entries of Redis streams, read exactly once per batch (SPEC B3), on the Source interface.

A position is the last entry id read from each stream (``{"orders": "1700000000000-3"}``).
Planning a batch runs one small Lua script per stream on the server: it walks the new
entries (at most ``max_records_per_batch``) and returns only their count, the last id and
every ``split_size``-th id, so the driver never receives the entries themselves. Each split
is an id range ``(after, to]`` with the number of entries it held when planned; a Spark task
reads it with ``XRANGE`` and fails, naming the range, when entries are missing (the stream
was trimmed or entries were deleted after the batch was logged). Nothing is skipped silently.

Connection loss (refused, reset, timed out) is retried with exponential backoff and logged,
on the driver and in the tasks, for up to ``retry_timeout_s`` seconds.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal, InvalidOperation
from itertools import chain
from typing import Any, TypeVar

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from batchline.clock import Clock, SystemClock
from batchline.errors import ConfigurationError, SourceError
from batchline.sources.source import DeadLetter, Position, Source, SourceBatch, Split
from batchline.state.schema import as_struct

__all__ = ["RedisStreamSource", "DEFAULT_SPLIT_SIZE", "redacted_url"]

logger = logging.getLogger(__name__)

DEFAULT_SPLIT_SIZE = 20_000
_PAGE = 10_000
_ORIGIN = "0-0"
"""The position before a stream's first entry: read from the oldest entry present."""

# KEYS[1]: the stream; ARGV: after (exclusive), to (inclusive id or "+"), cap (0: none), split size.
# Returns {count, last id, {every split-size-th id}}: the entries never leave the server.
_PLAN_SCRIPT = """
local after, to, cap, size = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local bounds, count, last = {}, 0, after
local cursor = '(' .. after
while true do
  local want = 1000
  if cap > 0 then want = math.min(want, cap - count) end
  if want <= 0 then break end
  local page = redis.call('XRANGE', KEYS[1], cursor, to, 'COUNT', want)
  if #page == 0 then break end
  for i = 1, #page do
    count = count + 1
    last = page[i][1]
    if count % size == 0 then bounds[#bounds + 1] = last end
  end
  if #page < want then break end
  cursor = '(' .. last
end
return {count, last, bounds}
"""

_T = TypeVar("_T")


def redacted_url(url: str) -> str:
    """``url`` without its password: what logs and errors show."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in credentials else user}@{host}"


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class RedisStreamSource(Source):
    """The entries of ``streams`` at ``url``: ``stream``, ``id`` and ``fields`` (a map of the
    entry's fields), or ``stream``, ``id`` and the columns of ``schema`` parsed from the
    fields of the same names (a field that is missing or does not parse makes the entry a
    dead letter; fields the schema does not name are ignored)."""

    def __init__(self, url: str, streams: Sequence[str], *, max_records_per_batch: int | None = None,
                 schema: StructType | str | type | None = None, bounded: bool = False, start: str = "earliest",
                 split_size: int = DEFAULT_SPLIT_SIZE, retry_timeout_s: float = 60.0,
                 clock: Clock | None = None) -> None:
        if isinstance(streams, str) or not streams or not all(isinstance(s, str) and s for s in streams):
            raise ConfigurationError(f"streams is a list of stream names, e.g. ['orders']; got {streams!r}")
        if len(set(streams)) != len(streams):
            raise ConfigurationError(f"streams names a stream twice: {list(streams)}")
        if max_records_per_batch is not None and max_records_per_batch <= 0:
            raise ConfigurationError(f"max_records_per_batch must be positive; got {max_records_per_batch}")
        if split_size <= 0:
            raise ConfigurationError(f"split_size must be positive; got {split_size}")
        if start not in ("earliest", "latest"):
            raise ConfigurationError(f"start is 'earliest' or 'latest'; got {start!r}")
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(f"a Redis URL looks like redis://host:6379/0; got {redacted_url(url)!r}")
        self.url = url
        self.streams = list(streams)
        self.max_records_per_batch = max_records_per_batch
        self.bounded = bounded
        self.start = start
        self.split_size = split_size
        self.retry_timeout_s = retry_timeout_s
        self.clock = clock or SystemClock()
        self.fields_schema = schema = None if schema is None else as_struct(schema, "the schema of redis_stream")
        self._parse = _entry_parser(schema)
        self._columns = _arrow_columns(schema)
        self._client: Any = None
        self._plan_script: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_plan_script"] = None  # connections are opened where they are used
        return state

    def __repr__(self) -> str:
        return f"RedisStreamSource({redacted_url(self.url)!r}, {self.streams!r})"

    # ---------------------------------------------------------------- the Source interface
    def schema(self) -> StructType:
        head = [StructField("stream", StringType(), False), StructField("id", StringType(), False)]
        if self.fields_schema is None:
            return StructType([*head, StructField("fields", MapType(StringType(), StringType(), True), True)])
        return StructType([*head, *self.fields_schema.fields])

    def initial_position(self) -> Position:
        if self.start == "earliest":
            # "added" unknown: the first plan counts what was removed before as behind the start
            return {"ids": dict.fromkeys(self.streams, _ORIGIN), "added": {}}
        ids, added = {}, {}
        for stream in self.streams:
            info = self._info(stream)
            ids[stream] = _text(info["last-generated-id"]) if info else _ORIGIN
            added[stream] = int(info.get("entries-added", 0)) if info else 0
        return {"ids": ids, "added": added}

    def end_of_input(self) -> Position:
        return {"ids": self._last_ids()}

    def exhausted(self, position: Position, end_of_input: Position) -> bool:
        return all(parse_id(position["ids"].get(s, _ORIGIN)) >= parse_id(last)
                   for s, last in end_of_input["ids"].items())

    def plan(self, start: Position, end_of_input: Position | None) -> SourceBatch:
        """Per stream, from the last id read: first make sure nothing after it was removed
        unread, then walk at most the remaining cap of entries on the server."""
        remaining = self.max_records_per_batch
        ids, added = dict(start["ids"]), dict(start.get("added", {}))
        splits, counts = [], {}
        for stream in self.streams:
            after = str(ids.get(stream, _ORIGIN))
            to = str(end_of_input["ids"].get(stream, _ORIGIN)) if end_of_input is not None else "+"
            if remaining == 0 or (to != "+" and parse_id(to) <= parse_id(after)):
                continue
            added[stream] = self._check_not_removed(stream, after, added.get(stream))
            count, last, bounds = self._walk(stream, after, to, remaining or 0, "planning")
            if not count:
                continue
            last = _text(last)
            edges = [after, *(_text(b) for b in bounds)]
            if edges[-1] != last:
                edges.append(last)
            for index in range(1, len(edges)):
                size = self.split_size if index * self.split_size <= count else count % self.split_size
                splits.append({"stream": stream, "after": edges[index - 1], "to": edges[index], "count": size})
            ids[stream], counts[stream] = last, count
            if added[stream] is not None:
                added[stream] += count
            if remaining is not None:
                remaining -= count
        info = ({"entries": counts, "ranges": {s: [start["ids"].get(s, _ORIGIN), ids[s]] for s in counts}}
                if counts else {})
        return SourceBatch(dict(start), {"ids": ids, "added": added}, tuple(splits), info)

    def read(self, split: Split) -> Iterator[Any]:
        stream, after, to, expected = split["stream"], split["after"], split["to"], int(split["count"])
        client, cursor, found = self._redis(), f"({after}", 0
        while found < expected:
            page = self._call(f"reading stream {stream!r}", client.xrange, stream, cursor, to,
                              count=min(_PAGE, expected - found))
            if not page:
                break
            yield from self._parse_page(stream, page)
            found += len(page)
            cursor = f"({_text(page[-1][0])}"
        if found != expected:
            raise self._missing(stream, after, to, expected, found)

    def can_replay(self, batch: SourceBatch) -> bool:
        """Every logged split must still hold its entries: else the restart stops, naming them."""
        for split in batch.splits:
            stream, after, to, expected = split["stream"], split["after"], split["to"], int(split["count"])
            found, _, _ = self._walk(stream, after, to, 0, "checking")
            if int(found) != expected:
                raise self._missing(stream, after, to, expected, int(found))
        return True

    def _parse_page(self, stream: str, page: list[Any]) -> Iterator[Any]:
        """A page of raw entries (``[id, [field, value, ...]]``) as one Arrow batch, every
        field parsed by Arrow at once; a page that Arrow will not take whole (a missing field,
        a value it does not parse) is parsed entry by entry, which names each bad entry's reason."""
        if self._columns is not None:
            batch = _arrow_page(stream, page, self._columns)
            if batch is not None:
                yield batch
                return
        parse = self._parse
        for entry_id, fields in page:
            yield parse(stream, _text(entry_id), _as_dict(fields))

    # ---------------------------------------------------------------- Redis
    def _redis(self) -> Any:
        if self._client is None:
            try:
                import redis
            except ImportError as error:
                raise ConfigurationError(
                    "reading Redis streams needs the redis package: pip install 'batchline[redis]'") from error
            self._client = redis.Redis.from_url(self.url, socket_timeout=30, socket_connect_timeout=10)
            # XRANGE's reply as the server sent it (lists of id and flat field/value pairs): redis-py
            # would build a dict per entry, which took half the time of reading a split.
            self._client.set_response_callback("XRANGE", lambda response, **_: response)
        return self._client

    def _script(self) -> Any:
        if self._plan_script is None:
            self._plan_script = self._redis().register_script(_PLAN_SCRIPT)
        return self._plan_script

    def _last_ids(self) -> dict[str, str]:
        found = {}
        for stream in self.streams:
            newest = self._call(f"reading the newest entry of {stream!r}", self._redis().xrevrange, stream, "+", "-",
                                count=1)
            found[stream] = _text(newest[0][0]) if newest else _ORIGIN
        return found

    def _info(self, stream: str) -> dict[str, Any] | None:
        """XINFO STREAM, or None for a stream that does not exist (yet)."""
        import redis

        try:
            return dict(self._call(f"inspecting stream {stream!r}", self._redis().xinfo_stream, stream))
        except redis.ResponseError:
            return None

    def _check_not_removed(self, stream: str, after: str, behind: int | None) -> int | None:
        """Stop when entries after the position were removed (XTRIM, XDEL) before they were
        read. ``behind`` counts the entries ever added up to the position: at most that many
        removals can lie behind it, so more removals than that (Redis counts entries added and
        present) mean entries after it are gone. Returns ``behind`` as known now."""
        info = self._info(stream)
        if info is None or "entries-added" not in info:
            return behind  # no stream yet (or Redis before 7.0, which does not count)
        removed = int(info["entries-added"]) - int(info["length"])
        if behind is None:  # the first plan from the origin: what is gone was removed before the start
            return removed if after == _ORIGIN else None
        if removed > behind:
            first = info.get("first-entry")
            raise SourceError(
                f"{removed - behind} entries of Redis stream {stream!r} after id {after} (where this pipeline "
                "stands) were trimmed or deleted before it read them"
                + (f"; the oldest entry left is {_text(first[0])}" if first else "")
                + ". The pipeline stops rather than skip them silently. Keep entries until the pipeline read them "
                "(a larger MAXLEN/MINID); to go on past the loss, start from a new checkpoint location"
            )
        return behind

    def _missing(self, stream: str, after: str, to: str, expected: int, found: int) -> SourceError:
        return SourceError(
            f"Redis stream {stream!r} no longer holds the batch's entries with ids after {after} up to {to}: "
            f"{expected} were logged, {found} are left, so {expected - found} were trimmed (XTRIM, MAXLEN) or "
            "deleted (XDEL) after the batch was logged. The batch cannot be read again as it was; keep entries "
            "longer than the pipeline may take to commit them, restore them, or start from a new checkpoint "
            "location to go on without them")

    def _walk(self, stream: str, after: str, to: str, cap: int, what: str) -> tuple[int, Any, list[Any]]:
        """The plan script: (count, last id, every split-size-th id) of the entries in ``(after, to]``."""
        script = self._script()
        count, last, bounds = self._call(f"{what} stream {stream!r}", script, keys=[stream],
                                         args=[after, to, cap, self.split_size])
        return int(count), last, list(bounds)

    def _call(self, what: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``call(*args, **kwargs)``, retried with exponential backoff while the connection fails."""
        import redis

        deadline = self.clock.now_ms() + int(self.retry_timeout_s * 1000)
        delay_ms, attempt = 100, 1
        while True:
            try:
                return call(*args, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError) as error:
                if self.clock.now_ms() + delay_ms > deadline:
                    raise SourceError(
                        f"{what} at {redacted_url(self.url)} failed after {attempt} attempts over "
                        f"{self.retry_timeout_s:g} s: {error}. Check that the server is up and reachable; the "
                        "batch runs again from its logged ids") from error
                logger.warning("%s at %s failed (%s); retrying in %.1f s (attempt %d)", what,
                               redacted_url(self.url), error, delay_ms / 1000, attempt)
                self.clock.sleep_ms(delay_ms)
                delay_ms, attempt = min(delay_ms * 2, 5_000), attempt + 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------ parsing entries
Converter = Callable[[str], Any]
ArrowColumn = tuple[str, bytes, bool, Any]
"""A schema column as Arrow parses it: name, field key, nullable, Arrow type."""


def _arrow_columns(schema: StructType | None) -> list[ArrowColumn] | None:
    if schema is None:
        return None
    from pyspark.sql.pandas.types import to_arrow_type

    return [(f.name, f.name.encode(), f.nullable, to_arrow_type(f.dataType, timezone="UTC")) for f in schema.fields]


def _arrow_page(stream: str, page: list[Any], columns: list[ArrowColumn]) -> Any:
    """The page as an Arrow batch (stream, id, the schema's columns), or None when some value
    is missing or does not parse (the caller then parses entry by entry)."""
    import pyarrow as pa

    values = _field_columns(page, [key for _, key, _, _ in columns])
    ids = pa.array([entry_id for entry_id, _ in page], pa.binary()).cast(pa.string())
    arrays = [pa.repeat(stream, len(page)), ids]
    names = ["stream", "id"]
    try:
        for (name, _, nullable, arrow_type), column in zip(columns, values, strict=True):
            raw = pa.array(column, pa.binary())
            if raw.null_count and not nullable:
                return None
            text = raw.cast(pa.string())
            if pa.types.is_binary(arrow_type):
                arrays.append(raw)
            elif pa.types.is_string(arrow_type):
                arrays.append(text)
            else:
                arrays.append(_arrow_cast(text, arrow_type))
            names.append(name)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _field_columns(page: list[Any], keys: list[bytes]) -> list[list[Any]]:
    """Per key, every entry's value (None where an entry lacks the field). When all entries
    name their fields in the same order, as producers usually write them, the page's pair
    lists are laid end to end and each column is one strided slice of that (no Python loop
    per entry); otherwise each entry becomes a dict first."""
    pairs = [fields for _, fields in page]
    width = len(pairs[0]) if pairs else 0
    if width and width % 2 == 0 and set(map(len, pairs)) == {width}:
        flat = list(chain.from_iterable(pairs))
        layout = pairs[0][0::2]
        if all(flat[2 * index::width].count(name) == len(pairs) for index, name in enumerate(layout)):
            where = {name: index for index, name in enumerate(layout)}
            return [flat[2 * where[key] + 1::width] if key in where else [None] * len(pairs) for key in keys]
    dicts = [_as_dict(fields) for fields in pairs]
    return [[fields.get(key) for fields in dicts] for key in keys]


def _as_dict(fields: Any) -> dict[bytes, bytes]:
    """An entry's flat ``[field, value, ...]`` list as a dict (a dict stays as it is)."""
    if isinstance(fields, dict):
        return fields
    pairs = iter(fields)
    return dict(zip(pairs, pairs, strict=False))


def _arrow_cast(text: Any, arrow_type: Any) -> Any:
    """Text to ``arrow_type``; a timestamp also from epoch milliseconds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return pc.cast(text, arrow_type)
    except pa.ArrowInvalid:
        if not pa.types.is_timestamp(arrow_type):
            raise
    millis = pc.cast(text, pa.int64())
    return pc.cast(pc.multiply(millis, 1000), pa.int64()).cast(pa.timestamp("us", tz=arrow_type.tz))


def _entry_parser(schema: StructType | None) -> Callable[[str, str, dict[bytes, bytes]], Any]:
    """How an entry becomes a row: a map of its fields, or the schema's columns parsed from them."""
    if schema is None:
        def as_map(stream: str, entry_id: str, fields: dict[bytes, bytes]) -> Any:
            try:
                return stream, entry_id, {k.decode(): v.decode() for k, v in fields.items()}
            except UnicodeDecodeError as error:
                return DeadLetter(_raw(stream, entry_id, fields), f"a field is not UTF-8 text: {error}")
        return as_map

    for field in schema.fields:
        if field.name in ("stream", "id"):
            raise ConfigurationError(f"the schema may not name a column {field.name!r}: every row has it already")
    columns = [(field.name, field.name.encode(), field.nullable, _converter(field)) for field in schema.fields]

    def parse(stream: str, entry_id: str, fields: dict[bytes, bytes]) -> Any:
        row: list[Any] = [stream, entry_id]
        for name, key, nullable, convert in columns:
            value = fields.get(key)
            if value is None:
                if not nullable:
                    return DeadLetter(_raw(stream, entry_id, fields), f"field {name!r} is missing")
                row.append(None)
                continue
            try:
                row.append(convert(value.decode()))
            except (ValueError, ArithmeticError, UnicodeDecodeError) as error:
                return DeadLetter(_raw(stream, entry_id, fields), f"field {name!r}: {error}")
        return tuple(row)

    return parse


def _raw(stream: str, entry_id: str, fields: dict[bytes, bytes]) -> str:
    return json.dumps({"stream": stream, "id": entry_id,
                       "fields": {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}},
                      ensure_ascii=False)


_INT_RANGES = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


def _converter(field: StructField) -> Converter:
    kind: DataType = field.dataType
    if isinstance(kind, StringType):
        return str
    if isinstance(kind, BinaryType):
        return lambda text: text.encode()
    bits = next((b for t, b in _INT_RANGES.items() if isinstance(kind, t)), None)
    if bits is not None:
        return _integer(bits, kind.simpleString())
    if isinstance(kind, FloatType | DoubleType):
        return lambda text: _number(text, float, kind.simpleString())
    if isinstance(kind, BooleanType):
        return _boolean
    if isinstance(kind, DecimalType):
        return _decimal(kind)
    if isinstance(kind, TimestampType):
        return _timestamp
    if isinstance(kind, DateType):
        return lambda text: _number(text.strip(), dt.date.fromisoformat, "date (YYYY-MM-DD)")
    raise ConfigurationError(
        f"column {field.name!r} has type {kind.simpleString()}, which Redis entry fields (text) are not parsed "
        "into; use string, a number, boolean, decimal, timestamp, date or binary, and parse the rest downstream")


def _number(text: str, parse: Callable[[str], Any], kind: str) -> Any:
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"{text[:80]!r} is not a {kind}") from None


def _integer(bits: int, kind: str) -> Converter:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def convert(text: str) -> int:
        value = _number(text.strip(), int, kind)
        if not low <= value <= high:
            raise ValueError(f"{value} does not fit a {kind}")
        return int(value)

    return convert


def _boolean(text: str) -> bool:
    folded = text.strip().lower()
    if folded in ("true", "1", "yes"):
        return True
    if folded in ("false", "0", "no"):
        return False
    raise ValueError(f"{text[:80]!r} is not a boolean (true/false, 1/0, yes/no)")


def _decimal(kind: DecimalType) -> Converter:
    def convert(text: str) -> Decimal:
        try:
            value = Decimal(text.strip())
        except InvalidOperation:
            raise ValueError(f"{text[:80]!r} is not a {kind.simpleString()}") from None
        if not value.is_finite():
            raise ValueError(f"{text[:80]!r} is not a finite {kind.simpleString()}")
        scaled = value.quantize(Decimal(1).scaleb(-kind.scale))
        if scaled != value or len(scaled.as_tuple().digits) > kind.precision:
            raise ValueError(f"{text[:80]!r} does not fit a {kind.simpleString()}")
        return scaled

    return convert


def _timestamp(text: str) -> dt.datetime:
    """Epoch milliseconds, or ISO-8601 (UTC unless it names an offset)."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return dt.datetime.fromtimestamp(int(stripped) / 1000, tz=dt.UTC)
    try:
        value = dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text[:80]!r} is not a timestamp (ISO-8601 or epoch milliseconds)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
