"""batchline counts an input's rows with ``observe()``: a session with Spark's legacy setting
that adds every attempt of a task (a re-run map task counted twice) is set back, at WARN."""

import logging

from batchline.spark import OBSERVE_ALL_ATTEMPTS, observe_last_attempts


class _Conf:
    def __init__(self, values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value


class _Session:
    def __init__(self, **values):
        self.conf = _Conf(values)


def test_a_session_that_adds_every_attempt_is_set_to_the_last_attempt_with_a_warning(caplog):
    session = _Session(**{OBSERVE_ALL_ATTEMPTS: "true"})
    with caplog.at_level(logging.WARNING, "batchline.spark"):
        observe_last_attempts(session)
    assert session.conf.values[OBSERVE_ALL_ATTEMPTS] == "false"
    assert OBSERVE_ALL_ATTEMPTS in caplog.text and "twice" in caplog.text


def test_spark_defaults_are_left_alone_without_a_word(caplog):
    for values in ({}, {OBSERVE_ALL_ATTEMPTS: "false"}):
        session = _Session(**values)
        with caplog.at_level(logging.WARNING, "batchline.spark"):
            observe_last_attempts(session)
        assert session.conf.values == values
    assert not caplog.text
