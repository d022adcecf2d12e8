"""A damaged state file at a restart (SPEC E3): the pipeline stops at the first attempt, naming
the file and what is wrong with it, and never goes on with state it could not verify."""

from pathlib import Path

import pytest

from batchline import StreamingContext
from batchline.errors import BatchFailedError
from batchline.scheduler.retry import RetryPolicy
from tests.helpers import Collect


def count_events(key, rows, state):
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    yield (key, count)


def run(spark, checkpoint, collect, retry):
    ssc = StreamingContext(spark, "300ms", checkpoint=str(checkpoint), retry=retry)
    events = ssc.generator_stream(300, users=6, seed=5, name="events")
    counts = events.group_by_key("id").flat_map_groups_with_state(
        count_events, state_schema="count long", output_schema="id long, count long", name="counts",
        num_partitions=2)
    counts.foreach_batch(collect, name="out")
    ssc.start()
    return ssc


def newest_committed_delta(checkpoint: Path, committed: int) -> Path:
    deltas = sorted(checkpoint.rglob(f"p00000/{committed:015d}.delta.arrow"))
    assert len(deltas) == 1, deltas
    return deltas[0]


@pytest.mark.parametrize("damage", ["flipped", "truncated", "emptied"])
def test_a_damaged_state_delta_stops_the_restart_naming_the_file(spark, tmp_path, damage):
    checkpoint = tmp_path / "checkpoint"
    first = Collect(fail_on_call=4)
    ssc = run(spark, checkpoint, first, RetryPolicy.never())
    with pytest.raises(BatchFailedError, match="crash after reading"):
        ssc.await_termination(60)
    committed = sorted(first.batches)[2]  # the third batch committed; the fourth failed
    delta = newest_committed_delta(checkpoint, committed)
    data = bytearray(delta.read_bytes())
    if damage == "flipped":
        data[len(data) // 2: len(data) // 2 + 4] = b"\xde\xad\xbe\xef"
    elif damage == "truncated":
        data = data[:10]
    else:
        data = bytearray()
    delta.write_bytes(bytes(data))

    second = Collect()
    ssc = run(spark, checkpoint, second, RetryPolicy(max_attempts=3, initial_backoff="100ms"))
    with pytest.raises(BatchFailedError) as failure:
        ssc.await_termination(60)
    message = str(failure.value)
    assert f"{committed:015d}.delta.arrow" in message and "is damaged" in message
    assert {"flipped": "checksum does not match", "truncated": "cut short", "emptied": "empty"}[damage] in message
    assert "Restore the file" in message
    assert failure.value.attempts == 1  # a damaged file stays damaged: no retry
    # Nothing went on from state it could not verify: the batch that crashed the first run had
    # finished its partitions from good state (kept, and given again as they were); the next
    # batch, which needs the damaged delta, stopped the pipeline.
    crashed = sorted(first.batches)[3]
    assert set(second.batches) <= {crashed}
    assert all(sorted(rows, key=str) == sorted(first.batches[crashed], key=str) for rows in second.batches.values())
