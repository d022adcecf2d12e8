"""The dashboard of a running pipeline in a real browser (SPEC I2): Debian's headless Chromium,
driven by chromedriver through Selenium, loads the page; the timeline shows the batches that
ran and grows while the test waits. A screenshot goes to the test's temporary directory (and,
with BATCHLINE_DASHBOARD_SCREENSHOT=path, there too: how docs/dashboard.png is made)."""

from __future__ import annotations

import os
import shutil

from selenium.webdriver.common.by import By

from batchline import StreamingContext
from batchline.observe.dashboard import DashboardServer
from batchline.state import GroupStateTimeout
from tests.helpers import Count, session_fn, wait_for
from tests.unit.test_dashboard_server import make_snapshot


def _rows(browser) -> list[int]:
    """The batch times the table shows, read in one step (the page redraws rows as batches come)."""
    return [int(t) for t in browser.execute_script(
        "return Array.from(document.querySelectorAll('#batches tr.batch-row')).map(r => r.dataset.batchTime)")]


def _wait(predicate, timeout: float, what: str):
    return wait_for(predicate, what, timeout, 0.2)


def test_the_dashboard_shows_the_batches_live_in_a_real_browser(spark, chromium, tmp_path):
    ssc = StreamingContext(spark, "500ms", checkpoint=str(tmp_path / "checkpoint"), dashboard_port=0,
                           name="dashboard-test")
    events = ssc.generator_stream(1000, users=50, name="events")
    sessions = events.group_by_key("id").flat_map_groups_with_state(
        session_fn, state_schema=Count, output_schema="key long, count long", name="sessions",
        num_partitions=2, timeout=GroupStateTimeout.PROCESSING_TIME)
    sessions.foreach_batch(lambda df, t: df.count(), name="closed")
    ssc.start()
    try:
        url = ssc.dashboard_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        chromium.get(url)
        first = _wait(lambda: len(rows := _rows(chromium)) >= 3 and rows, 60, "three batches on the page")
        # Every row is a batch that ran, newest first.
        ran = {p.batch_time for p in ssc.recent_progress}
        assert set(first) <= ran and first == sorted(first, reverse=True)
        later = _wait(lambda: len(rows := _rows(chromium)) >= len(first) + 3 and rows, 30, "the timeline to grow")
        assert later[0] > first[0]
        assert chromium.find_element(By.ID, "pipeline-state").get_attribute("data-state") == "active"
        charts = chromium.find_elements(By.CSS_SELECTOR, "#timeline svg")
        assert len(charts) >= 4  # input rate, scheduling delay, processing time, total delay
        operators = chromium.find_element(By.ID, "operators").text
        assert "sessions" in operators
        inputs = chromium.find_element(By.ID, "inputs")
        assert inputs.find_element(By.CSS_SELECTOR, "tr.input-row[data-input='events']")
        shot = tmp_path / "dashboard.png"
        assert chromium.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if target := os.environ.get("BATCHLINE_DASHBOARD_SCREENSHOT"):
            shutil.copy(shot, target)
    finally:
        ssc.stop()


def test_bound_off_loopback_the_dashboard_opened_with_its_token_renders_and_keeps_polling(chromium):
    """The page's script, style sheet and snapshot fetches carry no token of their own: the
    cookie the page got when opened with ``?token=`` lets them in, poll after poll."""
    full = make_snapshot(8)
    served: list[int] = []

    def growing() -> dict:
        served.append(1)
        return {"status": full["status"], "progress": full["progress"][: min(len(served) + 2, 8)]}

    with DashboardServer(growing, host="0.0.0.0") as server:
        assert server.token is not None
        local = f"http://127.0.0.1:{server.port}/"
        chromium.get(local)  # no token: refused, and the answer says how to pass one
        assert "needs its access token" in chromium.find_element(By.TAG_NAME, "body").text
        assert not served

        chromium.get(f"{local}?token={server.token}")
        first = _wait(lambda: len(rows := _rows(chromium)) >= 3 and rows, 30, "three batches on the page")
        later = _wait(lambda: len(rows := _rows(chromium)) >= 8 and rows, 30, "the polled batches to grow")
        assert later[0] > first[0] and len(served) >= 6
        assert chromium.find_element(By.ID, "pipeline-state").get_attribute("data-state") == "active"
        assert chromium.find_elements(By.CSS_SELECTOR, "#timeline svg")  # the script ran: it draws the charts
