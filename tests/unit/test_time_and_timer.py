"""Clock, durations, recurring timer and event loop, on a manual clock: no sleeping."""

import datetime as dt
import threading

import pytest

from batchline.batch_time import BatchTime
from batchline.clock import ManualClock
from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError
from batchline.scheduler.event_loop import EventLoop
from batchline.scheduler.timer import RecurringTimer
from batchline.testing import wait_for


@pytest.mark.parametrize(
    ("value", "ms"),
    [("1s", 1000), ("500ms", 500), ("2 minutes", 120_000), ("1.5s", 1500), (2, 2000),
     (0.25, 250), (dt.timedelta(seconds=3), 3000), ("1 hour", 3_600_000)],
)
def test_durations_parse(value, ms):
    assert parse_duration_ms(value) == ms


@pytest.mark.parametrize("value", ["0s", "-1s", "soon", "1 fortnight", 0, -5, None, True, "0.5ms"])
def test_bad_durations_are_refused_with_a_hint(value):
    with pytest.raises(ConfigurationError, match="batch interval"):
        parse_duration_ms(value, "batch interval")


_DAY = 86_400_000


@pytest.mark.parametrize(
    ("value", "ms"),
    [("1 year", 12 * 31 * _DAY), ("2 years 5 months", 29 * 31 * _DAY), ("interval '3' day", 3 * _DAY),
     ("interval '1' day '2' hours", 26 * 3_600_000), ("interval '1 2:3:4' day to second", 93_784_000),
     ("interval '1-2' year to month", 14 * 31 * _DAY), ("interval '1 2' day to hour", 26 * 3_600_000),
     ("interval '2:30' hour to minute", 9_000_000), ("interval '1:2.5' minute to second", 62_500)],
)
def test_years_quoted_numbers_and_ansi_intervals_parse_as_spark_counts_them(value, ms):
    assert parse_duration_ms(value) == ms


@pytest.mark.parametrize("value", ["interval '1 2:3:4' day to hour", "interval '1 2' year to month",
                                   "interval '1-2' month to year", "intrval '3' day", "interval '5' foo"])
def test_ansi_intervals_whose_fields_do_not_fit_their_units_are_refused(value):
    with pytest.raises(ConfigurationError, match="day to second"):
        parse_duration_ms(value, "delay")


def test_batch_time_is_a_stable_int_id_with_a_readable_form():
    t = BatchTime(1_700_000_001_000)
    assert t == 1_700_000_001_000 and hash(t) == hash(1_700_000_001_000)
    assert str(t) == "2023-11-14T22:13:21.000Z"
    assert t.datetime.tzinfo is dt.UTC


class Fired:
    def __init__(self):
        self.times = []
        self.changed = threading.Condition()

    def __call__(self, t):
        with self.changed:
            self.times.append(t)
            self.changed.notify_all()

    def wait_count(self, n):
        wait_for(lambda: len(self.times) >= n, self.changed, 10, f"{n} timer callbacks")


def test_timer_start_time_is_the_next_multiple_after_now():
    clock = ManualClock(10_250)
    timer = RecurringTimer(clock, 1000, lambda t: None, "test")
    assert timer.get_start_time() == 11_000
    clock.set_time(11_000)
    assert timer.get_start_time() == 12_000  # strictly after now


def test_timer_fires_every_period_on_the_grid_and_stop_interrupts():
    clock = ManualClock(10_250)
    fired = Fired()
    timer = RecurringTimer(clock, 1000, fired, "test")
    timer.start(timer.get_start_time())
    clock.advance(750)  # 11_000
    fired.wait_count(1)
    clock.advance(2000)  # 13_000: two more periods passed
    fired.wait_count(3)
    assert fired.times == [11_000, 12_000, 13_000]
    assert timer.stop(interrupt=True) == 13_000
    clock.advance(5000)
    assert fired.times == [11_000, 12_000, 13_000]
    assert not timer.is_running


def test_timer_graceful_stop_fires_the_pending_time_once():
    clock = ManualClock(0)
    fired = Fired()
    timer = RecurringTimer(clock, 100, fired, "test")
    timer.start(100)
    clock.advance(100)
    fired.wait_count(1)
    result = {}
    stopper = threading.Thread(target=lambda: result.setdefault("last", timer.stop(interrupt=False)))
    stopper.start()
    clock.advance(100)  # the timer was waiting for 200: it fires it, then stops
    stopper.join(10)
    assert result["last"] == 200
    clock.advance(1000)
    assert fired.times == [100, 200]


def test_manual_clock_never_goes_back():
    clock = ManualClock(5)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="forward"):
        clock.set_time(4)


def test_event_loop_handles_events_in_order_on_one_thread_and_reports_errors():
    seen, threads, errors = [], set(), []
    done = threading.Condition()

    def on_receive(event):
        threads.add(threading.current_thread().name)
        if event == "boom":
            raise RuntimeError("boom")
        with done:
            seen.append(event)
            done.notify_all()

    loop = EventLoop("test-loop", on_receive, errors.append)
    loop.start()
    for event in [1, 2, "boom", 3, 4]:
        loop.post(event)
    wait_for(lambda: len(seen) == 4, done, 10, "events")
    loop.stop()
    loop.post(5)  # dropped after stop
    assert seen == [1, 2, 3, 4]
    assert threads == {"test-loop"}
    assert [str(e) for e in errors] == ["boom"]
    assert not loop.is_active
