"""A source and a sink written in this file alone, on batchline's documented interfaces, run
through a crash and a restart with exact results; and what the engine promises around them."""

import json
import logging
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from batchline import ConfigurationError, DeadLetter, Sink, Source, SourceBatch, StreamingContext
from batchline.errors import BatchFailedError
from batchline.scheduler.retry import RetryPolicy
from batchline.sources.source_input import SourceInput
from batchline.testing import BatchRecorder

TOTAL, PER_BATCH, PER_SPLIT = 230, 40, 15


class Numbers(Source):
    """0..TOTAL-1 as rows (n, parity); multiples of 37 are bad records (dead letters)."""

    bounded = True

    def __init__(self, total=TOTAL):
        self.total = total
        self.acknowledged = []

    def schema(self):
        return StructType([StructField("n", LongType(), False), StructField("parity", StringType(), False)])

    def initial_position(self):
        return {"next": 0}

    def end_of_input(self):
        return {"next": self.total}

    def plan(self, start, end_of_input):
        first = start["next"]
        last = min(first + PER_BATCH, end_of_input["next"])
        splits = tuple({"from": a, "to": min(a + PER_SPLIT, last)} for a in range(first, last, PER_SPLIT))
        return SourceBatch(start, {"next": last}, splits, info={"numbers": [first, last]})

    def read(self, split):
        for n in range(split["from"], split["to"]):
            if n and n % 37 == 0:
                yield DeadLetter(json.dumps({"n": n}), f"{n} is a multiple of 37")
            else:
                yield {"n": n, "parity": "even" if n % 2 == 0 else "odd"}

    def acknowledge(self, batch):
        self.acknowledged.append(dict(batch.end))
        if len(self.acknowledged) == 2:
            raise RuntimeError("the upstream system is unreachable")


class JsonDirectorySink(Sink):
    """One JSON file per batch, named by the batch time: a batch written before is skipped."""

    def __init__(self, directory, crash_after_batch=None):
        self.directory = Path(directory)
        self.crash_after_batch = crash_after_batch
        self.writes = []

    def open(self, context):
        self.directory.mkdir(parents=True, exist_ok=True)
        self.context = context

    def write(self, df, batch):
        rows = sorted(row.n for row in df.collect())
        self.writes.append((int(batch.batch_time), rows, batch.fencing_token, batch.output))
        target = self.directory / f"{int(batch.batch_time)}.json"
        if not target.exists():
            target.write_text(json.dumps(rows))
        if self.crash_after_batch is not None and len(self.writes) == self.crash_after_batch:
            raise RuntimeError("crashed after writing")

    def last_commit(self):
        times = sorted(int(p.stem) for p in self.directory.glob("*.json"))
        return {"batch_time": times[-1] if times else None}


def expected_numbers():
    return [n for n in range(TOTAL) if not (n and n % 37 == 0)]


def run(spark, checkpoint, out, crash_after_batch=None, dead=None):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(checkpoint), retry=RetryPolicy.never())
    source = Numbers()
    sink = JsonDirectorySink(out, crash_after_batch)
    numbers = ssc.input(source, name="numbers")
    numbers.write(sink, name="json")
    if dead is not None:
        numbers.dead_letters.foreach_batch(lambda df, t: dead.extend(r.reason for r in df.collect()), name="dead")
    return ssc, source, sink


def test_a_user_written_source_and_sink_run_through_a_crash_and_a_restart_exactly(spark, tmp_path, caplog):
    checkpoint, out, dead = tmp_path / "checkpoint", tmp_path / "out", []
    ssc, _, first_sink = run(spark, checkpoint, out, crash_after_batch=3, dead=dead)
    with pytest.raises(BatchFailedError, match="crashed after writing"):
        ssc.run_until_finished(120)
    crashed_time, crashed_rows, token, output = first_sink.writes[2]
    assert output == "json" and token >= 1

    with caplog.at_level(logging.INFO):
        ssc, source, sink = run(spark, checkpoint, out, dead=dead)
        assert ssc.run_until_finished(120)
    # the crashed batch ran again with exactly its logged splits, under a newer lease
    rerun = [w for w in sink.writes if w[0] == crashed_time]
    assert rerun and rerun[0][1] == crashed_rows and rerun[0][2] > token
    written = [n for path in sorted(out.glob("*.json")) for n in json.loads(path.read_text())]
    assert sorted(written) == expected_numbers()  # nothing lost, nothing twice
    # (foreach_batch is not idempotent: the re-run batch hands its dead letters over again)
    assert set(dead) == {f"{n} is a multiple of 37" for n in range(37, TOTAL, 37)}
    # an acknowledgement that fails is logged; the committed batch and the pipeline go on
    assert len(source.acknowledged) >= 2
    assert "could not acknowledge batch" in caplog.text


def test_counts_come_from_the_job_that_reads_the_rows(spark, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    ssc.input(Numbers(total=80), name="numbers").write(JsonDirectorySink(tmp_path / "out"), name="json")
    assert ssc.run_until_finished(120)
    records = sum(info.num_records or 0 for info in recorder.completed)
    assert records == len([n for n in range(80) if not (n and n % 37 == 0)])


def test_the_interfaces_refuse_what_is_not_theirs(spark):
    ssc = StreamingContext(spark, "1s")
    with pytest.raises(ConfigurationError, match="takes a batchline.Source"):
        ssc.input(object())
    stream = ssc.input(Numbers())
    with pytest.raises(ConfigurationError, match="takes a batchline.Sink"):
        stream.write(lambda df, t: None)


def test_a_source_that_does_not_say_what_a_batch_takes_is_refused_where_it_is_added():
    class Nothing(Source):
        def schema(self):
            return StructType([StructField("n", LongType())])

        def initial_position(self):
            return {}

        def read(self, split):
            return ()

    with pytest.raises(ConfigurationError, match=r"Nothing does not say what a batch takes: implement plan\(\)"):
        SourceInput(Nothing(), "nothing", 1000)


class ArrowSink(Sink):
    """Writes through ``batch.map_in_arrow``, as a sink that loads a database from its tasks
    does: keeps the numbers its tasks were handed and the plan of the job that ran them."""

    def __init__(self):
        self.numbers, self.plans = [], []

    def write(self, df, batch):
        def numbers(batches):
            for arrow in batches:
                yield arrow.select(["n"])

        mapped = batch.map_in_arrow(df, numbers, "n long")
        self.plans.append(mapped._jdf.queryExecution().executedPlan().toString())
        self.numbers.extend(row.n for row in mapped.collect())


def python_passes(plan):
    return plan.count("MapInArrow")


def input_counts(recorder):
    """The records and dead letters the input reported over the run's batches."""
    infos = [info for batch in recorder.completed for info in batch.input_infos.values()]
    return sum(i.num_records or 0 for i in infos), sum(i.dead_letters for i in infos)


def pending_observations(spark):
    """How many observations Spark's session keeps waiting for a query to fill them."""
    manager = spark._jsparkSession.observationManager()
    [field] = [f for f in manager.getClass().getDeclaredFields() if f.getName().endswith("observations")]
    field.setAccessible(True)
    return field.get(manager).size()


def test_a_sink_that_maps_arrow_batches_writes_an_input_in_the_pass_that_reads_it(spark, tmp_path):
    """``ssc.input(source).write(sink)``: the sink's function runs in the tasks that read the
    splits (one Python pass, no trip through the JVM), gets good rows only, and the input's
    counts of records and dead letters stay exact though no observation saw the rows."""
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = ArrowSink()
    ssc.input(Numbers(), name="numbers").write(sink, name="arrow")
    assert ssc.run_until_finished(120)

    assert sorted(sink.numbers) == expected_numbers()
    assert sink.plans and all(python_passes(plan) == 1 for plan in sink.plans)
    assert input_counts(recorder) == (len(expected_numbers()), len(range(37, TOTAL, 37)))


class GoodNumbers(Numbers):
    """Numbers without a bad record: no query reads a batch's dead letters to log them."""

    def read(self, split):
        return ((n, "even" if n % 2 == 0 else "odd") for n in range(split["from"], split["to"]))


def test_a_batch_written_in_the_pass_that_reads_it_leaves_no_observation_behind(spark, tmp_path):
    """The input's observation, which no job of such a batch runs, is let go once the tasks'
    counts are in: Spark would keep it for ever, one a batch (SPEC E6)."""
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    sink = ArrowSink()
    ssc.input(GoodNumbers(total=120), name="numbers").write(sink, name="arrow")
    waiting = pending_observations(spark)
    assert ssc.run_until_finished(120)
    assert sorted(sink.numbers) == list(range(120))
    assert len(sink.plans) == 3 and all(python_passes(plan) == 1 for plan in sink.plans)
    assert pending_observations(spark) == waiting


def test_an_input_read_by_another_output_too_is_mapped_after_it_is_read(spark, tmp_path):
    """With a second reader (here its dead letters' output) the input is read once, for both,
    and the sink's function runs in a pass of its own: the same rows, the same counts."""
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink, dead = ArrowSink(), []
    numbers = ssc.input(Numbers(), name="numbers")
    numbers.write(sink, name="arrow")
    numbers.dead_letters.foreach_batch(lambda df, t: dead.extend(r.reason for r in df.collect()), name="dead")
    assert ssc.run_until_finished(120)

    assert sorted(sink.numbers) == expected_numbers()
    assert sink.plans and all(python_passes(plan) == 2 for plan in sink.plans)
    assert len(dead) == len(range(37, TOTAL, 37))
    assert input_counts(recorder) == (len(expected_numbers()), len(dead))


class NativeNumbers(Numbers):
    """Numbers whose batches Spark reads itself (``frame``): there is no Python read to join."""

    def frame(self, spark, batch):
        first, last = batch.start["next"], batch.end["next"]
        return spark.range(first, last).selectExpr("id AS n", "IF(id % 2 = 0, 'even', 'odd') AS parity")

    def read(self, split):
        raise AssertionError("a source read natively is never read split by split")


def test_a_source_spark_reads_natively_is_mapped_after_spark_read_it(spark, tmp_path):
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"))
    sink = ArrowSink()
    ssc.input(NativeNumbers(total=100), name="numbers").write(sink, name="arrow")
    assert ssc.run_until_finished(120)
    assert sorted(sink.numbers) == list(range(100))
    assert sink.plans and all(python_passes(plan) == 1 for plan in sink.plans)  # the sink's own pass only


class FirstBatchSink(ArrowSink):
    """Its function stops after the first Arrow batch of a partition, as a ``limit`` would;
    it fails its first write once its job ran, when ``fail_first`` (the batch is retried)."""

    def __init__(self, fail_first=False):
        super().__init__()
        self.fail_first = fail_first

    def write(self, df, batch):
        def first(batches):
            for arrow in batches:
                yield arrow.select(["n"])
                return

        mapped = batch.map_in_arrow(df, first, "n long")
        self.plans.append(mapped._jdf.queryExecution().executedPlan().toString())
        self.numbers.extend(row.n for row in mapped.collect())
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("the destination went away after the rows were read")


def test_counts_stay_exact_when_a_sink_reads_part_of_its_input_or_its_batch_runs_again(spark, tmp_path):
    """A function that stops early leaves its splits uncounted: the input counts them with a
    read of its own. A batch whose first attempt failed after its job ran counts once."""
    ssc = StreamingContext(spark, "200ms", checkpoint=str(tmp_path / "c"),
                           retry=RetryPolicy(max_attempts=2, initial_backoff="100ms", max_backoff="100ms"))
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = FirstBatchSink(fail_first=True)
    ssc.input(Numbers(), name="numbers").write(sink, name="arrow")
    assert ssc.run_until_finished(120) and not recorder.errors
    assert input_counts(recorder) == (len(expected_numbers()), len(range(37, TOTAL, 37)))
    assert all(python_passes(plan) == 1 for plan in sink.plans)
    assert len(sink.plans) == -(-TOTAL // PER_BATCH) + 1  # every batch once, the first twice


def test_a_batch_context_goes_into_a_task_without_the_engine():
    """A sink's task code may close over its ``BatchContext``: it pickles without the
    engine's runtime (a lock, the Spark session) that ``map_in_arrow`` reaches."""
    import functools
    import threading

    from pyspark import cloudpickle

    from batchline import BatchContext, BatchTime

    lock = threading.RLock()
    context = BatchContext(BatchTime(1000), "out", "pipeline", 7,
                           functools.partial(lambda held, df, fn, schema: df, lock))
    copy = cloudpickle.loads(cloudpickle.dumps(context))
    assert (copy.batch_time, copy.output, copy.pipeline, copy.fencing_token) == (1000, "out", "pipeline", 7)
    assert copy.arrow_mapper is None and context.arrow_mapper is not None
