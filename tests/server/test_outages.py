"""Servers that vanish in the middle of a batch (SPEC E3): the S3 endpoint that holds the
checkpoint stops for 30 s and starts again (every storage operation keeps trying it, for up to
60 s); the Redis server a stream is read from is shut down and started again (the source
retries its connection). Each outage costs retries and nothing else: the output holds every
input row once, the running counts are exact, and the progress records count every input row
once. (PostgreSQL restarted mid-batch: tests/server/test_postgres_sink.py.)

The S3 endpoint is moto's server behind a TCP proxy (harness/tcp_proxy.py) that the test takes
down: the port closes and open connections drop, as a stopped server's do, while the objects
behind it stay (a restarted in-memory moto would have lost them).
"""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from urllib.parse import urlparse

import pyarrow.dataset as ds
import redis
from pyspark.sql import functions as F

from batchline import StreamingContext
from batchline.testing import BatchRecorder
from harness.servers import RedisServer
from harness.tcp_proxy import TcpProxy
from tests.helpers import poll_until

FILES, PER_FILE, KEYS = 12, 50, 7
OUTAGE_S = 30


def _write_inputs(incoming):
    incoming.mkdir()
    for f in range(FILES):
        rows = [{"id": f"f{f:02d}-r{r:02d}", "k": r % KEYS} for r in range(PER_FILE)]
        (incoming / f"events-{f:02d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def count_rows(key, rows, state):
    count = (state.get()[0] if state.exists else 0) + sum(1 for _ in rows)
    state.update((count,))
    yield (key[0] if isinstance(key, tuple) else key, count)


def _through(proxy: TcpProxy, options: dict) -> dict:
    return {**options, "client_kwargs": {**options["client_kwargs"], "endpoint_url": f"http://127.0.0.1:{proxy.port}"}}


def test_the_checkpoints_s3_endpoint_down_for_30_s_mid_batch_costs_retries_and_nothing_else(
        spark, s3_endpoint, tmp_path, caplog):
    target = urlparse(s3_endpoint["client_kwargs"]["endpoint_url"])
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80).start()
    try:
        incoming, out = tmp_path / "in", tmp_path / "out"
        _write_inputs(incoming)
        ssc = StreamingContext(spark, "1s", checkpoint=f"s3://batchline-test/outage-{uuid.uuid4().hex}/checkpoint",
                               checkpoint_storage_options=_through(proxy, s3_endpoint), metrics_port=None,
                               dashboard_port=None)
        recorder = BatchRecorder()
        ssc.add_listener(recorder)
        rows = ssc.file_stream(str(incoming), "json", "id string, k long", settle=0.0, max_files_per_batch=1,
                               bounded=True, name="events")
        rows.write_files(str(out / "rows"), name="rows")
        counts = rows.group_by_key("k").flat_map_groups_with_state(
            count_rows, state_schema="count long", output_schema="k long, count long", name="counts",
            num_partitions=2)
        counts.write_files(str(out / "counts"), name="counts")

        finished: list[bool] = []
        runner = threading.Thread(target=lambda: finished.append(ssc.run_until_finished(600)), daemon=True)
        runner.start()
        poll_until(lambda: len(recorder.completed) >= 3, timeout_s=120)
        proxy.down()
        time.sleep(OUTAGE_S)
        proxy.up()
        runner.join(600)
        assert finished == [True], "the pipeline did not finish after the outage"
    finally:
        proxy.stop()

    read = ds.dataset(str(out / "rows"), format="parquet").to_table().to_pylist()
    ids = collections.Counter(row["id"] for row in read)
    assert len(ids) == FILES * PER_FILE and set(ids.values()) == {1}, "rows lost or written twice"
    _counts_exact(out / "counts", "k", [r % KEYS for _ in range(FILES) for r in range(PER_FILE)])
    counted = sum(info.num_records for info in recorder.completed)
    assert counted == FILES * PER_FILE, f"the progress records count {counted} input rows"
    # The store's operations kept trying through the outage (a batch would be retried as well
    # after the storage's outage tolerance, 60 s).
    assert "Could not reach s3://batchline-test/outage-" in caplog.text, "the outage missed the pipeline"
    assert "Reached s3://batchline-test/outage-" in caplog.text


def _counts_exact(out, key, expected_rows):
    final = {}
    for row in sorted(ds.dataset(str(out), format="parquet").to_table().to_pylist(), key=lambda r: r["count"]):
        final[row[key]] = row["count"]
    assert final == collections.Counter(expected_rows)


def test_the_redis_server_of_a_stream_shut_down_and_started_mid_run_costs_retries_and_nothing_else(
        spark, tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = redis.Redis.from_url(server.url)
        entries = 300
        for i in range(entries):
            client.xadd("orders", {"user": f"u{i % 5}", "n": str(i)})
        out = tmp_path / "out"
        ssc = StreamingContext(spark, "1s", checkpoint=str(tmp_path / "checkpoint"), metrics_port=None,
                               dashboard_port=None)
        recorder = BatchRecorder()
        ssc.add_listener(recorder)
        orders = ssc.redis_stream(server.url, ["orders"], name="orders", max_records_per_batch=20, bounded=True)
        orders.select("id").write_files(str(out / "ids"), name="ids")
        users = orders.select(F.col("fields")["user"].alias("user"))
        users.group_by_key("user").flat_map_groups_with_state(
            count_rows, state_schema="count long", output_schema="user string, count long", name="counts",
            num_partitions=2).write_files(str(out / "counts"), name="counts")

        finished: list[bool] = []
        runner = threading.Thread(target=lambda: finished.append(ssc.run_until_finished(600)), daemon=True)
        runner.start()
        poll_until(lambda: len(recorder.completed) >= 3, timeout_s=120)
        before = len(recorder.completed)
        server.restart(down_s=10)
        runner.join(600)
        assert finished == [True], "the pipeline did not finish after the restart"
        assert before < entries // 20, "the pipeline had finished before the server went down"
    finally:
        server.stop()

    ids = collections.Counter(r["id"] for r in ds.dataset(str(out / "ids"), format="parquet").to_table().to_pylist())
    assert len(ids) == entries and set(ids.values()) == {1}, "entries lost or written twice"
    _counts_exact(out / "counts", "user", [f"u{i % 5}" for i in range(entries)])
    assert sum(info.num_records for info in recorder.completed) == entries
