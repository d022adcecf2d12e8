"""Who may read a pipeline's dashboard and metrics (issue 34): the servers a pipeline starts
share one token off loopback, require none on loopback unless one is given, say where the token
is at start, and take it from ``StreamingContext``'s arguments or ``batchline run``'s options.
Real HTTP servers, no Spark."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from batchline.api.launch import LaunchDefaults, launch_defaults, set_launch_defaults
from batchline.api.settings import FROM_LAUNCH, ContextSettings
from batchline.cli.main import main
from batchline.errors import ConfigurationError
from batchline.observe.access import with_token
from batchline.observe.observers import ObserveSettings, PipelineObservers
from batchline.scheduler.listener import ListenerBus

GIVEN = "given-token-0123456789abcdef"


def status_of(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        with error:
            return error.code


@pytest.fixture
def observers():
    started: list[PipelineObservers] = []

    def start(**settings: object) -> PipelineObservers:
        observer = PipelineObservers("orders", ObserveSettings(**settings), ListenerBus(),  # type: ignore[arg-type]
                                     lambda: {"status": {}, "progress": []})
        started.append(observer)
        observer.start(None)
        return observer

    yield start
    for observer in started:
        observer.stop()


def test_off_loopback_both_servers_share_one_made_token_shown_at_start(observers):
    run = observers(metrics_port=0, metrics_host="0.0.0.0", dashboard_port=0, dashboard_host="0.0.0.0")
    token = run.access_token
    assert token is not None
    assert run.dashboard is not None and run.metrics is not None
    assert run.dashboard.token == run.metrics.token == token
    for url in (run.dashboard_url, f"{run.dashboard_url}api/snapshot", run.metrics_url):
        assert status_of(url) == 401, url
        assert status_of(url, token) == 200, url
        assert status_of(with_token(url, token)) == 200, url
    shown = run.addresses()
    assert shown[0].startswith(f"dashboard {run.dashboard_url}?token={token} ")
    assert shown[1].startswith(f"metrics {run.metrics_url}?token={token} ")


def test_only_the_server_off_loopback_requires_the_made_token(observers):
    run = observers(metrics_port=0, metrics_host="0.0.0.0", dashboard_port=0)
    assert run.dashboard is not None and run.dashboard.token is None
    assert run.metrics is not None and run.metrics.token is not None
    assert run.access_token == run.metrics.token
    assert status_of(f"{run.dashboard_url}api/snapshot") == 200
    assert status_of(run.metrics_url) == 401
    assert run.addresses() == [f"dashboard {run.dashboard_url}",
                               f"metrics {run.metrics_url}?token={run.metrics.token} (the token is required: off "
                               "loopback)"]


def test_on_loopback_nothing_is_required_by_default(observers):
    run = observers(metrics_port=0, dashboard_port=0)
    assert run.access_token is None
    assert status_of(f"{run.dashboard_url}api/snapshot") == 200 and status_of(run.metrics_url) == 200
    assert run.addresses() == [f"dashboard {run.dashboard_url}", f"metrics {run.metrics_url}"]


def test_a_given_token_is_required_everywhere_and_not_repeated_at_start(observers):
    run = observers(metrics_port=0, dashboard_port=0, dashboard_host="0.0.0.0", access_token=GIVEN)
    assert run.access_token == GIVEN
    for url in (f"{run.dashboard_url}api/snapshot", run.metrics_url):
        assert status_of(url) == 401 and status_of(url, GIVEN) == 200, url
    assert all(GIVEN not in line and line.endswith("(with the access token given)") for line in run.addresses())


def test_an_unusable_token_is_refused_in_the_settings():
    with pytest.raises(ConfigurationError, match="access_token must be at least 16 characters"):
        ObserveSettings(access_token="hunter2")


@pytest.fixture
def launch():
    before = launch_defaults()
    yield
    set_launch_defaults(before)


def _settings(**observe: object) -> ContextSettings:
    arguments: dict[str, object] = dict(metrics_port=FROM_LAUNCH, metrics_host=FROM_LAUNCH, dashboard_port=FROM_LAUNCH,
                                        dashboard_host=FROM_LAUNCH, access_token=FROM_LAUNCH)
    arguments.update(observe)
    return ContextSettings.of("1s", concurrent_jobs=1, graceful_stop_timeout=None, checkpoint=None,
                              checkpoint_interval=None, keep_checkpoints=1, checkpoint_storage_options=None,
                              lease_ttl="15s", retry=None, max_batches_ahead=None, progress_records=10,
                              keep_workers_warm=False, **arguments)  # type: ignore[arg-type]


def test_batchline_run_sets_the_host_and_token_of_contexts_that_set_none(launch, tmp_path, monkeypatch):
    script = tmp_path / "pipeline.py"
    script.write_text("")
    monkeypatch.delenv("BATCHLINE_ACCESS_TOKEN", raising=False)
    assert main(["run", "--host", "0.0.0.0", "--access-token", GIVEN, "--no-dashboard", "--no-metrics",
                 str(script)]) == 0
    assert (launch_defaults().host, launch_defaults().access_token) == ("0.0.0.0", GIVEN)
    observe = _settings().observe
    assert (observe.dashboard_host, observe.metrics_host, observe.access_token) == ("0.0.0.0", "0.0.0.0", GIVEN)
    # A context's own settings win.
    observe = _settings(dashboard_host="127.0.0.1", access_token=None).observe
    assert (observe.dashboard_host, observe.metrics_host, observe.access_token) == ("127.0.0.1", "0.0.0.0", None)

    monkeypatch.setenv("BATCHLINE_ACCESS_TOKEN", "from-the-environment-0123456789")
    assert main(["run", "--no-dashboard", "--no-metrics", str(script)]) == 0
    assert (launch_defaults().host, launch_defaults().access_token) == ("127.0.0.1", "from-the-environment-0123456789")


def test_without_batchline_run_contexts_bind_to_loopback_with_no_token(launch):
    set_launch_defaults(LaunchDefaults())
    observe = _settings().observe
    assert (observe.dashboard_host, observe.metrics_host, observe.access_token) == ("127.0.0.1", "127.0.0.1", None)


def test_batchline_run_refuses_an_unusable_token_naming_the_option(launch, tmp_path, capsys, monkeypatch):
    script = tmp_path / "pipeline.py"
    script.write_text("raise SystemExit('the script must not run')")
    monkeypatch.setenv("BATCHLINE_ACCESS_TOKEN", "short")
    assert main(["run", str(script)]) == 1
    assert "--access-token (or $BATCHLINE_ACCESS_TOKEN) must be at least 16 characters" in capsys.readouterr().err
