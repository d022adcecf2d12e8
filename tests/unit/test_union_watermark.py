"""An operator downstream of a union of streams with their own ``with_watermark`` has one
watermark, Spark's global one under its default policy ("min"): the lowest of theirs, 0 until
each has seen an event time. Each one's newest event time is kept for a restart."""

from types import SimpleNamespace

from pyspark.sql.types import StructType

from batchline.checkpoint.model import OperatorProgress
from batchline.state.stateful import StatefulRuntime
from batchline.state.store import StateMetadata
from batchline.streams.base import Watermark, lowest_watermark

FIRST, SECOND = Watermark("eventTime", 10_000), Watermark("eventTime", 5_000)


def watermark(newest, batch_time=100_000, last_rows_at=100_000, watermarks=(FIRST, SECOND)):
    return lowest_watermark(watermarks, newest, batch_time, last_rows_at)


def test_none_until_one_has_seen_an_event_time_then_0_until_each_has():
    assert watermark({}) is None
    assert watermark({0: 11_000}) == 0
    assert watermark({1: 6_000}) == 0


def test_the_lowest_of_each_ones_newest_event_time_minus_its_delay():
    # Spark's EventTimeWatermarkSuite "watermark with 2 streams", step by step.
    assert watermark({0: 11_000, 1: 6_000}) == 1_000
    assert watermark({0: 11_000, 1: 8_000}) == 1_000
    assert watermark({0: 21_000, 1: 8_000}) == 3_000
    assert watermark({0: 21_000, 1: 39_000}) == 11_000


def test_never_below_0():
    assert watermark({0: 3_000, 1: 60_000}) == 0


def test_an_idle_timeout_moves_each_on_by_the_time_idle():
    idle = Watermark("eventTime", 10_000, idle_timeout_ms=5_000)
    assert watermark({0: 20_000, 1: 20_000}, batch_time=14_000, last_rows_at=10_000,
                     watermarks=(idle, SECOND)) == 10_000  # idle 4 s: not yet
    assert watermark({0: 20_000, 1: 20_000}, batch_time=16_000, last_rows_at=10_000,
                     watermarks=(idle, SECOND)) == 15_000  # 20 + 6 - 10 = 16 s, but the second's is 15 s


def runtime(progress: OperatorProgress, sources=(FIRST, SECOND)) -> StatefulRuntime:
    """A runtime with only what its watermark and progress read (no Spark, no store)."""
    made = StatefulRuntime.__new__(StatefulRuntime)
    made.metadata = StateMetadata("union_sum", 2, 0, StructType([]), StructType([]), "NoTimeout")
    made.node = SimpleNamespace(event_time=sources[0], input_watermarks=())  # type: ignore[assignment]
    made._sources = tuple(SimpleNamespace(node=SimpleNamespace(watermark=lambda w=w: w)) for w in sources)
    made.restore_progress(progress)
    return made


def test_each_ones_newest_event_time_is_restored():
    progress = OperatorProgress(max_event_time_ms=21_000, source_max_event_time_ms={0: 21_000, 1: 8_000},
                                last_rows_at=4_000)
    restored = runtime(progress)
    assert restored.watermark_ms(5_000) == 3_000
    assert restored.progress() == progress
    assert OperatorProgress.from_json(progress.to_json()) == progress


def test_a_checkpoint_that_kept_only_the_newest_of_all_keeps_the_watermark_it_had():
    """The release before took the first source's delay against the newest event time of all:
    a restart from its checkpoint starts from that watermark, neither lower (windows closed and
    emitted would take rows again, and be emitted twice) nor higher."""
    older = OperatorProgress.from_json({"max_event_time_ms": 21_000, "last_rows_at": 4_000})
    assert older.source_max_event_time_ms is None
    restored = runtime(older)
    assert restored.watermark_ms(5_000) == 11_000  # 21 s less the first's 10 s, as before
    assert restored.progress().source_max_event_time_ms == {0: 21_000, 1: 16_000}
    assert runtime(older, sources=(SECOND, FIRST)).watermark_ms(5_000) == 16_000  # less the first's 5 s
    assert runtime(OperatorProgress.from_json({"max_event_time_ms": None})).watermark_ms(5_000) is None


def test_other_operators_write_no_field():
    progress = OperatorProgress(max_event_time_ms=7_000)
    assert "source_max_event_time_ms" not in progress.to_json()
