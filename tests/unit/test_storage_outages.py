"""A store that cannot be reached for a while (an S3 endpoint restarted, a network blip): every
storage operation keeps trying, with backoff, for the location's outage tolerance, then fails
with an error that says what to do. Runs on a manual clock: nothing sleeps."""

import logging

import pytest

import batchline.checkpoint.storage as storage_module
from batchline.checkpoint.storage import CheckpointStorage, StorageUnreachableError, is_unreachable
from batchline.scheduler.retry import RetryPolicy
from tests.helpers import sleeps_on_a_fake_clock


class Flaky:
    """A file system whose next ``failures`` calls fail as an unreachable store's do; ``lands``:
    a failing write still lands (its answer is what was lost)."""

    def __init__(self, fs, failures=0, lands=False):
        self._fs, self.failures, self.lands, self.calls = fs, failures, lands, 0

    def __getattr__(self, name):
        method = getattr(self._fs, name)
        if name == "invalidate_cache":
            return method

        def call(*args, **kwargs):
            self.calls += 1
            if self.failures:
                self.failures -= 1
                if self.lands:
                    method(*args, **kwargs)
                raise ConnectionRefusedError(111, "Connection refused")
            return method(*args, **kwargs)
        return call


@pytest.fixture
def clock(monkeypatch):
    return sleeps_on_a_fake_clock(monkeypatch, storage_module)


def flaky_storage(failures=0, lands=False, tolerance=60.0):
    import uuid

    storage = CheckpointStorage(f"memory://outage-{uuid.uuid4().hex}", outage_tolerance_s=tolerance)
    storage.fs = Flaky(storage.fs, failures, lands)
    return storage


def test_every_operation_keeps_trying_until_the_store_answers(clock, caplog):
    storage = flaky_storage()
    for operation in (lambda: storage.replace("a.json", b"1"), lambda: storage.read("a.json"),
                      lambda: storage.exists("a.json"), lambda: storage.list_names(""),
                      lambda: storage.write_new("b.json", b"2"), lambda: storage.delete("b.json")):
        storage.fs.failures = 3
        with caplog.at_level(logging.INFO):
            operation()
        assert storage.fs.failures == 0
    assert storage.read("a.json") == b"1" and not storage.exists("b.json")
    assert 0 < clock[0] < 60
    assert "Could not reach memory://outage-" in caplog.text and "trying again for up to 60 s" in caplog.text
    assert "Reached memory://outage-" in caplog.text


def test_a_write_once_whose_answer_was_lost_is_not_taken_for_another_writers():
    storage = flaky_storage(failures=1, lands=True)
    storage.write_new("started.json", b"mine")  # landed, then refused: the retry finds its own bytes
    assert storage.read("started.json") == b"mine"
    storage.fs.failures, storage.fs.lands = 0, False
    with pytest.raises(FileExistsError):
        storage.write_new("started.json", b"another driver's")


def test_a_delete_whose_answer_was_lost_says_it_deleted():
    storage = flaky_storage()
    storage.replace("x.json", b"1")
    storage.fs.failures, storage.fs.lands = 1, True
    assert storage.delete("x.json") is True
    assert storage.delete("x.json") is False


def test_a_store_unreachable_beyond_the_tolerance_fails_saying_what_to_do(clock):
    storage = flaky_storage(failures=10_000, tolerance=30.0)
    with pytest.raises(StorageUnreachableError) as failure:
        storage.replace("lease.json", b"1")
    message = str(failure.value)
    assert "could not reach memory://outage-" in message and "(writing lease.json) for 30 s" in message
    assert "Check that the store is up" in message and "resumes exactly" in message
    assert clock[0] == pytest.approx(30.0)
    assert isinstance(failure.value, OSError) and not is_unreachable(failure.value)  # waited for once only
    assert RetryPolicy().should_retry(failure.value, 1)  # the batch is tried again


def test_answers_are_not_retried(clock):
    storage = flaky_storage()
    with pytest.raises(FileNotFoundError):
        storage.read("missing.json")
    assert clock[0] == 0 and storage.fs.calls == 1


def test_what_counts_as_unreachable():
    class EndpointConnectionError(Exception):  # botocore's, by name
        pass

    wrapped = OSError("s3fs gave up")
    wrapped.__cause__ = EndpointConnectionError("Could not connect to the endpoint URL")
    assert is_unreachable(wrapped)
    assert is_unreachable(ConnectionResetError()) and is_unreachable(TimeoutError())
    assert not is_unreachable(FileNotFoundError()) and not is_unreachable(PermissionError())
    assert not is_unreachable(OSError(28, "No space left on device"))
    unavailable = OSError("503")
    unavailable.__cause__ = type("ClientError", (Exception,), {"response": {"Error": {"Code": "ServiceUnavailable"}}})()
    assert is_unreachable(unavailable)
    looped = OSError("raised from itself")
    looped.__cause__ = looped
    assert not is_unreachable(looped)  # and it returns
