"""The dashboard's HTTP server, without Spark and without a browser: what it serves, what it
refuses, how it survives a failing snapshot, where it listens and how it stops."""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import urllib.error
import urllib.request

import pytest

from batchline.errors import ConfigurationError
from batchline.observe.dashboard import DashboardServer
from batchline.scheduler.progress import (
    BatchProgress,
    CheckpointProgress,
    ExcludedExecutor,
    InputProgress,
    PhaseDurations,
    StateOperatorProgress,
)
from tests.helpers import ROOT

STATIC = ROOT / "batchline" / "observe" / "static"
INTERVAL = 1000
T0 = 1_760_000_000_000


def progress_records(count: int = 5) -> list[dict]:
    records = []
    for i in range(count):
        batch_time = T0 + i * INTERVAL
        failed = i == count - 1
        records.append(BatchProgress(
            batch_time=batch_time,
            status="failed" if failed else "completed",
            submission_time_ms=batch_time + 1,
            processing_start_ms=batch_time + 5,
            processing_end_ms=None if failed else batch_time + 400,
            batch_interval_ms=INTERVAL,
            attempts=3 if failed else 1,
            inputs=(InputProgress("clicks", 100 + i, dead_letters=i % 2, input_rate=100.0 + i),
                    InputProgress("catalog", 0, finished=True)),
            state_operators=(StateOperatorProgress("sessions", 100 + i, 0, 50, 40, 2, 1, 30, 1000 + i,
                                                   batch_time - 5000, state_bytes=64_000 + i),),
            durations=PhaseDurations(generation_ms=3, commit_ms=4, checkpoint_ms=20 if i == 2 else None),
            checkpoints=(CheckpointProgress(batch_time - INTERVAL, 20, 4096),) if i == 2 else (),
            lease_holder="driver-1",
            lease_token=1,
            excluded_executors=(ExcludedExecutor("2", "worker-b", batch_time),) if i >= 3 else (),
            errors=("OSError: lost", "OSError: lost", "ValueError: <script>alert(1)</script>") if failed else (),
        ).to_json())
    return records


def make_snapshot(count: int = 5) -> dict:
    return {
        "status": {"name": "demo", "location": "/tmp/demo", "state": "active", "batch_interval_ms": INTERVAL,
                   "lease_holder": "driver-1", "started_at_ms": T0 - 60_000, "backlog": 0,
                   "excluded_executors": [{"executor_id": "2", "host": "worker-b", "since_ms": T0}],
                   "finished_inputs": ["catalog"], "finished": False},
        "progress": progress_records(count),
    }


@pytest.fixture
def snapshot():
    return make_snapshot()


@pytest.fixture
def server(snapshot):
    dashboard = DashboardServer(lambda: snapshot)
    dashboard.start()
    yield dashboard
    dashboard.stop()


def get(url: str, headers: dict[str, str] | None = None):
    """(status, headers, body) of a GET; an HTTP error status is an answer too."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def raw_get(server: DashboardServer, path: str) -> int:
    """The status of a GET of ``path`` sent exactly as written (urllib leaves paths alone, but
    this makes sure no client normalizes a ``..``)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


# ---------------------------------------------------------------------- the page and its files
def test_serves_the_page(server):
    status, headers, body = get(server.url)
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Cache-Control"] == "no-store"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    page = body.decode()
    assert body == (STATIC / "index.html").read_bytes()
    for element_id in ("timeline", "batches", "operators", "checkpoints", "backlog", "errors",
                       "excluded-executors", "finished-inputs", "pipeline-state", "last-update"):
        assert f'id="{element_id}"' in page, element_id


@pytest.mark.parametrize(("name", "content_type"), [
    ("index.html", "text/html; charset=utf-8"),
    ("dashboard.js", "text/javascript; charset=utf-8"),
    ("dashboard.css", "text/css; charset=utf-8"),
    ("favicon.svg", "image/svg+xml"),
])
def test_serves_the_static_files(server, name, content_type):
    status, headers, body = get(f"{server.url}static/{name}")
    assert status == 200
    assert headers["Content-Type"] == content_type
    assert headers["Cache-Control"] == "no-store"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert int(headers["Content-Length"]) == len(body)
    assert body == (STATIC / name).read_bytes()


def test_the_page_loads_only_files_it_ships():
    page = (STATIC / "index.html").read_text()
    assert not re.search(r"https?://", page, re.IGNORECASE), "index.html names an outside URL (a CDN?)"
    assert "@import" not in (STATIC / "dashboard.css").read_text()
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert ref.startswith("/static/"), ref
        assert (STATIC / ref.removeprefix("/static/")).is_file(), ref
    # The script and the style sheet name no outside URL either (the SVG namespace is a name, not a fetch).
    for name in ("dashboard.js", "dashboard.css"):
        text = (STATIC / name).read_text().replace("http://www.w3.org/2000/svg", "")
        assert not re.search(r"https?://", text, re.IGNORECASE), name


def test_the_script_puts_data_in_the_page_only_as_text():
    script = (STATIC / "dashboard.js").read_text()
    assert "innerHTML" not in script and "outerHTML" not in script and "insertAdjacentHTML" not in script
    assert "document.write" not in script and "eval(" not in script
    assert 'fetch("/api/snapshot"' in script
    assert "batch-row" in script and '"data-batch-time"' in script


@pytest.mark.parametrize("path", [
    "/nope",
    "/index.htm",
    "/static/",
    "/static/nope.js",
    "/static/../dashboard.py",
    "/static/..%2Fdashboard.py",
    "/static/%2e%2e/dashboard.py",
    "/static/../../scheduler/progress.py",
    "/static//etc/passwd",
    "/static/static/index.html",
    "/../dashboard.py",
    "/api/snapshot/extra",
    "/api",
])
def test_anything_else_is_not_found(server, path):
    assert raw_get(server, path) == 404


def test_head_answers_without_a_body(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("HEAD", "/static/dashboard.js")
        response = connection.getresponse()
        assert response.status == 200
        assert int(response.getheader("Content-Length")) == len((STATIC / "dashboard.js").read_bytes())
        assert response.read() == b""
    finally:
        connection.close()


# ---------------------------------------------------------------------- the snapshot
def test_the_snapshot_is_the_json_of_snapshot(server, snapshot):
    status, headers, body = get(f"{server.url}api/snapshot")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    answer = json.loads(body)
    assert answer == json.loads(json.dumps(snapshot))
    assert [BatchProgress.from_json(p).batch_time for p in answer["progress"]] == [T0 + i * INTERVAL for i in range(5)]
    assert answer["progress"][0]["scheduling_delay_ms"] == 5
    assert answer["progress"][-1]["status"] == "failed"


def test_the_snapshot_is_taken_at_each_request(snapshot):
    taken = []

    def take():
        taken.append(len(taken))
        return {"status": snapshot["status"], "progress": snapshot["progress"][: len(taken)]}

    with DashboardServer(take) as server:
        for expected in (1, 2, 3):
            status, _, body = get(f"{server.url}api/snapshot?t={expected}")  # a query string does not matter
            assert status == 200
            assert len(json.loads(body)["progress"]) == expected
    assert len(taken) == 3


def test_a_failing_snapshot_answers_500_and_the_server_goes_on(snapshot, caplog):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the tracker is gone")
        if len(calls) == 2:
            return {"not json": object()}
        return snapshot

    with DashboardServer(flaky) as server, caplog.at_level(logging.ERROR, logger="batchline.observe.dashboard"):
        status, headers, body = get(f"{server.url}api/snapshot")
        assert status == 500
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body) == {"error": "RuntimeError: the tracker is gone"}

        status, _, body = get(f"{server.url}api/snapshot")  # not JSON-serializable: 500 too
        assert status == 500
        assert "TypeError" in json.loads(body)["error"]

        status, _, body = get(f"{server.url}api/snapshot")
        assert status == 200
        assert json.loads(body)["status"]["name"] == "demo"
        assert get(server.url)[0] == 200

    failures = [r for r in caplog.records if r.name == "batchline.observe.dashboard" and r.levelno == logging.ERROR]
    assert len(failures) == 2
    assert failures[0].exc_info is not None and "the tracker is gone" in str(failures[0].exc_info[1])


def test_requests_write_nothing_to_stderr(server, capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="batchline.observe.dashboard"):
        get(server.url)
        get(f"{server.url}nope")
    assert capfd.readouterr().err == ""
    assert any("GET / " in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


# ---------------------------------------------------------------------- where it listens
def test_binds_to_loopback_only_and_picks_a_free_port(server):
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/"
    assert server._server is not None
    assert server._server.socket.getsockname() == ("127.0.0.1", server.port)
    # From another address of this machine (when it has one), nothing listens on that port.
    other = _non_loopback_address()
    if other is not None:
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex((other, server.port)) != 0


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent, the kernel only picks a route
        except OSError:
            return None
        address = udp.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_given_port_is_used(snapshot):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with DashboardServer(lambda: snapshot, host="127.0.0.1", port=port) as server:
        assert server.port == port
        assert get(f"http://127.0.0.1:{port}/api/snapshot")[0] == 200


def test_answers_only_loopback_host_names(server):
    assert get(server.url, {"Host": f"localhost:{server.port}"})[0] == 200
    assert get(server.url, {"Host": f"127.0.0.1:{server.port}"})[0] == 200
    assert get(server.url, {"Host": "[::1]:8080"})[0] == 200
    # A page of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding):
    assert get(f"{server.url}api/snapshot", {"Host": f"attacker.example:{server.port}"})[0] == 403


def test_an_idle_connection_does_not_hold_up_others(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):  # connected, sends nothing
        assert get(f"{server.url}api/snapshot")[0] == 200


# ---------------------------------------------------------------------- stopping
def test_stop_is_idempotent_and_closes_the_port(snapshot):
    server = DashboardServer(lambda: snapshot)
    server.stop()  # before start: nothing to do
    server = DashboardServer(lambda: snapshot)
    server.start()
    url = server.url
    assert get(url)[0] == 200
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
    assert server._thread is not None and not server._thread.is_alive()
    with pytest.raises(RuntimeError):
        server.start()


def test_port_before_start_is_an_error(snapshot):
    with pytest.raises(RuntimeError):
        _ = DashboardServer(lambda: snapshot).port


# ---------------------------------------------------------------------- the access token
ALL_PATHS = ["/", "/index.html", "/static/dashboard.js", "/static/dashboard.css", "/api/snapshot",
             "/api/snapshot?t=1", "/nope"]
GIVEN = "given-token-0123456789abcdef"


@pytest.fixture
def open_server(snapshot):
    """Bound to every interface: other machines can reach it, so it requires a token (requests
    go through 127.0.0.1, the check is on the address it is bound to)."""
    with DashboardServer(lambda: snapshot, host="0.0.0.0") as dashboard:
        yield dashboard


def local(server: DashboardServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def test_off_loopback_a_token_is_made_and_shown_in_the_address_to_open(open_server):
    token = open_server.token
    assert token is not None and len(token) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert open_server.open_url == f"http://127.0.0.1:{open_server.port}/?token={token}"
    with DashboardServer(dict, host="0.0.0.0") as other:
        assert other.token is not None and other.token != token


@pytest.mark.parametrize("path", ALL_PATHS)
def test_off_loopback_every_path_without_the_token_is_401(open_server, path):
    status, headers, body = get(local(open_server, path))
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="batchline"'
    assert headers.get("Set-Cookie") is None
    text = body.decode()
    assert "Authorization: Bearer TOKEN" in text and "?token=TOKEN" in text and "start log line" in text
    assert open_server.token not in text
    assert raw_get(open_server, path) == 401


@pytest.mark.parametrize("path", ["/", "/static/dashboard.js", "/api/snapshot"])
def test_off_loopback_a_bearer_token_is_let_in(open_server, snapshot, path):
    status, headers, body = get(local(open_server, path), {"Authorization": f"Bearer {open_server.token}"})
    assert status == 200
    assert headers.get("Set-Cookie") is None  # a scraper needs no cookie
    if path == "/api/snapshot":
        assert json.loads(body) == json.loads(json.dumps(snapshot))
    status, _, _ = get(local(open_server, path), {"Authorization": f"bearer  {open_server.token} "})
    assert status == 200


def test_off_loopback_a_query_token_is_let_in_and_the_page_gets_a_cookie_for_its_own_requests(open_server, snapshot):
    token = open_server.token
    status, headers, body = get(open_server.open_url.replace(open_server.url, local(open_server, "/")))
    assert status == 200 and body == (STATIC / "index.html").read_bytes()
    cookie = headers["Set-Cookie"]
    name = f"batchline_token_{open_server.port}"
    assert cookie.startswith(f"{name}={token};")
    assert {part.strip() for part in cookie.split(";")[1:]} == {"Path=/", "HttpOnly", "SameSite=Strict"}
    status, _, body = get(local(open_server, f"/api/snapshot?token={token}"))
    assert status == 200 and json.loads(body)["status"]["name"] == "demo"
    # What the browser then sends with the page's script, style sheet and snapshot fetches:
    for path in ("/static/dashboard.js", "/static/dashboard.css", "/api/snapshot"):
        status, headers, _ = get(local(open_server, path), {"Cookie": f"other=1; {name}={token}"})
        assert status == 200, path
        assert headers.get("Set-Cookie") is None


@pytest.mark.parametrize("headers, query", [
    ({"Authorization": "Bearer wrong-token-0123456789abcdef"}, ""),
    ({"Authorization": "Bearer "}, ""),
    ({"Authorization": "Basic {token}"}, ""),  # the right token under another scheme
    ({"Authorization": "Bearer {token}x"}, ""),
    ({}, "?token=wrong-token-0123456789abcdef"),
    ({}, "?token="),
    ({}, "?token={prefix}"),
    ({"Cookie": "batchline_token_{port}=wrong"}, ""),
    ({"Cookie": "batchline_token_1={token}"}, ""),  # another port's dashboard's cookie
    ({"Cookie": "token={token}"}, ""),
    ({"Cookie": 'batchline_token_{port}="\\'}, ""),  # malformed
])
def test_off_loopback_a_wrong_token_is_401(open_server, headers, query):
    token, port = open_server.token, open_server.port
    fill = {"token": token, "prefix": token[:-1], "port": port}
    headers = {name: value.format(**fill) for name, value in headers.items()}
    for path in ("/", "/api/snapshot"):
        status, _, _ = get(local(open_server, path) + query.format(**fill), headers)
        assert status == 401, (path, headers, query)


def test_tokens_are_compared_in_constant_time(open_server, monkeypatch):
    import batchline.observe.access as access

    compared = []
    real = access.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(access.hmac, "compare_digest", spy)
    assert get(local(open_server, "/api/snapshot"), {"Authorization": "Bearer not-the-token-at-all"})[0] == 401
    assert get(local(open_server, "/api/snapshot"), {"Authorization": f"Bearer {open_server.token}"})[0] == 200
    assert (open_server.token.encode(), b"not-the-token-at-all") in compared
    assert (open_server.token.encode(), open_server.token.encode()) in compared


def test_on_the_machines_own_address_the_token_is_required(snapshot):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with DashboardServer(lambda: snapshot, host=address) as server:
        assert server.token is not None
        assert server.url == f"http://{address}:{server.port}/"
        assert get(f"{server.url}api/snapshot")[0] == 401
        assert get(f"{server.url}api/snapshot", {"Authorization": f"Bearer {server.token}"})[0] == 200
        assert get(server.open_url)[0] == 200


def test_on_loopback_no_token_is_required_by_default(server):
    assert server.token is None
    assert server.open_url == server.url
    for path in ALL_PATHS[:-1]:
        status, headers, _ = get(local(server, path))
        assert status == 200, path
        assert headers.get("Set-Cookie") is None
    # A token sent anyway changes nothing.
    assert get(local(server, "/api/snapshot?token=whatever"), {"Authorization": "Bearer whatever"})[0] == 200


def test_a_given_token_is_required_on_loopback_too(snapshot):
    with DashboardServer(lambda: snapshot, token=GIVEN) as server:
        assert server.token == GIVEN
        assert get(f"{server.url}api/snapshot")[0] == 401
        assert get(f"{server.url}api/snapshot", {"Authorization": f"Bearer {GIVEN}"})[0] == 200
        assert get(f"{server.url}?token={GIVEN}")[0] == 200
    with DashboardServer(lambda: snapshot, host="0.0.0.0", token=GIVEN) as server:
        assert server.token == GIVEN
        assert get(local(server, "/api/snapshot"), {"Authorization": f"Bearer {GIVEN}"})[0] == 200


@pytest.mark.parametrize("token", ["short", "", "has space in it 0123456789", "semi;colon-0123456789abc", 12345])
def test_an_unusable_token_is_refused_with_what_to_do(snapshot, token):
    with pytest.raises(ConfigurationError, match=r"at least 16 characters.*secrets.token_urlsafe"):
        DashboardServer(lambda: snapshot, token=token)  # type: ignore[arg-type]
