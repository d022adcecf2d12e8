"""A checkpoint a receiver pipeline wrote before the receiver input became a ``Source``
restarts exactly: the batch logged after the last checkpoint, which the old driver died in,
runs again with exactly the blocks it had logged; the block written ahead that no batch had
taken goes into the first batch after the restart; new blocks are numbered after the old
ones. Every record is written once."""

import json
import shutil

from tests.helpers import CHECKPOINT_FIXTURES, LogWatcher, fixture_pipeline, poll_until

FIXTURE = CHECKPOINT_FIXTURES / "receivers_before_source"


def test_a_checkpoint_of_the_receivers_before_source_restarts_exactly(spark, tmp_path):
    old = fixture_pipeline("receivers_before_source")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(FIXTURE / "checkpoint", checkpoint)
    first = {int(t): rows for t, rows in json.loads((FIXTURE / "first_run.json").read_text()).items()}
    assert first == {11_000: ["a", "b", "c"], 12_000: ["d", "e"]}

    second = old.Pipeline(spark, checkpoint, 13_500)
    with LogWatcher() as logs:
        second.ssc.start()
        try:
            second.recorder.wait_for_batch(13_000)
            second.cut_block(13_800, "k", 5, checkpoint)  # numbered after the blocks on disk
            # Block 4 is queued already, so cut_block may return between block 5's write-ahead
            # and its queueing: wait until both wait for a batch.
            [feed] = second.ssc.graph.inputs
            assert poll_until(lambda: len(feed.source._queued) == 2), "block 5 was not queued"  # noqa: SLF001
            second.clock.set_time(14_000)
            second.recorder.wait_for_batch(14_000)
        finally:
            second.ssc.stop()
    assert "Batches pending processing (1 batches): 13000 ms" in logs.messages()
    assert any("Recovered 1 received blocks of feed" in m for m in logs.messages())
    # The batch the old driver died in: exactly its logged blocks 2 and 3.
    assert second.rows[13_000] == ["f", "g", "h"]
    # Block 4, written ahead and taken by no batch, comes first after the restart, then block 5.
    assert second.rows[14_000] == ["i", "j", "k"]
    counts = {info.batch_time: info.num_records for info in second.recorder.completed}
    assert counts[13_000] == 3 and counts[14_000] == 3
    everything = [r for rows in [*first.values(), *second.rows.values()] for r in rows]
    assert sorted(everything) == list("abcdefghijk")
    # The batch log and the checkpoint keep the shapes the older code wrote.
    logged = (checkpoint / "events" / "000000000014000" / "started.json").read_text()
    assert '"feed":{"blocks":[4,5]}' in logged
