"""GroupState semantics (SPEC D1) and the index of timeouts (SPEC D2)."""

import datetime as dt
from dataclasses import dataclass

import pytest

from batchline.errors import ConfigurationError
from batchline.state.group_state import (
    NO_TIMESTAMP,
    GroupState,
    GroupStateTimeout,
    NoStateError,
    TimeoutNotEnabledError,
)


@dataclass(frozen=True)
class Session:
    events: tuple[str, ...]


def state(value=None, timeout=GroupStateTimeout.PROCESSING_TIME, now=1_000_000, watermark=None, timed_out=False):
    return GroupState(value, timeout, processing_time_ms=now, watermark_ms=watermark, has_timed_out=timed_out)


def test_a_new_key_has_no_state_and_says_how_to_check():
    s = state()
    assert not s.exists and s.get_option() is None
    with pytest.raises(NoStateError, match="check state.exists first"):
        s.get()
    assert repr(s) == "GroupState(<no state>)"


def test_update_then_get_then_remove():
    s = state()
    s.update(Session(("a",)))
    assert s.exists and s.get() == Session(("a",)) and s.get_option() == Session(("a",))
    assert s.updated and not s.removed
    s.update(Session(("a", "b")))
    assert s.get().events == ("a", "b")
    s.remove()
    assert not s.exists and s.removed and not s.updated
    with pytest.raises(NoStateError):
        s.get()


def test_update_with_none_is_refused():
    s = state(Session(("a",)))
    with pytest.raises(ValueError, match=r"call state.remove\(\)"):
        s.update(None)
    assert s.get() == Session(("a",))  # unchanged


def test_existing_state_is_visible_and_untouched_until_changed():
    s = state(Session(("x",)))
    assert s.exists and s.get() == Session(("x",))
    assert not s.updated and not s.removed


@pytest.mark.parametrize(("duration", "deadline"), [("1 minute", 1_060_000), (5000, 1_005_000),
                                                    (dt.timedelta(seconds=2), 1_002_000), ("500ms", 1_000_500)])
def test_processing_time_timeout_is_relative_to_the_batch_time(duration, deadline):
    s = state()
    assert s.timeout_timestamp_ms == NO_TIMESTAMP
    s.set_timeout_duration(duration)
    assert s.timeout_timestamp_ms == deadline
    assert s.current_processing_time_ms() == 1_000_000


@pytest.mark.parametrize("duration", [0, -5, "0s", "soon", 0.0, -1.5, float("nan"), float("inf"), -float("inf")])
def test_a_timeout_duration_must_be_positive_and_finite(duration):
    with pytest.raises(ConfigurationError):
        state().set_timeout_duration(duration)


def test_timeout_calls_that_the_operator_does_not_allow_say_which_to_use():
    with pytest.raises(TimeoutNotEnabledError, match="PROCESSING_TIME.*has NO_TIMEOUT"):
        state(timeout=GroupStateTimeout.NO_TIMEOUT).set_timeout_duration("1s")
    with pytest.raises(TimeoutNotEnabledError, match="use set_timeout_timestamp for event time"):
        state(timeout=GroupStateTimeout.EVENT_TIME).set_timeout_duration("1s")
    with pytest.raises(TimeoutNotEnabledError, match="EVENT_TIME.*use set_timeout_duration for processing time"):
        state(timeout=GroupStateTimeout.PROCESSING_TIME).set_timeout_timestamp(5)
    with pytest.raises(TimeoutNotEnabledError, match="EVENT_TIME.*has NO_TIMEOUT"):
        state(timeout=GroupStateTimeout.NO_TIMEOUT).set_timeout_timestamp(5)


def test_event_time_timeout_must_not_lie_before_the_watermark():
    s = state(timeout=GroupStateTimeout.EVENT_TIME, watermark=10_000)
    s.set_timeout_timestamp(10_000)
    assert s.timeout_timestamp_ms == 10_000
    s.set_timeout_timestamp(8_000, additional_duration="5s")
    assert s.timeout_timestamp_ms == 13_000
    s.set_timeout_timestamp(dt.datetime(1970, 1, 1, 0, 0, 20, tzinfo=dt.UTC))
    assert s.timeout_timestamp_ms == 20_000
    with pytest.raises(ConfigurationError, match=r"\(9999 ms\) lies before the current watermark .* \(10000 ms\)"):
        s.set_timeout_timestamp(9_999)
    # Naive datetimes are UTC, as batchline hands out event timestamps.
    s.set_timeout_timestamp(dt.datetime(1970, 1, 1, 0, 0, 30))  # noqa: DTZ001 - the naive datetime is the point
    assert s.timeout_timestamp_ms == 30_000
    assert s.current_watermark_ms() == 10_000


def test_without_a_watermark_there_is_none_to_read():
    with pytest.raises(TimeoutNotEnabledError, match="with_watermark"):
        state().current_watermark_ms()
    s = state(timeout=GroupStateTimeout.EVENT_TIME)
    s.set_timeout_timestamp(1)  # no watermark yet: any positive time is allowed
    assert s.timeout_timestamp_ms == 1


def test_a_timed_out_key_sees_its_state_and_removing_it_keeps_a_timeout_set_in_the_call():
    """As Spark's GroupStateImpl.remove(): the state goes, a timeout set in the call stays."""
    s = state(Session(("a",)), timed_out=True)
    assert s.has_timed_out and s.get() == Session(("a",))
    s.set_timeout_duration("1s")
    s.remove()
    assert not s.exists and s.removed and s.timeout_timestamp_ms == 1_001_000
