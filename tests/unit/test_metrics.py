"""PipelineMetrics: progress records in, Prometheus text out over a real HTTP server (no Spark)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchline.observe.metrics import PipelineMetrics
from batchline.scheduler.progress import (
    COMPLETED,
    FAILED,
    BatchProgress,
    CheckpointProgress,
    ExcludedExecutor,
    InputProgress,
    JobTiming,
    PhaseDurations,
    StateOperatorProgress,
)

T0 = 1_700_000_000_000
INTERVAL = 10_000


def _op(operator: str, *, input_rows: int, late: int, timed_out: int, out: int, keys: int, size: int,
        watermark_ms: int | None) -> StateOperatorProgress:
    return StateOperatorProgress(operator=operator, input_rows=input_rows, late_rows=late, keys_called=input_rows,
                                 updated=input_rows - late, removed=timed_out, timed_out=timed_out, output_rows=out,
                                 state_keys=keys, watermark_ms=watermark_ms, state_bytes=size)


RECORDS = (
    BatchProgress(
        batch_time=T0, status=COMPLETED, submission_time_ms=T0 + 5, processing_start_ms=T0 + 20,
        processing_end_ms=T0 + 1_520, batch_interval_ms=INTERVAL, attempts=1,
        inputs=(InputProgress("orders", records=100, dead_letters=2, late_records=3, input_rate=10.0,
                              processing_rate=66.7),
                InputProgress("clicks", records=50, input_rate=5.0, processing_rate=33.3)),
        state_operators=(_op("sessions", input_rows=150, late=3, timed_out=1, out=12, keys=40, size=4_000,
                             watermark_ms=T0 - 60_000),),
        durations=PhaseDurations(generation_ms=4, jobs=(
            JobTiming("read", "read", T0 + 20, 120),
            JobTiming("sessions", "state", T0 + 140, 800),
            JobTiming("sink", "output", T0 + 940, 300),
        ), commit_ms=30),
        watermark_ms=T0 - 60_000, backlog=0,
    ),
    BatchProgress(
        batch_time=T0 + INTERVAL, status=COMPLETED, submission_time_ms=T0 + INTERVAL + 3,
        processing_start_ms=T0 + INTERVAL + 40, processing_end_ms=T0 + INTERVAL + 7_040,
        batch_interval_ms=INTERVAL, attempts=2,
        inputs=(InputProgress("orders", records=30, dead_letters=1, late_records=4, input_rate=3.0,
                              processing_rate=4.3),
                InputProgress("clicks", records=20, input_rate=2.0, processing_rate=2.9)),
        state_operators=(_op("sessions", input_rows=50, late=4, timed_out=5, out=7, keys=36, size=3_600,
                             watermark_ms=T0 - 50_000),),
        durations=PhaseDurations(jobs=(
            JobTiming("read", "read", T0 + INTERVAL + 40, 200),
            JobTiming("sessions", "state", T0 + INTERVAL + 240, 6_000),
        ), checkpoint_ms=1_500),
        checkpoints=(CheckpointProgress(time=T0, duration_ms=1_500, bytes=123_456),),
        watermark_ms=T0 - 50_000, backlog=1,
        excluded_executors=(ExcludedExecutor("3", "worker-a", T0 + INTERVAL + 7_040),),
        errors=("TaskFailed: boom",),
    ),
    BatchProgress(
        batch_time=T0 + 2 * INTERVAL, status=FAILED, submission_time_ms=T0 + 2 * INTERVAL + 2,
        processing_start_ms=T0 + 2 * INTERVAL + 60, processing_end_ms=T0 + 2 * INTERVAL + 400_060,
        batch_interval_ms=INTERVAL, attempts=3,
        inputs=(InputProgress("orders", records=999, dead_letters=9, late_records=9, input_rate=99.0),),
        state_operators=(_op("sessions", input_rows=999, late=9, timed_out=9, out=9, keys=999, size=9,
                             watermark_ms=None),),
        durations=PhaseDurations(jobs=(JobTiming("read", "read", T0 + 2 * INTERVAL + 60, 400_000),)),
        watermark_ms=None, backlog=2,
        excluded_executors=(ExcludedExecutor("3", "worker-a", T0 + INTERVAL + 7_040),
                            ExcludedExecutor("4", "worker-b", T0 + 2 * INTERVAL + 400_060)),
        errors=("TaskFailed: boom", "TaskFailed: boom", "TaskFailed: boom again"),
    ),
)
COMPLETED_RECORDS = [r for r in RECORDS if r.status == COMPLETED]


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, metric: str, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


@pytest.fixture
def metrics():
    m = PipelineMetrics("orders-pipeline")
    yield m
    m.stop_server()


def test_scraped_values_equal_the_records(metrics):
    for record in RECORDS:
        metrics.observe(record)
    metrics.start_server(0)
    assert metrics.port and metrics.url == f"http://127.0.0.1:{metrics.port}/metrics"
    s = scrape(metrics.url)
    last, last_completed = RECORDS[-1], COMPLETED_RECORDS[-1]

    assert value(s, "batchline_pipeline_info", pipeline="orders-pipeline") == 1
    # batches
    assert value(s, "batchline_batches_total", status="completed") == 2
    assert value(s, "batchline_batches_total", status="failed") == 1
    assert value(s, "batchline_batch_retries_total") == sum(r.attempts - 1 for r in RECORDS) == 3
    assert value(s, "batchline_scheduling_delay_seconds") == last.scheduling_delay_ms / 1000
    assert value(s, "batchline_processing_time_seconds") == last.processing_ms / 1000
    assert value(s, "batchline_total_delay_seconds") == last.total_delay_ms / 1000
    assert value(s, "batchline_backlog_batches") == 2
    assert value(s, "batchline_excluded_executors") == 2
    assert value(s, "batchline_last_batch_time_seconds") == last.batch_time / 1000
    # the failed batch had no watermark: the gauge keeps the last one seen
    assert value(s, "batchline_watermark_seconds") == (T0 - 50_000) / 1000

    # inputs: completed batches only (a failed batch runs again at the next start)
    for name in ("orders", "clicks"):
        ins = [i for r in COMPLETED_RECORDS for i in r.inputs if i.name == name]
        assert value(s, "batchline_input_records_total", input=name) == sum(i.records for i in ins)
        assert value(s, "batchline_dead_letters_total", input=name) == sum(i.dead_letters for i in ins)
        assert value(s, "batchline_late_records_total", input=name) == sum(i.late_records for i in ins)
        assert value(s, "batchline_input_rate", input=name) == ins[-1].input_rate
        assert value(s, "batchline_processing_rate", input=name) == ins[-1].processing_rate
    assert value(s, "batchline_input_records_total", input="orders") == 130

    # state
    ops = [op for r in COMPLETED_RECORDS for op in r.state_operators]
    assert value(s, "batchline_state_late_rows_total", operator="sessions") == sum(o.late_rows for o in ops) == 7
    assert value(s, "batchline_state_timed_out_keys_total", operator="sessions") == sum(o.timed_out for o in ops)
    assert value(s, "batchline_state_output_rows_total", operator="sessions") == sum(o.output_rows for o in ops)
    assert value(s, "batchline_state_input_rows_total", operator="sessions") == sum(o.input_rows for o in ops)
    assert value(s, "batchline_state_keys", operator="sessions") == last_completed.state_operators[0].state_keys
    assert value(s, "batchline_state_bytes", operator="sessions") == last_completed.state_operators[0].state_bytes
    assert value(s, "batchline_state_watermark_seconds", operator="sessions") == (T0 - 50_000) / 1000

    # histograms
    processing = [r.processing_ms / 1000 for r in RECORDS]
    assert value(s, "batchline_batch_duration_seconds_count") == len(RECORDS)
    assert value(s, "batchline_batch_duration_seconds_sum") == pytest.approx(sum(processing))
    assert value(s, "batchline_batch_duration_seconds_bucket", le="+Inf") == 3
    assert value(s, "batchline_batch_duration_seconds_bucket", le="300.0") == 2  # the failed batch took 400 s
    assert value(s, "batchline_batch_duration_seconds_bucket", le="0.01") == 0
    jobs = [j for r in RECORDS for j in r.durations.jobs]
    for kind, name in {(j.kind, j.name) for j in jobs}:
        of_job = [j.duration_ms / 1000 for j in jobs if (j.kind, j.name) == (kind, name)]
        assert value(s, "batchline_job_duration_seconds_count", kind=kind, name=name) == len(of_job)
        assert value(s, "batchline_job_duration_seconds_sum", kind=kind, name=name) == pytest.approx(sum(of_job))
    assert sum(value(s, "batchline_job_duration_seconds_count", kind="read", name=name)
               for name in {j.name for j in jobs if j.kind == "read"}) == 3

    # checkpoints
    assert value(s, "batchline_checkpoints_total") == 1
    assert value(s, "batchline_checkpoint_duration_seconds_count") == 1
    assert value(s, "batchline_checkpoint_duration_seconds_sum") == 1.5
    assert value(s, "batchline_checkpoint_duration_seconds_bucket", le="1.0") == 0
    assert value(s, "batchline_checkpoint_duration_seconds_bucket", le="2.5") == 1
    assert value(s, "batchline_checkpoint_bytes") == 123_456


def test_no_watermark_no_watermark_metric(metrics):
    assert "batchline_watermark_seconds" not in metrics.render()
    metrics.observe(RECORDS[-1])  # no watermark
    text = metrics.render()
    assert "batchline_watermark_seconds" not in text
    assert 'batchline_batches_total{status="failed"} 1.0' in text
    assert "batchline_input_records_total{" not in text  # the failed batch's records are not counted


def test_names_follow_the_conventions(metrics):
    for record in RECORDS:
        metrics.observe(record)
    for family in text_string_to_metric_families(metrics.render()):
        assert family.name.startswith("batchline_")
        assert not family.name.endswith(("_ms", "_milliseconds"))


def test_serves_on_loopback_only_by_default(metrics):
    metrics.start_server(0)
    assert metrics._server is not None
    assert metrics._server.server_address[0] == "127.0.0.1"
    assert metrics.url.startswith("http://127.0.0.1:")
    assert scrape(metrics.url)[("batchline_pipeline_info", frozenset({("pipeline", "orders-pipeline")}))] == 1
    with pytest.raises(RuntimeError, match="already served"):
        metrics.start_server(0)


def refused(url: str, headers: dict[str, str] | None = None) -> str:
    """The body of a 401 for ``url`` (fails on any other answer)."""
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10)
    with raised.value as error:
        assert error.code == 401, error.code
        assert error.headers["WWW-Authenticate"] == 'Bearer realm="batchline"'
        return error.read().decode()


def test_off_loopback_scrapes_need_the_token(metrics):
    metrics.observe(RECORDS[0])
    metrics.start_server(0, "0.0.0.0")  # every interface; scraped through 127.0.0.1
    token = metrics.token
    assert token is not None and len(token) >= 32
    assert metrics.url == f"http://127.0.0.1:{metrics.port}/metrics"
    assert metrics.open_url == f"{metrics.url}?token={token}"
    for path in ("/metrics", "/", "/metrics?name[]=batchline_pipeline_info", "/favicon.ico"):
        body = refused(f"http://127.0.0.1:{metrics.port}{path}")
        assert "Authorization: Bearer TOKEN" in body and "?token=TOKEN" in body and token not in body
    # What Prometheus sends with `authorization: {credentials: TOKEN}`:
    samples = scrape(metrics.url, {"Authorization": f"Bearer {token}"})
    assert value(samples, "batchline_batches_total", status="completed") == 1
    assert value(scrape(metrics.open_url), "batchline_pipeline_info", pipeline="orders-pipeline") == 1
    for headers, query in (({"Authorization": "Bearer wrong-token-0123456789abcdef"}, ""),
                           ({"Authorization": f"Basic {token}"}, ""),
                           ({}, f"?token={token[:-1]}"),
                           ({}, "?token="),
                           ({"Cookie": f"batchline_token_{metrics.port}={token}"}, "")):  # the dashboard's way only
        refused(metrics.url + query, headers)


def test_on_loopback_a_token_is_required_only_when_given(metrics):
    metrics.start_server(0)
    assert metrics.token is None and metrics.open_url == metrics.url
    scrape(metrics.url)
    metrics.stop_server()
    assert metrics.token is None
    metrics.start_server(0, token="given-token-0123456789abcdef")
    assert metrics.token == "given-token-0123456789abcdef"
    refused(metrics.url)
    refused(metrics.url, {"Authorization": "Bearer given-token-0123456789abcde"})
    scrape(metrics.url, {"Authorization": "Bearer given-token-0123456789abcdef"})
    scrape(f"{metrics.url}?token=given-token-0123456789abcdef")


def test_two_pipelines_in_one_process_do_not_clash():
    a, b = PipelineMetrics("a"), PipelineMetrics("b")
    try:
        a.observe(RECORDS[0])
        a.start_server(0)
        b.start_server(0)
        assert a.port != b.port
        sa, sb = scrape(a.url), scrape(b.url)
        assert value(sa, "batchline_pipeline_info", pipeline="a") == 1
        assert value(sb, "batchline_pipeline_info", pipeline="b") == 1
        assert ("batchline_pipeline_info", frozenset({("pipeline", "a")})) not in sb
        assert value(sa, "batchline_batches_total", status="completed") == 1
        assert ("batchline_batches_total", frozenset({("status", "completed")})) not in sb
        assert value(sb, "batchline_batch_duration_seconds_count") == 0
    finally:
        a.stop_server()
        b.stop_server()


def test_stop_is_idempotent_and_frees_the_port(metrics):
    metrics.stop_server()  # never started
    metrics.start_server(0)
    url = metrics.url
    scrape(url)
    metrics.stop_server()
    assert metrics.url is None and metrics.port is None
    metrics.stop_server()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
    metrics.start_server(0)  # and it starts again
    scrape(metrics.url)


def test_observe_is_thread_safe(metrics):
    import threading

    record = RECORDS[0]
    threads = [threading.Thread(target=lambda: [metrics.observe(record) for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = {(x.name, frozenset(x.labels.items())): x.value
         for f in text_string_to_metric_families(metrics.render()) for x in f.samples}
    assert value(s, "batchline_batches_total", status="completed") == 800
    assert value(s, "batchline_input_records_total", input="orders") == 800 * 100
    assert value(s, "batchline_batch_duration_seconds_count") == 800
