"""A schema field null in every row of a JSON or CSV input (the files spell it otherwise) is
named at WARN, once per input and field for the run."""

import json
import os

from batchline import StreamingContext
from batchline.testing import CollectSink
from tests.helpers import LogWatcher


def test_a_misspelt_field_is_named_once_and_a_field_with_a_value_never(spark, tmp_path):
    rows = {
        "a.json": [{"user": "u1", "name": None, "n": 1}, {"user": "u2", "name": "bo", "n": 2}],
        "b.json": [{"user": "u3", "name": None, "n": 3}],  # name had a value before: optional
        "c.json": [{"user": "u4", "n": 4}],
    }
    for name, lines in rows.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
        os.utime(tmp_path / name, (0, 0))
    ssc = StreamingContext(spark, "200ms")
    sink = CollectSink()
    ssc.file_stream(str(tmp_path), "json", "uid string, name string, n long", bounded=True, max_files_per_batch=1,
                    name="events").foreach_batch(sink)
    with LogWatcher() as log:
        assert ssc.run_until_finished(120)
    assert len([b for b in sink.batches.values() if b]) == 3  # three batches, each could warn
    warned = [m for m in log.messages(level=30) if "is null in every row" in m]
    assert warned == ["Input 'events': field 'uid' is null in every row of a.json; the files probably spell it "
                      "otherwise (their fields: user, name, n)"]
