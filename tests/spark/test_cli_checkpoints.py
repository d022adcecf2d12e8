"""``batchline checkpoints list|inspect`` on a real checkpoint location."""

import json

from batchline import StreamingContext
from batchline.cli.main import main
from batchline.clock import ManualClock
from batchline.testing import BatchRecorder


def test_list_and_inspect_a_checkpoint_location(spark, tmp_path, capsys):
    clock = ManualClock(10_500)
    ssc = StreamingContext(spark, "1s", clock=clock, checkpoint=str(tmp_path), checkpoint_interval="2s")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    ssc.generator_stream(rate=10, name="events").foreach_batch(lambda df, t: df.count(), name="count")
    ssc.start()
    for t in (11_000, 12_000, 13_000):
        clock.set_time(t)
        recorder.wait_for_batch(t)
    ssc.stop()

    assert main(["checkpoints", "list", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "released" in listing
    assert "1970-01-01T00:00:12.000Z" in listing and "1970-01-01T00:00:10.000Z" in listing
    assert listing.splitlines()[-1] == ("pending: batches generated but not yet committed when the checkpoint was "
                                        "written; a restart from it runs them again")

    assert main(["checkpoints", "inspect", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoint"]["time"] == 12_000
    assert report["checkpoint"]["inputs"]["events"]["next_index"] >= 20
    assert report["checkpoint"]["outputs"] == ["count"]
    assert report["batches_logged_after_it"][0]["time"] == 13_000
    assert report["batches_logged_after_it"][0]["committed"] is True


def test_an_empty_location_says_so(tmp_path, capsys):
    assert main(["checkpoints", "list", str(tmp_path)]) == 1
    assert "No valid checkpoint" in capsys.readouterr().out
