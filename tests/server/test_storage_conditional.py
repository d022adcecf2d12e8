"""CheckpointStorage.write_new creates exclusively on local disks and on S3 (a conditional PUT),
so the batch log's fencing fires on object stores too; other stores say they cannot."""

import logging
import pickle

import fsspec
import pytest
from botocore.exceptions import ClientError
from fsspec.implementations.memory import MemoryFileSystem

from batchline.checkpoint.events import JobEventStore
from batchline.checkpoint.lease import FencedError
from batchline.checkpoint.storage import CheckpointStorage

BUCKET = "batchline-conditional"




def test_a_second_write_of_the_same_name_on_s3_raises_and_keeps_the_first(s3_endpoint):
    storage = CheckpointStorage(f"s3://{BUCKET}/location-1", s3_endpoint)
    assert storage.exclusive_creates
    storage.write_new("batches/000000000001000.json", b"first driver")
    with pytest.raises(FileExistsError):
        storage.write_new("batches/000000000001000.json", b"second driver")
    other_driver = pickle.loads(pickle.dumps(storage))  # a storage of its own, as another process opens it
    with pytest.raises(FileExistsError):
        other_driver.write_new("batches/000000000001000.json", b"third driver")
    assert storage.read("batches/000000000001000.json") == b"first driver"
    storage.write_new("batches/000000000002000.json", b"a new name is written")
    assert other_driver.read("batches/000000000002000.json") == b"a new name is written"


def test_a_second_write_of_the_same_name_on_a_local_disk_raises_and_keeps_the_first(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "location"))
    assert storage.exclusive_creates
    storage.write_new("commits/000000000001000.json", b"first driver")
    with pytest.raises(FileExistsError):
        storage.write_new("commits/000000000001000.json", b"second driver")
    assert (tmp_path / "location" / "commits" / "000000000001000.json").read_bytes() == b"first driver"


def test_the_job_event_log_fences_a_second_driver_on_s3(s3_endpoint):
    first = JobEventStore(CheckpointStorage(f"s3://{BUCKET}/location-2", s3_endpoint))
    second = JobEventStore(CheckpointStorage(f"s3://{BUCKET}/location-2", s3_endpoint))
    first.batch_started(5000, {"files": {"paths": ["a.json"]}}, token=1)
    with pytest.raises(FencedError, match="already written by another driver"):
        second.batch_started(5000, {"files": {"paths": ["b.json"]}}, token=2)
    first.batch_completed(5000, token=1)
    with pytest.raises(FencedError, match="already written by another driver"):
        second.batch_completed(5000, token=2)
    assert first.started(5000) == {"files": {"paths": ["a.json"]}}
    assert first.completed(5000).token == 1


class PlainStore(MemoryFileSystem):
    """A store with no conditional create that batchline knows of."""

    protocol = "plainstore"


def test_a_store_without_conditional_create_says_so_once_and_overwrites(caplog):
    fsspec.register_implementation("plainstore", PlainStore, clobber=True)
    with caplog.at_level(logging.WARNING, logger="batchline.checkpoint.storage"):
        storage = CheckpointStorage("plainstore://bucket/location-3")
        CheckpointStorage("plainstore://bucket/location-3")  # the same location again: no second warning
        shipped = pickle.loads(pickle.dumps(storage))  # an executor's copy: its driver said it already
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "protocol 'plainstore'" in warnings[0] and "relies on the lease alone" in warnings[0]
    assert not storage.exclusive_creates and not shipped.exclusive_creates
    storage.write_new("a.json", b"first")
    storage.write_new("a.json", b"second")
    assert storage.read("a.json") == b"second"


def test_s3_precondition_answers_without_a_condition_and_conflicts(s3_endpoint, monkeypatch):
    """Some S3-compatible stores answer 412 without naming the condition (s3fs then raises a plain
    OSError), and S3 answers 409 while another conditional write of the name is in flight; a 500
    is a store that could not answer, tried again."""
    storage = CheckpointStorage(f"s3://{BUCKET}/location-4", s3_endpoint)
    real_pipe = storage.fs.pipe_file
    answers = []

    def pipe_file(path, data, mode="overwrite", **kwargs):
        code = answers.pop(0) if answers else None
        if code:
            error = OSError(5, code)
            error.__cause__ = ClientError({"Error": {"Code": code, "Message": code}}, "PutObject")
            raise error
        return real_pipe(path, data, mode=mode, **kwargs)

    monkeypatch.setattr(storage.fs, "pipe_file", pipe_file)
    answers[:] = ["PreconditionFailed"]
    with pytest.raises(FileExistsError, match="location-4/x.json exists already"):
        storage.write_new("x.json", b"data")
    answers[:] = ["ConditionalRequestConflict", "ConditionalRequestConflict"]
    storage.write_new("x.json", b"data")  # tried again until the store answered
    assert storage.read("x.json") == b"data"
    answers[:] = ["InternalError"]  # a store that could not answer: tried again until it does
    storage.write_new("y.json", b"data")
    assert storage.read("y.json") == b"data"
    answers[:] = ["AccessDenied"]  # an answer: raised as it is
    with pytest.raises(OSError, match="AccessDenied"):
        storage.write_new("z.json", b"data")
