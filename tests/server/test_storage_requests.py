"""What a look at the checkpoint location costs in requests to S3: each one a round trip a
batch waits for (the lease checked before a commit, a task's finish record looked for, an
output's commit record found and its files published). Counted as the S3 client sends them,
against the tests' S3 endpoint; the same calls on a local disk and in memory answer the same."""

from __future__ import annotations

import pytest

from batchline.batch_time import BatchTime
from batchline.checkpoint.events import JobEventStore, OperatorInitialized
from batchline.checkpoint.lease import Lease, check_token
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.sinks.files import FileSink
from batchline.sinks.sink import BatchContext

BUCKET = "batchline-test"


class Requests:
    """The S3 operations a storage's client sends, by name, in order."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.names: list[str] = []
        storage.fs.call_s3("list_buckets")  # the client exists from here on
        storage.fs.s3.meta.events.register("before-call.s3", lambda model, **_: self.names.append(model.name))

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


@pytest.fixture
def s3_storage(s3_endpoint, request):
    return CheckpointStorage(f"s3://{BUCKET}/requests/{request.node.name}", s3_endpoint)


def test_a_file_that_is_not_there_costs_one_request_to_read_or_look_for(s3_storage):
    sent = Requests(s3_storage)
    assert s3_storage.read_if_present("records/missing.json") is None
    assert sent.take() == ["GetObject"]
    assert not s3_storage.has_file("records/missing.json")
    assert sent.take() == ["HeadObject"]
    assert not s3_storage.has_folder("batch_time=1000")
    assert sent.take() == ["ListObjectsV2"]


def test_a_file_that_is_there_is_read_and_found_in_one_request(s3_storage):
    s3_storage.write_new("records/1000.json", b"a record")
    sent = Requests(s3_storage)
    assert s3_storage.read_if_present("records/1000.json") == b"a record"
    assert sent.take() == ["GetObject"]
    assert s3_storage.read("records/1000.json") == b"a record"
    assert sent.take() == ["GetObject"]
    # A large file (a state snapshot) is sized first, to be read in concurrent ranges when it is.
    assert s3_storage.read("records/1000.json", large=True) == b"a record"
    assert sent.take() == ["HeadObject", "GetObject"]
    assert s3_storage.has_file("records/1000.json")
    assert sent.take() == ["HeadObject"]
    assert s3_storage.has_folder("records")
    assert sent.take() == ["ListObjectsV2"]
    # A folder is not a file, and a file is not a folder.
    assert not s3_storage.has_file("records")
    assert not s3_storage.has_folder("records/1000.json")


def test_a_copy_of_known_size_is_one_server_side_copy(s3_storage):
    s3_storage.write_new("staging/part-00000.json", b'{"a": 1}\n')
    sent = Requests(s3_storage)
    s3_storage.copy_in(s3_storage.path("staging/part-00000.json"), "batch_time=1000/part-00000.json", 9)
    assert sent.take() == ["CopyObject"]
    assert s3_storage.read("batch_time=1000/part-00000.json") == b'{"a": 1}\n'
    with pytest.raises(FileNotFoundError):
        s3_storage.copy_in(s3_storage.path("staging/gone.json"), "batch_time=1000/gone.json", 9)
    # Without the size (a commit record of an older release), the copy asks for it first.
    sent.take()
    s3_storage.copy_in(s3_storage.path("staging/part-00000.json"), "batch_time=2000/part-00000.json")
    assert sent.take() == ["HeadObject", "CopyObject"]
    assert s3_storage.read("batch_time=2000/part-00000.json") == b'{"a": 1}\n'


def test_the_lease_is_checked_and_a_finish_record_looked_for_in_one_request_each(s3_storage):
    lease = Lease(s3_storage, ManualClock(1_000_000))
    token = lease.acquire()
    events = JobEventStore(s3_storage)
    sent = Requests(s3_storage)
    lease.check()
    assert sent.take() == ["GetObject"]
    check_token(s3_storage, token, "a task")
    assert sent.take() == ["GetObject"]
    assert events.finished(1000, "sessions", 0, 3) is None
    assert sent.take() == ["GetObject"]
    lease.release()


def test_a_batch_s_operator_record_is_written_in_one_request_and_found_on_a_re_run(s3_storage):
    events = JobEventStore(s3_storage)
    record = OperatorInitialized("sessions", 8, 0)
    sent = Requests(s3_storage)
    events.operator_initialized(1000, record)
    assert sent.take() == ["PutObject"]
    events.operator_initialized(1000, record)  # the batch runs again after a restart
    assert events.operator(1000, "sessions", 0) == record


def test_the_file_output_looks_for_a_batch_s_commit_record_in_one_request(s3_endpoint, request):
    sink = FileSink(f"s3://batchline-sink/requests/{request.node.name}/out", "json", storage_options=s3_endpoint)
    sent = Requests(sink._own)
    batch = BatchContext(BatchTime(1000), "files", "requests", 1)
    assert not sink.is_committed(batch)
    # The run's first look also makes sure no release before 0.2 left records under the output,
    # and reads the snapshot of compacted records.
    assert sent.take() == ["ListObjectsV2", "GetObject", "GetObject"]
    assert not sink.is_committed(BatchContext(BatchTime(1500), "files", "requests", 1))
    assert sent.take() == ["GetObject"]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_other_stores_answer_the_same(tmp_path, where):
    storage = CheckpointStorage(str(tmp_path / "location") if where == "local" else f"memory://requests-{where}")
    assert storage.read_if_present("records/missing.json") is None
    assert not storage.has_file("records/missing.json")
    assert not storage.has_folder("records")
    storage.write_new("records/1000.json", b"a record")
    assert storage.read_if_present("records/1000.json") == b"a record"
    assert storage.has_file("records/1000.json") and not storage.has_file("records")
    assert storage.has_folder("records") and not storage.has_folder("records/1000.json")
    storage.copy_in(storage.path("records/1000.json"), "published/1000.json", 8)
    assert storage.read("published/1000.json") == b"a record"
