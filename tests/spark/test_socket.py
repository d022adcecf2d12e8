"""Socket receiver end to end against a real TCP server in the test."""

import socket
import threading
import time

from batchline import StreamingContext
from batchline.testing import BatchRecorder, CollectSink
from tests.helpers import LineServer


def test_graceful_stop_processes_every_line_sent_before_it(spark):
    server = LineServer()
    # The stop's wait is not what this test is about: a cold first batch on a loaded machine
    # can take longer than the default ten intervals.
    ssc = StreamingContext(spark, "500ms", graceful_stop_timeout="60s")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    lines = ssc.socket_text_stream("127.0.0.1", server.port, block_interval="100ms")
    sink = CollectSink(sort=False)
    lines.foreach_batch(sink)
    ssc.start()
    sent = []
    try:
        for burst in range(5):
            chunk = [f"line-{burst}-{i}" for i in range(400)]
            server.send(chunk)
            sent += chunk
            time.sleep(0.15)  # spread the lines over several blocks and batches
        server.send(["the very last line"])
        sent.append("the very last line")
        ssc.stop(graceful=True)
    finally:
        server.close()
    received = [row["value"] for row in sink.all_rows()]
    assert len(received) == len(sent)
    assert sorted(received) == sorted(sent)
    assert received == sent  # one connection: lines keep their order across blocks and batches
    assert sum(info.num_records for info in recorder.completed) == len(sent)
    assert len([i for i in recorder.completed if i.num_records]) > 1


def test_immediate_stop_returns_promptly_while_data_keeps_coming(spark):
    server = LineServer()
    ssc = StreamingContext(spark, "500ms")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    ssc.socket_text_stream("127.0.0.1", server.port).foreach_batch(CollectSink())
    ssc.start()
    keep_sending = threading.Event()
    keep_sending.set()

    def flood():
        n = 0
        while keep_sending.is_set():
            try:
                server.send([f"x{n + i}" for i in range(100)])
            except OSError:
                return
            n += 100
            time.sleep(0.01)

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    try:
        recorder.wait_for_completed(2)
        began = time.monotonic()
        ssc.stop(graceful=False)
        took = time.monotonic() - began
    finally:
        keep_sending.clear()
        server.close()
    assert took < 5, f"immediate stop took {took:.1f} s"
    assert ssc.await_termination(0)


def test_the_receiver_keeps_retrying_until_a_server_appears(spark):
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens on this port yet
    ssc = StreamingContext(spark, "500ms")
    recorder = BatchRecorder()
    ssc.add_listener(recorder)
    sink = CollectSink()
    ssc.socket_text_stream("127.0.0.1", port).foreach_batch(sink)
    ssc.start()
    try:
        recorder.wait_for_completed(2)  # batches run (empty) while the connection is refused
        listener = socket.create_server(("127.0.0.1", port))
        listener.settimeout(30)
        conn, _ = listener.accept()
        conn.sendall(b"hello\nworld\n")
        sink.wait_for_rows(lambda rows: len(rows) == 2)
        conn.close()
        listener.close()
    finally:
        ssc.stop(graceful=True)
    assert sink.all_rows() == [{"value": "hello"}, {"value": "world"}]
