"""What a look at the checkpoint location costs in requests to S3: each one a round trip a
batch waits for (the lease checked before a commit, a task's finish record looked for, an
output's commit record found and its files published). Counted as the S3 client sends them,
against the tests' S3 endpoint; the same calls on a local disk and in memory answer the same."""

from __future__ import annotations

import pyarrow as pa
import pytest

from batchline.batch_time import BatchTime
from batchline.checkpoint.events import JobEventStore, OperatorInitialized
from batchline.checkpoint.lease import Lease, check_token
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock
from batchline.sinks.exactly_once import WriteAttempt
from batchline.sinks.files import FileSink
from batchline.sinks.sink import BatchContext
from batchline.state.store import DELTA, OUTPUT, SNAPSHOT, FileHeader, FileStateStore

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


def staged_attempt(sink: FileSink, time_ms: int, first: bool = False) -> tuple[WriteAttempt, list[dict]]:
    """An attempt at batch ``time_ms`` whose two tasks staged their files, as they would."""
    attempt = WriteAttempt(BatchContext(BatchTime(time_ms), "files", "requests", 1, first_attempt=first), "attempt-2")
    rows = pa.record_batch({"n": [1, 2]})
    return attempt, [sink.write_partition(iter([rows]), attempt, partition) for partition in (0, 1)]


@pytest.mark.parametrize("look", ["ahead", "failed"])
def test_the_file_output_s_commit_waits_for_no_listing_the_tasks_time_was_used_for(s3_endpoint, look):
    sink = FileSink(f"s3://batchline-sink/requests/commit-{look}/out", "json", storage_options=s3_endpoint)
    sink.compact_in_background()  # the run's first compaction, which the first commit would start
    assert sink.wait_for_compaction(30)
    sink._own.write_new("staging/1000/attempt-1/part-00000.json", b'{"n": 1}\n')  # a crashed attempt's
    attempt, messages = staged_attempt(sink, 1000)
    if look == "failed":
        def unreachable(time_ms: int) -> None:
            raise OSError("the store did not answer")
        sink._look_left = unreachable  # type: ignore[method-assign,assignment]
    sent = Requests(sink._own)
    sink.prepare(None, attempt)  # type: ignore[arg-type] (the look needs no DataFrame)
    if look == "ahead":
        sink._looks[attempt.id].exception(timeout=30)
        # While the tasks run: is the batch's folder there (Step 3), and what is staged for it.
        assert sorted(sent.take()) == ["ListObjectsV2", "ListObjectsV2"]

    sink.commit(messages, attempt)
    committed = sent.take()
    # The record, the copies, then the staging deleted by name; after a failed look, the
    # commit looks itself, as it did before there was a look ahead.
    listings = [] if look == "ahead" else ["ListObjectsV2"]
    deletion = ["DeleteObjects"] if look == "ahead" else ["ListObjectsV2", "DeleteObjects"]
    assert committed == [*listings, "PutObject", "CopyObject", "CopyObject", *deletion]
    assert sink._own.find_files("staging") == [], "the crashed attempt's file goes too"
    assert sink._storage.find_files("") == ["batch_time=1000/part-00000.json", "batch_time=1000/part-00001.json"]
    assert sink._looks == {}
    sink.close()


def test_a_batch_s_first_attempt_at_the_file_output_looks_for_nothing(s3_endpoint):
    sink = FileSink("s3://batchline-sink/requests/first/out", "json", storage_options=s3_endpoint)
    sink.compact_in_background()  # the run's first compaction, which the first commit would start
    assert sink.wait_for_compaction(30)
    sent = Requests(sink._own)
    for time_ms, once_a_run in ((1000, ["GetObject"]), (2000, [])):
        attempt, messages = staged_attempt(sink, time_ms, first=True)
        sent.take()
        assert not sink.is_committed(attempt.batch)
        assert sent.take() == once_a_run  # the snapshot of compacted records, read once a run
        sink.prepare(None, attempt)  # type: ignore[arg-type] (it needs no DataFrame)
        assert sink._looks == {} and sent.take() == []
        sink.commit(messages, attempt)
        assert sent.take() == ["PutObject", "CopyObject", "CopyObject", "DeleteObjects"]
    assert sink._storage.find_files("") == [f"batch_time={t}/part-0000{p}.json" for t in (1000, 2000) for p in (0, 1)]
    sink.close()


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
    storage.write_new("records/deeper/2000.json", b"another")
    assert storage.find_files("records") == ["records/1000.json", "records/deeper/2000.json"]
    assert storage.find_files("nothing") == []
    storage.delete_files(["records/1000.json", "records/deeper/2000.json", "records/never.json"])
    assert storage.find_files("records") == []


@pytest.mark.parametrize("where", ["local", "memory", "s3"])
def test_a_name_is_deleted_as_it_is_never_as_a_pattern(tmp_path, s3_endpoint, where):
    """``runs[1]`` as a glob is ``runs1``: a folder or file of that name must go, and the
    pattern's matches stay."""
    roots = {"local": str(tmp_path), "memory": "memory://names", "s3": f"s3://{BUCKET}/names"}
    options = s3_endpoint if where == "s3" else None
    storage = CheckpointStorage(roots[where], options)
    for name in ("runs[1]/staging/1000/a.json", "runs[1]/staging/1000/b.json", "runs1/staging/1000/a.json",
                 "runs[1]/record.json", "runs1/record.json"):
        storage.write_new(name, b"{}")
    assert storage.delete("runs[1]/staging/1000", recursive=True)
    assert storage.delete("runs[1]/record.json", recursive=True)  # a file, as a folder's delete finds it
    assert storage.find_files("runs[1]") == []
    assert storage.find_files("runs1") == ["runs1/record.json", "runs1/staging/1000/a.json"]
    assert not storage.delete("runs[1]/staging/1000", recursive=True), "not there any more"
    storage.write_new("runs[1]/other.json", b"{}")
    assert storage.delete("runs[1]/other.json")
    assert storage.find_files("runs[1]") == []


def test_a_state_partition_s_purge_deletes_its_old_files_in_one_request(s3_storage):
    store = FileStateStore(s3_storage, "op")
    table = pa.table({"k": [1]})
    for version in range(1000, 6000, 1000):
        store.write_version(0, FileHeader(version, 3, DELTA, first=version == 1000), table)
        store.write_version(0, FileHeader(version, 3, OUTPUT), table)
    store.write_version(0, FileHeader(4000, 3, SNAPSHOT), table)
    sent = Requests(s3_storage)
    # The outputs of the committed batches, and every file below the snapshot the kept versions need.
    assert store.purge(0, 3, retain=2, committed_through=4000) == 4 + 3
    assert sent.take() == ["ListObjectsV2", "DeleteObjects"]
    assert store.list_versions(0, 3) == {4000: {DELTA, SNAPSHOT}, 5000: {DELTA, OUTPUT}}


def test_files_s3_refuses_to_delete_in_bulk_fail_the_deletion_naming_what_to_check(s3_storage, monkeypatch):
    s3_storage.write_new("old/1000.arrow", b"a delta")
    sent = s3_storage.fs.call_s3

    def refusing(method, *args, **kwargs):
        if method != "delete_objects":
            return sent(method, *args, **kwargs)
        return {"Errors": [{"Key": kwargs["Delete"]["Objects"][0]["Key"], "Code": "AccessDenied",
                            "Message": "Access Denied"}]}

    monkeypatch.setattr(s3_storage.fs, "call_s3", refusing)
    with pytest.raises(PermissionError, match=r"did not delete 1 of 1 files .*AccessDenied.*s3:DeleteObject"):
        s3_storage.delete_files(["old/1000.arrow"])
    monkeypatch.undo()
    assert s3_storage.find_files("old") == ["old/1000.arrow"]
