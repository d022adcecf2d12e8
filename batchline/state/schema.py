"""Declared schemas of state and output rows (SPEC D5): a dataclass or a Spark schema.

A state value lives in the store and in the worker's cache as a plain tuple in field order
(Arrow-ready); the state function sees a fresh object built from it, so mutating what
``state.get()`` returned never changes the stored state behind the store's back.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import operator
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
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
    TimestampNTZType,
    TimestampType,
    _parse_datatype_string,
)

from batchline.errors import BatchlineError, ConfigurationError

__all__ = ["RowSchema", "StateSchemaError", "MISSING", "as_struct", "SCHEMA_FORMS"]

MISSING = dataclasses.MISSING

_SCALARS: dict[Any, DataType] = {
    int: LongType(), float: DoubleType(), str: StringType(), bool: BooleanType(), bytes: BinaryType(),
    _dt.datetime: TimestampType(), _dt.date: DateType(),
}


class StateSchemaError(BatchlineError):
    """Stored state cannot be read with the declared schema (an incompatible change)."""


def _spark_type(hint: Any, where: str) -> tuple[DataType, bool]:
    """The Spark type of a dataclass field's annotation, and whether it may be null."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) != 1:
            raise ConfigurationError(f"{where}: only Optional[X] unions are supported in state schemas; got {hint}")
        return _spark_type(members[0], where)[0], True
    if hint in _SCALARS:
        return _SCALARS[hint], False
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        args = typing.get_args(hint)
        if not args:
            raise ConfigurationError(f"{where}: give the element type, e.g. list[str]")
        return ArrayType(_spark_type(args[0], where)[0], True), False
    if origin is dict:
        key, value = typing.get_args(hint) or (None, None)
        if key is None:
            raise ConfigurationError(f"{where}: give key and value types, e.g. dict[str, int]")
        return MapType(_spark_type(key, where)[0], _spark_type(value, where)[0], True), False
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_struct(hint), False
    raise ConfigurationError(
        f"{where}: type {hint!r} has no Spark equivalent; use int, float, str, bool, bytes, datetime, date, "
        "list[...], dict[..., ...], Optional[...] or a nested dataclass"
    )


def _dataclass_struct(cls: type) -> StructType:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        data_type, nullable = _spark_type(hints[f.name], f"field {cls.__name__}.{f.name}")
        fields.append(StructField(f.name, data_type, True))
        del nullable  # every field is stored nullable: an absent value is a null, not an error
    return StructType(fields)


def _decoder(data_type: DataType, hint: Any) -> Callable[[Any], Any] | None:
    """How a stored (Arrow-ready) value becomes what the user declared; None: as it is."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = _decoder(data_type, next(a for a in typing.get_args(hint) if a is not type(None)))
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if isinstance(data_type, ArrayType):
        element_hint = (typing.get_args(hint) or (None,))[0]
        element = _decoder(data_type.elementType, element_hint) if element_hint is not None else None
        container = origin if origin in (list, tuple, set, frozenset) else list
        if element is None:
            return lambda v: None if v is None else container(v)
        return lambda v: None if v is None else container(element(x) for x in v)
    if isinstance(data_type, MapType):
        return lambda v: None if v is None else dict(v)
    if isinstance(data_type, StructType) and dataclasses.is_dataclass(hint):
        nested = RowSchema.of(hint)
        return lambda v: None if v is None else nested.make(tuple(v[f] for f in nested.names))
    return None


def _encoder(hint: Any) -> Callable[[Any], Any] | None:
    """How a declared field's value becomes Arrow-ready (None: as it is). Compiled once per
    field, because it runs for every updated key of every batch."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = _encoder(next(a for a in typing.get_args(hint) if a is not type(None)))
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if dataclasses.is_dataclass(hint):
        nested = RowSchema.of(hint)
        return lambda v: None if v is None else dict(zip(nested.names, nested.unmake(v), strict=True))
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        element = _encoder((typing.get_args(hint) or (None,))[0])
        if element is not None:
            return lambda v: None if v is None else [element(x) for x in v]
        return None if origin is list else (lambda v: None if v is None else list(v))
    return None


_DDL_SCALARS: dict[str, DataType] = {
    "string": StringType(), "long": LongType(), "bigint": LongType(), "int": IntegerType(), "integer": IntegerType(),
    "short": ShortType(), "smallint": ShortType(), "byte": ByteType(), "tinyint": ByteType(),
    "double": DoubleType(), "float": FloatType(), "real": FloatType(), "boolean": BooleanType(),
    "binary": BinaryType(), "date": DateType(), "timestamp": TimestampType(), "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}
_DDL_TOKEN = re.compile(r"\s*(`[^`]*`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class _DdlError(ValueError):
    pass


def _ddl_tokens(text: str) -> list[str]:
    tokens, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _DDL_TOKEN.match(text, position)
        if match is None:
            raise _DdlError(text[position:])
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _parse_ddl_locally(text: str) -> StructType:
    """Simple DDL (``"id string, n long, tags array<string>"``) without Spark's parser."""
    tokens = _ddl_tokens(text)
    position = 0

    def take(expected: str | None = None) -> str:
        nonlocal position
        if position >= len(tokens) or (expected is not None and tokens[position].lower() != expected):
            raise _DdlError(expected or "more")
        position += 1
        return tokens[position - 1]

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def name() -> str:
        token = take()
        return token[1:-1] if token.startswith("`") else token

    def data_type() -> DataType:
        word = take().lower()
        if word in _DDL_SCALARS:
            return _DDL_SCALARS[word]
        if word == "decimal":
            if peek() != "(":
                return DecimalType(10, 0)
            take("(")
            precision = int(take())
            scale = 0
            if peek() == ",":
                take(",")
                scale = int(take())
            take(")")
            return DecimalType(precision, scale)
        if word == "array":
            take("<")
            element = data_type()
            take(">")
            return ArrayType(element, True)
        if word == "map":
            take("<")
            key = data_type()
            take(",")
            value = data_type()
            take(">")
            return MapType(key, value, True)
        if word == "struct":
            take("<")
            fields = fields_until(">")
            take(">")
            return StructType(fields)
        raise _DdlError(word)

    def fields_until(end: str | None) -> list[StructField]:
        fields = []
        while True:
            field_name = name()
            if peek() == ":":
                take(":")
            fields.append(StructField(field_name, data_type(), True))
            if peek() == ",":
                take(",")
                continue
            if peek() == end:
                return fields
            raise _DdlError(peek() or "end")

    return StructType(fields_until(None))


def parse_ddl(text: str) -> DataType:
    """A DDL schema string as a Spark type: with Spark's own parser when Spark runs, and
    without Spark for the simple schemas state functions use (so tests need no Spark)."""
    if SparkContext._active_spark_context is not None:  # noqa: SLF001 - the one way to ask without starting it
        return _parse_datatype_string(text)
    try:
        return _parse_ddl_locally(text)
    except (_DdlError, ValueError) as error:
        raise ConfigurationError(
            f"schema {text!r} needs Spark's DDL parser (no Spark session runs; this one reads names with "
            f"simple, array, map, struct and decimal types; stopped at {error}); give a dataclass or a "
            "StructType instead, or start a Spark session first"
        ) from None


SCHEMA_FORMS = ("a StructType, a DDL string like 'uid string, ts timestamp', or a dataclass "
                "(its fields' types become the columns)")
"""The three ways any schema argument may be given, as error messages name them."""


def as_struct(declared: Any, argument: str) -> StructType:
    """A schema argument (a ``StructType``, a DDL string or a dataclass) as a ``StructType``;
    anything else, or a DDL string that does not parse, is refused naming ``argument``."""
    if isinstance(declared, StructType):
        return declared
    try:
        return RowSchema.of(declared).struct
    except Exception as error:  # noqa: BLE001 - Spark's DDL parser raises its own errors for malformed text
        detail = _short_detail(error) if isinstance(declared, str) else ""
        raise ConfigurationError(
            f"{argument} must be {SCHEMA_FORMS}; got {declared!r}{detail}") from None


def _short_detail(error: BaseException) -> str:
    """What a schema parser said, on one line, as a suffix for a message."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f" ({first[:200]})"


def as_python(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """An Arrow column as Python values. Timestamps become naive datetimes in UTC, as PySpark
    hands them out: pyarrow's time-zone-aware conversion costs 80 times more."""
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us")).to_numpy(zero_copy_only=False).tolist()
    return column.to_pylist()


def _field_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """An object's attributes ``names`` as a tuple, got in one C call (``attrgetter``)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda value: (one(value),)
    return lambda value: ()


@dataclass(frozen=True)
class RowSchema:
    """A declared row type: its Spark and Arrow schemas and the codec between user objects
    and stored tuples."""

    struct: StructType
    cls: type | None
    """The dataclass, or None for a schema given as a Spark type (rows are tuples then)."""
    defaults: tuple[Any, ...]
    """Each field's default (MISSING when it has none), for reading state written before the field existed."""
    _decoders: tuple[Callable[[Any], Any] | None, ...]
    _plain: bool
    _encoders: tuple[Callable[[Any], Any] | None, ...] = ()

    def __post_init__(self) -> None:
        # Read for every key of every batch: computed once.
        names = tuple(self.struct.fieldNames())
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_encode", any(e is not None for e in self._encoders))
        object.__setattr__(self, "_decoded", tuple((at, d) for at, d in enumerate(self._decoders) if d is not None))
        object.__setattr__(self, "_fields_of", _field_getter(names))

    @classmethod
    def of(cls, declared: Any) -> RowSchema:
        if isinstance(declared, RowSchema):
            return declared
        if isinstance(declared, str):
            declared = parse_ddl(declared)
            if not isinstance(declared, StructType):
                raise ConfigurationError(f"a row schema must be a struct, e.g. 'id string, n long'; got {declared}")
        if isinstance(declared, StructType):
            nothing = tuple(None for _ in declared.fields)
            return cls(declared, None, nothing, nothing, True, nothing)
        if isinstance(declared, type) and dataclasses.is_dataclass(declared):
            struct = _dataclass_struct(declared)
            hints = typing.get_type_hints(declared)
            fields = dataclasses.fields(declared)
            defaults = tuple(
                f.default if f.default is not MISSING
                else (f.default_factory if f.default_factory is not MISSING else MISSING)  # type: ignore[misc]
                for f in fields
            )
            decoders = tuple(_decoder(sf.dataType, hints[f.name]) for sf, f in zip(struct.fields, fields, strict=True))
            encoders = tuple(_encoder(hints[f.name]) for f in fields)
            return cls(struct, declared, defaults, decoders, all(d is None for d in decoders), encoders)
        raise ConfigurationError(
            f"a schema must be a dataclass, a Spark StructType or a DDL string like 'id string, n long'; "
            f"got {declared!r}"
        )

    @property
    def names(self) -> tuple[str, ...]:
        return self._names  # type: ignore[attr-defined,no-any-return]

    @property
    def arrow(self) -> pa.Schema:
        return to_arrow_schema(self.struct, timezone="UTC")

    def make(self, row: tuple[Any, ...]) -> Any:
        """A stored tuple as the user sees it: a fresh dataclass, or the tuple itself."""
        if self.cls is None:
            return row
        if self._plain:
            return self.cls(*row)
        values = list(row)
        for at, decode in self._decoded:  # type: ignore[attr-defined]
            values[at] = decode(values[at])
        return self.cls(*values)

    def unmake(self, value: Any) -> tuple[Any, ...]:
        """A user object (dataclass, tuple, dict or Row) as a stored tuple, checked for shape."""
        names = self.names
        if self.cls is not None and isinstance(value, self.cls):
            row: tuple[Any, ...] = self._fields_of(value)  # type: ignore[attr-defined]
        elif isinstance(value, dict):
            missing = [n for n in names if n not in value]
            if missing:
                raise TypeError(f"the dict lacks field(s) {missing} of {self.describe()}")
            row = tuple([value[n] for n in names])
        elif isinstance(value, (tuple, list)) and len(value) == len(names):
            row = tuple(value)
        else:
            raise TypeError(f"expected {self.describe()}, got {type(value).__name__}: {value!r}")
        if self._encode:  # type: ignore[attr-defined]
            return tuple([v if e is None else e(v) for v, e in zip(row, self._encoders, strict=True)])
        return row

    def describe(self) -> str:
        return self.cls.__name__ if self.cls is not None else self.struct.simpleString()

    @classmethod
    def stored(cls, struct: StructType, defaults: dict[str, Any]) -> RowSchema:
        """The schema of stored state read as rows (no dataclass), whose fields missing from an
        older version read as the defaults the state's dataclass declared (``stored_defaults``)."""
        nothing = tuple(None for _ in struct.fields)
        return cls(struct, None, tuple(defaults.get(name) for name in struct.fieldNames()), nothing, True, nothing)

    def stored_defaults(self) -> dict[str, Any]:
        """The fields' defaults that plain JSON holds (a factory is called once), by field name,
        to keep beside the stored state: an offline reader has no dataclass to ask. A default
        JSON cannot hold reads as null there."""
        if self.cls is None:
            return {}
        found: dict[str, Any] = {}
        for index, name in enumerate(self.names):
            value = self.default_for(index)
            if value is MISSING:
                continue
            try:
                if json.loads(json.dumps(value)) == value:
                    found[name] = value
            except (TypeError, ValueError):
                continue  # a datetime, a Decimal, an object: not kept
        return found

    def default_for(self, index: int) -> Any:
        default = self.defaults[index]
        if self.cls is None:
            return default  # a field added to a Spark schema reads as null, or as the stored default
        if default is MISSING:
            return MISSING
        return default() if callable(default) else default

    def reader_for(self, stored: StructType, what: str) -> Callable[[list[list[Any]]], list[tuple[Any, ...]]]:
        """Read columns stored under ``stored`` as tuples of this schema (SPEC D5): fields
        added since get their default, dropped fields are ignored, a changed type fails
        naming the field."""
        stored_types = {f.name: f.dataType for f in stored.fields}
        stored_index = {name: i for i, name in enumerate(stored.fieldNames())}
        plan: list[tuple[int | None, Any]] = []
        for i, field in enumerate(self.struct.fields):
            if field.name in stored_types:
                if stored_types[field.name].simpleString() != field.dataType.simpleString():
                    raise StateSchemaError(
                        f"{what}: state field {field.name!r} changed type from "
                        f"{stored_types[field.name].simpleString()} to {field.dataType.simpleString()}; "
                        "a type change cannot keep the state. Add a new field (with a default) instead, "
                        "or rewrite the state offline"
                    )
                plan.append((stored_index[field.name], None))
            else:
                default = self.default_for(i)
                if default is MISSING:
                    raise StateSchemaError(
                        f"{what}: state field {field.name!r} is new and has no default; give it one "
                        f"(e.g. {field.name}: ... = None) so that existing state can be read"
                    )
                plan.append((None, default))
        if [p[0] for p in plan] == list(range(len(stored.fields))):
            return lambda columns: list(zip(*columns, strict=True)) if columns else []

        def read(columns: list[list[Any]]) -> list[tuple[Any, ...]]:
            if not columns:
                return []
            n = len(columns[0])
            picked = [columns[i] if i is not None else [default] * n for i, default in plan]
            return list(zip(*picked, strict=True))

        return read

    def check_compatible(self, stored: StructType, what: str) -> None:
        self.reader_for(stored, what)
