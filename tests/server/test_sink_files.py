"""FileSink on S3 (moto) and on a local disk: Spark tasks write staged files with pyarrow, a commit
record makes the batch committed, then the files are published. A kill at any point of the
commit, then a re-run of the batch, leaves every row exactly once and nothing partial visible."""

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import s3fs
from pyspark.sql import functions as F

from batchline import BatchContext, BatchTime, ConfigurationError
from batchline.checkpoint.storage import seal, unseal
from batchline.sinks import files as files_module
from batchline.sinks.files import TEST_KILL_VARIABLE, FileSink
from tests.drivers.s3_sink_driver import ROWS, batch_frame
from tests.helpers import DRIVERS

BUCKET = "batchline-sink"
DRIVER = DRIVERS / "s3_sink_driver.py"
BATCH = 1_780_000_000_000




class Output:
    """What a reader sees of a sink's output, on S3 or a local disk."""

    def __init__(self, url, fs, root, format):
        self.url, self.fs, self.root, self.format = url, fs, root, format
        parent, name = root.rsplit("/", 1)
        self.own = f"{parent}/.{name}.batchline"  # the sink's staging and records, beside the output

    @classmethod
    def s3(cls, options, format):
        prefix = f"{BUCKET}/out-{uuid.uuid4().hex[:8]}"
        return cls(f"s3://{prefix}", s3fs.S3FileSystem(**options), prefix, format)

    @classmethod
    def local(cls, tmp_path, format):
        from fsspec.implementations.local import LocalFileSystem

        return cls(str(tmp_path / "out"), LocalFileSystem(), str(tmp_path / "out"), format)

    def find(self, under):
        self.fs.invalidate_cache()
        try:
            return sorted(p[len(self.root) + 1:] for p in self.fs.find(f"{self.root}/{under}"))
        except FileNotFoundError:
            return []

    def find_own(self, under):
        self.fs.invalidate_cache()
        try:
            return sorted(p[len(self.own) + 1:] for p in self.fs.find(f"{self.own}/{under}"))
        except FileNotFoundError:
            return []

    def batch_files(self, batch=BATCH):
        return [p.rsplit("/", 1)[1] for p in self.find(f"batch_time={batch}")]

    def record(self, batch=BATCH):
        name = f"{self.own}/commits/{batch:015d}.json"
        self.fs.invalidate_cache()
        if not self.fs.exists(name):
            return None
        return unseal(self.fs.cat_file(name), name)

    def rows_in(self, relative):
        with self.fs.open(f"{self.root}/{relative}", "rb") as handle:
            if self.format == "parquet":
                return pq.ParquetFile(handle).metadata.num_rows
            return sum(1 for line in handle.read().decode().splitlines() if line.strip())

    def json_rows(self):
        return [json.loads(line) for path in self.find("") if not path.startswith("_")
                for line in self.fs.cat_file(f"{self.root}/{path}").decode().splitlines()]

    def read_ids(self):
        """A plain pyarrow reader over the whole output; it must never fail."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return collections.Counter()
        table = ds.dataset(self.root, filesystem=self.fs, format=self.format, partitioning="hive").to_table()
        if table.num_rows:
            assert {int(t) for t in table.column("batch_time").to_pylist()} <= {BATCH}  # str: too big for int32
        return collections.Counter(table.column("id").to_pylist()) if table.num_rows else collections.Counter()

    def assert_complete_exactly_once(self):
        assert self.read_ids() == collections.Counter(range(ROWS))
        record = self.record()
        assert record is not None
        assert self.batch_files() == [entry["file"] for entry in record["files"]]
        for entry in record["files"]:
            assert self.rows_in(f"batch_time={BATCH}/{entry['file']}") == entry["rows"] > 0
        assert sum(entry["rows"] for entry in record["files"]) == ROWS
        assert self.find_own(f"staging/{BATCH}") == []
        assert self.find("") == [f"batch_time={BATCH}/{name}" for name in self.batch_files()]  # nothing else

    def assert_only_whole_files_visible(self):
        record = self.record()
        expected = {e["file"]: e["rows"] for e in record["files"]} if record else {}
        for name in self.batch_files():
            assert self.rows_in(f"batch_time={BATCH}/{name}") == expected[name], f"{name} is partial"
        self.read_ids()


@contextlib.contextmanager
def spark_jobs(spark):
    """The ids of the Spark jobs started inside the block."""
    group = f"sink-test-{uuid.uuid4().hex}"
    context = spark.sparkContext
    context.setJobGroup(group, "file sink test")
    jobs = []
    try:
        yield jobs
    finally:
        jobs += context.statusTracker().getJobIdsForGroup(group)
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)


# ----------------------------------------------------------------------- round trips
TYPES_QUERY = """
select id,
       case when id = 3 then null else concat('name-', id) end as name,
       timestamp_seconds(1780000000 + id) + make_interval(0, 0, 0, 0, 0, 0, 0.123456) as ts,
       date_add(date'2026-11-21', cast(id as int)) as day,
       cast(id as decimal(20, 2)) / 3 as amount,
       array(id, id + 1) as pair,
       named_struct('a', id, 'b', named_struct('c', array(named_struct('d', date'2026-01-01'))),
                    'when', timestamp'2026-01-02 03:04:05.678Z') as nested,
       map('k', id) as tags,
       cast('bytes' as binary) as raw
from range(0, 10, 1, 4)
"""


@pytest.mark.parametrize("format", ["parquet", "json"])
def test_a_batch_round_trips_through_s3(spark, s3_endpoint, format):
    out = Output.s3(s3_endpoint, format)
    df = spark.sql(TYPES_QUERY).where("id != 5")
    FileSink(out.url, format, storage_options=s3_endpoint).write(df, BATCH)

    names = out.batch_files()
    assert names and all(n.startswith("part-") and n.endswith(f".{format}") for n in names)
    assert out.find_own(f"staging/{BATCH}") == []
    record = out.record()
    assert [e["file"] for e in record["files"]] == names and sum(e["rows"] for e in record["files"]) == 9
    expected = sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])  # Spark's values, as Arrow holds them
    if format == "parquet":
        table = ds.dataset(out.root, filesystem=out.fs, format="parquet", partitioning="hive").to_table()
        assert {int(t) for t in table.column("batch_time").to_pylist()} == {BATCH}
        assert sorted(table.drop_columns(["batch_time"]).to_pylist(), key=lambda r: r["id"]) == expected
    else:
        got = sorted(out.json_rows(), key=lambda r: r["id"])
        assert got[0] == {
            "id": 0, "name": "name-0", "ts": "2026-05-28T20:26:40.123456Z", "day": "2026-11-21", "amount": 0.0,
            "pair": [0, 1], "nested": {"a": 0, "b": {"c": [{"d": "2026-01-01"}]}, "when": "2026-01-02T03:04:05.678Z"},
            "tags": {"k": 0}, "raw": "Ynl0ZXM=",
        }
        assert [r["id"] for r in got] == [r["id"] for r in expected]
        assert got[3]["name"] is None
        assert [Decimal(str(r["amount"])) for r in got] == [r["amount"] for r in expected]
        line = out.fs.cat_file(f"{out.root}/batch_time={BATCH}/{names[0]}").decode().splitlines()[0]
        assert '"amount":0.000000' in line  # the decimal's exact digits, as a number
        assert ds.dataset(out.root, filesystem=out.fs, format="json", partitioning="hive").to_table().num_rows == 9


def test_a_batch_without_rows_writes_nothing(spark, s3_endpoint, tmp_path):
    for out in (Output.s3(s3_endpoint, "json"), Output.local(tmp_path, "json")):
        FileSink(out.url, "json", storage_options=s3_endpoint if out.url.startswith("s3") else None).write(
            spark.range(0, 10, 1, 3).where("id < 0"), BATCH)
        assert out.find("") == [] and out.find_own("staging") == []
        assert out.record() is None


def test_writing_a_committed_batch_again_changes_nothing(spark, s3_endpoint):
    out = Output.s3(s3_endpoint, "parquet")
    sink = FileSink(out.url, storage_options=s3_endpoint)
    sink.write(batch_frame(spark), BATCH)
    before = {name: out.fs.info(f"{out.root}/batch_time={BATCH}/{name}")["ETag"] for name in out.batch_files()}
    record = out.record()
    with spark_jobs(spark) as jobs:
        sink.write(spark.range(0, 1).select(F.raise_error("must not be computed").alias("id")), BATCH)
    assert jobs == []
    assert out.record() == record
    assert {name: out.fs.info(f"{out.root}/batch_time={BATCH}/{name}")["ETag"] for name in out.batch_files()} == before
    out.assert_complete_exactly_once()


def test_a_first_attempt_looks_for_nothing_earlier_and_still_commits_a_batch_once(spark, s3_endpoint, monkeypatch):
    """On a batch's first attempt the sink reads no commit record and lists nothing before it
    commits; a first attempt that meets a committed batch anyway (another writer) completes
    that commit and discards its own: every row once."""
    out = Output.s3(s3_endpoint, "parquet")
    sink = FileSink(out.url, storage_options=s3_endpoint)
    first = BatchContext(BatchTime(BATCH), "out", "p", 1, first_attempt=True)

    def looked(*args):
        raise AssertionError("a first attempt looked for what an earlier one left")

    with monkeypatch.context() as patched:
        patched.setattr(sink, "_read_record", looked)
        patched.setattr(sink, "_look_left", looked)
        patched.setattr(sink._storage, "has_folder", looked)
        sink.write(batch_frame(spark), first)
    assert sink._looks == {}
    out.assert_complete_exactly_once()
    record = out.record()
    sink.write(batch_frame(spark), first)  # as if another driver had committed it meanwhile
    assert out.record() == record
    out.assert_complete_exactly_once()


def test_a_first_attempt_at_a_batch_the_output_compacted_writes_nothing(spark, s3_endpoint):
    """A batch time the output committed before and compacted into its snapshot (a checkpoint
    restored from a backup logs it afresh) is found committed on a first attempt too."""
    out = Output.s3(s3_endpoint, "json")
    FileSink(out.url, "json", storage_options=s3_endpoint)._own.write_new(
        files_module.COMPACTED_RECORD, seal({"through_ms": BATCH}))
    sink = FileSink(out.url, "json", storage_options=s3_endpoint)
    with spark_jobs(spark) as jobs:
        sink.write(spark.range(0, 1).select(F.raise_error("must not be computed").alias("id")),
                   BatchContext(BatchTime(BATCH), "out", "p", 1, first_attempt=True))
    assert jobs == [] and out.batch_files() == [] and out.record() is None


def test_unsupported_options_are_refused():
    with pytest.raises(ConfigurationError, match="use one of compression"):
        FileSink("/tmp/never", "parquet", {"mergeSchema": "true"})
    with pytest.raises(ConfigurationError, match="leave it out"):
        FileSink("/tmp/never", "json", {"compression": "gzip"})
    with pytest.raises(ConfigurationError, match="use one of snappy"):
        FileSink("/tmp/never", "parquet", {"compression": "lzo"})


# ----------------------------------------------------------------------- kills in the commit
@pytest.mark.chaos  # the one kill test outside tests/chaos/: it shares this file's S3 output reader
@pytest.mark.parametrize(("kill_at", "format"), [("before-record", "json"), ("after-record:0", "parquet"),
                                                 ("after-record:2", "json")])
def test_a_driver_killed_in_the_commit_on_s3_completes_the_batch_exactly_once(spark, s3_endpoint, kill_at, format):
    out = Output.s3(s3_endpoint, format)
    driver = subprocess.run(
        [sys.executable, str(DRIVER), out.url, json.dumps(s3_endpoint), str(BATCH), format],
        env={**os.environ, TEST_KILL_VARIABLE: kill_at}, capture_output=True, text=True, timeout=300)
    assert driver.returncode == -signal.SIGKILL, driver.stderr[-3000:]
    assert "written" not in driver.stdout

    # What the kill left: staged files always; visible files only whole ones listed in a record.
    staged = out.find_own(f"staging/{BATCH}")
    assert len(staged) == 4, staged  # 5 partitions, the empty one writes no file
    out.assert_only_whole_files_visible()
    if kill_at == "before-record":
        assert out.record() is None and out.batch_files() == []
    else:
        assert len(out.record()["files"]) == 4
        assert len(out.batch_files()) == int(kill_at.split(":")[1])
    record = out.record()

    with spark_jobs(spark) as jobs:  # the restarted driver runs the batch again: same time, same data
        FileSink(out.url, format, storage_options=s3_endpoint).write(batch_frame(spark), BATCH)
    out.assert_complete_exactly_once()
    if kill_at == "before-record":
        assert jobs, "without a record the batch is written again"
    else:
        assert jobs == [], "a committed batch is completed from its staged files, not written again"
        assert out.record() == record


@pytest.mark.parametrize("point", ["before-record", "after-record:0", "after-record:4"])
def test_a_crash_in_the_commit_on_a_local_disk_completes_the_batch_exactly_once(spark, tmp_path, monkeypatch,
                                                                                point):
    out = Output.local(tmp_path, "parquet")

    class Crash(BaseException):
        pass

    def crash_at(reached):
        if reached == point:
            raise Crash(reached)

    monkeypatch.setattr(files_module, "_test_kill_point", crash_at)
    with pytest.raises(Crash):
        FileSink(out.url).write(batch_frame(spark), BATCH)
    out.assert_only_whole_files_visible()
    assert len(out.batch_files()) == (4 if point == "after-record:4" else 0)  # one rename: all or nothing
    monkeypatch.undo()

    with spark_jobs(spark) as jobs:
        FileSink(out.url).write(batch_frame(spark), BATCH)
    out.assert_complete_exactly_once()
    assert bool(jobs) == (point == "before-record")
    assert os.listdir(tmp_path / ".out.batchline" / "staging") == []


# ----------------------------------------------------------------------- readers that glob everything
def duckdb_rows(directory, format="parquet"):
    """What a DuckDB user sees of the output with a ``**`` glob (it reads ``_`` and ``.`` paths too)."""
    import duckdb

    files = [p for p in Path(directory).rglob(f"*.{format}")]
    if not files:
        return 0
    reader = "read_parquet" if format == "parquet" else "read_json_auto"
    return duckdb.sql(f"select count(*) from {reader}('{directory}/**/*.{format}')").fetchall()[0][0]


@pytest.mark.parametrize("point", ["before-record", "after-record:0"])
def test_duckdb_globbing_the_output_never_sees_a_staged_or_uncommitted_file(spark, tmp_path, monkeypatch, point):
    out = Output.local(tmp_path, "parquet")

    class Crash(BaseException):
        pass

    def crash_at(reached):
        if reached == point:
            raise Crash(reached)

    monkeypatch.setattr(files_module, "_test_kill_point", crash_at)
    with pytest.raises(Crash):
        FileSink(out.url).write(batch_frame(spark), BATCH)
    assert len(out.find_own(f"staging/{BATCH}")) == 4  # staged beside the output, not under it
    assert duckdb_rows(tmp_path / "out") == 0 == out.read_ids().total()
    monkeypatch.undo()
    FileSink(out.url).write(batch_frame(spark), BATCH)
    assert duckdb_rows(tmp_path / "out") == ROWS == out.read_ids().total()
    assert sorted(os.listdir(tmp_path)) == [".out.batchline", "out"]
    assert os.listdir(tmp_path / "out") == [f"batch_time={BATCH}"]  # nothing of the sink's own in the output


def test_a_batch_committed_by_an_earlier_release_under_the_output_is_not_written_again(spark, tmp_path):
    first = FileSink(str(tmp_path / "out"))
    first.write(batch_frame(spark), BATCH)
    # Move the record where releases before 0.2 kept it, as such a release would have left it.
    legacy = tmp_path / "out" / "_batchline" / "commits"
    legacy.mkdir(parents=True)
    name = f"{BATCH:015d}.json"
    os.rename(tmp_path / ".out.batchline" / "commits" / name, legacy / name)
    with spark_jobs(spark) as jobs:
        FileSink(str(tmp_path / "out")).write(batch_frame(spark), BATCH)
    assert jobs == []
    assert FileSink(str(tmp_path / "out")).last_commit() == {
        "path": str(tmp_path / "out"), "batch_time": BATCH, "record": str(legacy / name)}


def test_an_output_without_a_parent_is_refused():
    with pytest.raises(ConfigurationError, match="write into a directory or prefix below it"):
        FileSink("s3://bucket-only")
