"""A partition's keys held as Arrow columns (issue 19): every read and change checked against
a plain dict that does the same, across merges of the recent changes into the base, for
integer keys (looked up by value), string and compound keys (looked up by hash), and keys
whose hashes collide."""

from __future__ import annotations

import datetime as dt
import random
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from batchline.state import entries as entries_module
from batchline.state import execution
from batchline.state.entries import StateEntries, key_codes
from batchline.state.schema import RowSchema, as_python
from batchline.state.store import entries_schema, entries_table
from tests.helpers import Count

STATE = RowSchema.of(Count)


class Colliding:
    """A key whose hash is shared by every other: lookups must compare the keys themselves."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Colliding) and other.name == self.name


def _check(entries: StateEntries, truth: dict) -> None:
    assert len(entries) == len(truth)
    assert dict(entries.items()) == truth
    probe = list(truth)[:50] + ["missing", -999_999, 2**70, 2**32 + 3, -(2**31) - 1, True, 3.0]
    expected = {key: truth[key] for key in probe if key in truth}
    assert entries.get_many(probe) == expected
    deadlines = [entry[1] for entry in truth.values() if entry[1] is not None]
    assert entries.next_deadline() == (min(deadlines) if deadlines else None)
    if deadlines:
        at = sorted(deadlines)[len(deadlines) // 2]
        due = sorted(((k, e[1]) for k, e in truth.items() if e[1] is not None and e[1] <= at),
                     key=lambda item: (item[1], repr(item[0])))
        assert entries.due(at) == due
        # The batch's called keys left out, from the base and from the recent changes alike.
        skip = {key for at_, (key, _) in enumerate(due) if at_ % 2}
        assert entries.due(at, skip=skip) == [(key, deadline) for key, deadline in due if key not in skip]


@pytest.mark.parametrize("encoded", [False, True], ids=["from-python", "with-the-delta-written"])
@pytest.mark.parametrize("kind", ["int", "int32", "str", "compound"])
def test_reads_and_changes_match_a_dict_across_merges(kind, encoded, monkeypatch):
    """``encoded``: each batch's changes come with the delta table the task wrote, as the
    operator passes them, so many go into the base from Arrow rather than from Python."""
    monkeypatch.setattr(entries_module, "_MIN_RECENT", 8)  # merge often
    key_schema = {
        "int": StructType([StructField("k", LongType())]),
        "int32": StructType([StructField("k", IntegerType())]),  # no null: its column is the lookup order
        "str": StructType([StructField("k", StringType())]),
        "compound": StructType([StructField("a", StringType()), StructField("b", TimestampType())]),
    }[kind]

    def key_of(i: int):
        if kind in ("int", "int32"):
            # negative keys too (-1 and -2 share a hash in Python), and for int64 a null key,
            # which Spark groups like any other and which makes the lookup go by hash
            return None if i == 119 and kind == "int" else i - 50
        if kind == "str":
            return f"user-{i}"
        return (f"u{i % 7}", dt.datetime(2026, 1, 1, tzinfo=dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=i))

    rng = random.Random(42)
    layout = entries_schema(key_schema, STATE)
    entries, truth = StateEntries(len(key_schema.fields) == 1), {}
    for _ in range(40):
        changes = {}
        for _ in range(rng.randint(1, 30)):
            key = key_of(rng.randrange(120))
            roll = rng.random()
            if roll < 0.2:
                changes[key] = None  # removed
            elif roll < 0.3:
                changes[key] = (None, 1000 + rng.randrange(50))  # a timer without state
            else:
                changes[key] = ((rng.randrange(9), rng.randrange(99)), rng.choice([None, 1000 + rng.randrange(50)]))
        if encoded:
            delta = {key: (None, None) if entry is None else entry for key, entry in changes.items()}
            table = entries_table(key_schema, STATE, ((k, *e) for k, e in delta.items()), len(key_schema.fields) == 1)
            entries.update(delta, layout, encoded=table)
        else:
            entries.update(changes, layout)
        for key, entry in changes.items():
            if entry is None:
                truth.pop(key, None)
            else:
                truth[key] = entry
        _check(entries, truth)
    entries.compact()
    _check(entries, truth)
    # The snapshot table reads back as the same entries.
    again = StateEntries(len(key_schema.fields) == 1)
    table = entries.table()
    again.merge([table])
    _check(again, truth)
    assert table.schema.names == entries_table(key_schema, STATE, iter(()), len(key_schema.fields) == 1).schema.names


def test_keys_with_equal_hashes_are_told_apart(monkeypatch):
    monkeypatch.setattr(entries_module, "_MIN_RECENT", 2)
    entries = StateEntries(True)
    # Colliding keys cannot be stored in Arrow: the decoding is what the lookup compares, so
    # store strings and look them up through a hash that collides.
    monkeypatch.setattr(entries_module, "hash", lambda key: 7, raising=False)
    layout = entries_schema(StructType([StructField("k", StringType())]), STATE)
    entries.update({f"k{i}": ((i, i), None) for i in range(10)}, layout)
    entries.compact()
    assert entries.get_many(["k3", "k9", "zz"]) == {"k3": ((3, 3), None), "k9": ((9, 9), None)}
    entries.update({"k3": None, "k4": ((40, 40), 5)})
    assert entries.get_many(["k3", "k4"]) == {"k4": ((40, 40), 5)}
    entries.compact()
    assert entries.get("k4") == ((40, 40), 5) and entries.get("k3") is None and len(entries) == 9


def test_a_partition_of_integer_counts_weighs_about_its_arrow_bytes():
    layout = entries_schema(StructType([StructField("k", LongType())]), RowSchema.of("count long"))
    entries = StateEntries(True)
    entries.update({k: ((k,), None) for k in range(100_000)}, layout)
    entries.compact()
    # key and count, 8 bytes each; no timeout column, no removed flags (none is set)
    assert entries.nbytes / len(entries) < 17
    # With a deadline per key: 8 bytes more, once (the array that finds due keys), not again
    # as the files' timeout column.
    entries.update({k: ((k,), 5_000 + k) for k in range(100_000)})
    entries.compact()
    assert entries.nbytes / len(entries) < 25
    assert entries.get(7) == ((7,), 5_007) and entries.due(5_001) == [(0, 5_000), (1, 5_001)]


def test_a_snapshot_built_later_shows_the_entries_as_they_were_when_taken(monkeypatch):
    monkeypatch.setattr(entries_module, "_MIN_RECENT", 4)
    layout = entries_schema(StructType([StructField("k", StringType())]), STATE)
    entries = StateEntries(True)
    entries.update({f"k{i}": ((i, i), 1000 + i) for i in range(20)}, layout)
    entries.update({"k1": None, "k2": ((2, 20), None), "new": ((7, 7), None)})
    before = dict(entries.items())
    build = entries.frozen()  # as the snapshot thread gets it
    entries.update({"k3": None, "k4": ((4, 40), 5), "later": ((1, 1), None)})  # the next batches
    entries.compact()
    taken = StateEntries(True)
    taken.merge([build()])
    assert dict(taken.items()) == before


def test_a_narrow_integer_key_column_finds_only_its_own_keys():
    # The int32 key column is the lookup order itself; probes are narrowed to int32, and those
    # outside its range must match nothing (2**32 + 3 wraps to 3, 2**32 to 0).
    layout = entries_schema(StructType([StructField("k", IntegerType())]), STATE)
    entries = StateEntries(True)
    keys = [0, 3, -1, 2**31 - 1, -(2**31), *range(10, 2000)]
    entries.update({k: ((k, k), None) for k in keys}, layout)
    entries.compact()
    assert entries.nbytes / len(entries) < 21  # 4 B key, 16 B state: no int64 copy of the keys
    found = entries.get_many([2**32 + 3, 2**32, -(2**31) - 1, 2**31, 2**63 - 1, 3, 2**31 - 1, True, 5.0])
    assert found == {3: ((3, 3), None), 2**31 - 1: ((2**31 - 1, 2**31 - 1), None)}


def test_a_snapshot_taken_with_nothing_recent_keeps_the_deadlines_it_saw(monkeypatch):
    monkeypatch.setattr(entries_module, "_MIN_RECENT", 4)
    layout = entries_schema(StructType([StructField("k", StringType())]), STATE)
    entries = StateEntries(True)
    entries.update({f"k{i}": ((i, i), 1000 + i) for i in range(20)}, layout)  # merged into the base
    build = entries.frozen()
    entries.update({"k5": ((5, 50), None)})  # marks k5's deadline in the base's array
    taken = StateEntries(True)
    taken.merge([build()])
    assert taken.get("k5") == ((5, 5), 1005)


def _random_key_columns(rng: random.Random, rows: int) -> dict[str, pa.Array]:
    """Compound keys with few distinct values per column (so that rows share keys) and nulls."""
    def pick(values):
        return [rng.choice(values) for _ in range(rows)]
    return {
        "i": pa.array(pick([None, -1, -2, 0, 7, 2**40]), pa.int64()),
        "s": pa.array(pick([None, "", "a", "b"]), pa.string()),
        "t": pa.array(pick([None, 0, 1, 1_700_000_000_000_000]), pa.timestamp("us", tz="UTC")),
        "d": pa.array(pick([None, 0, 19_000]), pa.date32()),
        "b": pa.array(pick([None, True, False]), pa.bool_()),
    }


@pytest.mark.parametrize("names", [("i", "s"), ("t", "i"), ("s", "d", "b"), ("i", "s", "t", "d", "b")])
def test_key_codes_are_equal_exactly_where_the_python_keys_are(names):
    rng = random.Random(7)
    columns = _random_key_columns(rng, 500)
    # Chunked, as a table's columns are after a concatenation.
    chunked = [pa.chunked_array([columns[n][:200], columns[n][200:]]) for n in names]
    codes = key_codes(chunked)
    assert codes is not None
    keys = list(zip(*(as_python(columns[n]) for n in names), strict=True))
    for a in range(0, 500, 7):
        for b in range(a, 500, 3):
            assert (codes[a] == codes[b]) == (keys[a] == keys[b]), (keys[a], keys[b])


@pytest.mark.parametrize("column", [pa.array([1.0, float("nan")]), pa.array([0, 1], pa.timestamp("ns")),
                                    pa.array([[1], [2]])])
def test_key_codes_refuse_types_where_arrow_and_python_disagree(column):
    assert key_codes([pa.array([1, 2]), column]) is None


def test_compound_keys_are_numbered_by_arrow_as_by_a_dict():
    rng = random.Random(11)
    columns = _random_key_columns(rng, 300)
    table = pa.table(columns)
    spec = SimpleNamespace(key_names=("s", "t", "i"))
    keys, key_of_row = execution._numbered_keys(spec, table)
    numbers: dict = {}
    expected = [numbers.setdefault(key, len(numbers)) for key in zip(
        *(as_python(columns[n]) for n in spec.key_names), strict=True)]
    assert keys == list(numbers)
    assert key_of_row.tolist() == expected


NAIVE_2026 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).replace(tzinfo=None)


def test_deltas_merged_at_once_keep_each_compound_key_s_last_row(monkeypatch):
    monkeypatch.setattr(entries_module, "_MIN_RECENT", 8)
    key_schema = StructType([StructField("a", StringType()), StructField("b", TimestampType())])
    layout = entries_schema(key_schema, STATE)
    rng = random.Random(5)
    truth: dict = {}
    deltas = []
    for _ in range(4):
        changes = {}
        for _ in range(40):
            key = (f"u{rng.randrange(5)}", NAIVE_2026 + dt.timedelta(seconds=rng.randrange(6)))
            changes[key] = None if rng.random() < 0.2 else ((rng.randrange(9), rng.randrange(99)), None)
        one = StateEntries(False)
        one.update({k: v for k, v in changes.items() if v is not None}, layout)
        delta = one.table()
        gone = [k for k, v in changes.items() if v is None]
        if gone:
            removed = StateEntries(False)
            removed.update({k: (None, 5) for k in gone}, layout)
            marked = removed.table()
            marked = marked.set_column(marked.schema.get_field_index("__timeout_ms"), "__timeout_ms",
                                       pa.nulls(marked.num_rows, pa.int64()))
            delta = pa.concat_tables([delta, marked])
        deltas.append(delta)
        for key, entry in changes.items():
            if entry is None:
                truth.pop(key, None)
            else:
                truth[key] = entry
    for into_base in (False, True):
        entries = StateEntries(False)
        entries.update({("seed", NAIVE_2026 - dt.timedelta(days=9)): ((0, 0), None)}, layout)
        entries.merge(deltas, into_base=into_base)
        assert dict(entries.items()) == {("seed", NAIVE_2026 - dt.timedelta(days=9)): ((0, 0), None), **truth}


@pytest.mark.parametrize("column", [pa.array([3, None, 1, 3, 2, None, 1, 3], pa.int64()),
                                    pa.array([7, 5, 5, 7, 1, 1, 9, 7], pa.int16()),
                                    pa.array(["b", "a", None, "b", "c", "a", None, "b"])],
                         ids=["int64-with-nulls", "int16", "string-with-nulls"])
def test_a_batch_s_rows_grouped_on_arrow_come_as_a_dict_groups_them(column):
    """Keys in the order their first rows came, each key's rows in their order, nulls one key."""
    assert execution._groups_on_arrow(column.type)
    batch = pa.record_batch({"k": column, "n": pa.array(range(len(column)))})
    grouped = execution._by_key(SimpleNamespace(key_names=["k"]), [batch.slice(0, 3), batch.slice(3)])
    expected: dict = {}
    for key, n in zip(column.to_pylist(), range(len(column)), strict=True):
        expected.setdefault(key, []).append((key, n))
    assert list(grouped.items()) == list(expected.items())
    assert [row.n for row in grouped[column[0].as_py()]] == [n for k, n in expected[column[0].as_py()]]
