"""The job event log stays bounded (SPEC E6): records of batches no retained checkpoint can
re-run are purged by name, on a thread of their own, keeping the newest commit marker; only
the first purge of a log an older release kept lists the folder. No Spark."""

import logging
import threading

import pytest

from batchline.checkpoint.events import PURGE_RECORD, EventPurger, JobEventStore, PartitionFinished
from batchline.checkpoint.manager import CheckpointManager, CheckpointSettings
from batchline.checkpoint.storage import CheckpointStorage
from batchline.clock import ManualClock

INTERVAL = 1000


class CountingStorage(CheckpointStorage):
    """Counts the listings of the event folder; can hold deletes until released."""

    def __init__(self, url):
        super().__init__(url)
        self.listings = 0
        self.hold = threading.Event()
        self.hold.set()
        self.fail_deletes = 0

    def list_names(self, relative_dir):
        if relative_dir == "events":
            self.listings += 1
        return super().list_names(relative_dir)

    def delete(self, relative, recursive=False):
        self.hold.wait(10)
        if self.fail_deletes:
            self.fail_deletes -= 1
            raise OSError("injected: the store refused the delete")
        return super().delete(relative, recursive)


def log_batches(events, times, completed=True, partitions=2):
    """Records the way a batch writes them: started, partitions finished, completed."""
    for t in times:
        events.batch_started(t, {"files": {"files": [f"f{t}.json"]}}, token=1)
        for p in range(partitions):
            events.partition_finished(t, PartitionFinished("counts", p, 0, t, 1, token=1))
        if completed:
            events.batch_completed(t, token=1)


def logged_times(storage):
    """The batch folders on disk (looked at through a storage of its own: not a listing the code made)."""
    return sorted(int(n) for n in CheckpointStorage(storage.url).list_names("events") if n.isdigit())


def test_after_the_first_purge_the_batches_are_found_by_name_not_by_listing(tmp_path):
    storage = CountingStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, range(1000, 11000, INTERVAL))
    assert events.purge_before(5000) == 4
    assert storage.listings == 1  # no record yet: a listing finds what an older release left
    assert storage.read_sealed(PURGE_RECORD) == {"next_ms": 5000, "kept_ms": None}
    for threshold in (6000, 6000, 8000):
        events.purge_before(threshold)
    assert storage.listings == 1
    assert logged_times(storage) == [8000, 9000, 10000]
    assert events.started(8000) is not None and events.finished(9000, "counts", 0, 1) is not None


def test_a_store_that_did_not_write_the_markers_still_purges_by_name(tmp_path):
    """A new run's store (the restart) starts from the record the last run's purge left."""
    storage = CountingStorage(str(tmp_path))
    log_batches(JobEventStore(storage, INTERVAL), range(1000, 9000, INTERVAL))
    JobEventStore(storage, INTERVAL).purge_before(3000)
    unaware = JobEventStore(storage, INTERVAL)
    assert unaware.purge_before(5000) == 1  # 3000; it keeps 4000's marker, knowing of no later one
    assert logged_times(storage) == [4000, 5000, 6000, 7000, 8000]
    restarted = JobEventStore(storage, INTERVAL)
    assert restarted.is_completed(8000)  # a restart reads the newest marker
    assert restarted.purge_before(6000) == 1  # 5000, and 4000 is no longer kept
    assert storage.listings == 1
    assert logged_times(storage) == [6000, 7000, 8000]


def test_the_newest_commit_marker_is_kept_until_a_later_batch_commits(tmp_path):
    """Once a pipeline finished, later batches log nothing; the last marker says which state
    version is committed, so it outlives the purges until a newer marker exists."""
    storage = CheckpointStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, [1000, 2000])
    log_batches(events, [3000], completed=False)
    finished = JobEventStore(storage, INTERVAL)  # knows of no marker it wrote
    assert finished.purge_before(4000) == 2
    assert finished.is_completed(2000) and not finished.is_completed(1000) and finished.started(3000) is None
    finished.purge_before(9000)  # idle batches: nothing logged, the marker stays
    assert finished.is_completed(2000)
    log_batches(finished, [9000, 10000])
    finished.purge_before(10000)  # 10000 committed: 9000 need not stay, nor does 2000
    assert logged_times(storage) == [10000]
    assert storage.read_sealed(PURGE_RECORD)["kept_ms"] is None


def test_a_marker_below_the_threshold_is_kept_in_place_of_the_older_one(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    log_batches(JobEventStore(storage, INTERVAL), [1000, 2000])
    JobEventStore(storage, INTERVAL).purge_before(3000)
    log_batches(JobEventStore(storage, INTERVAL), [5000])
    later = JobEventStore(storage, INTERVAL)
    later.purge_before(7000)
    assert logged_times(storage) == [5000]
    assert storage.read_sealed(PURGE_RECORD) == {"next_ms": 7000, "kept_ms": 5000}


def test_an_unreadable_purge_record_falls_back_to_a_listing(tmp_path, caplog):
    storage = CountingStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, range(1000, 6000, INTERVAL))
    events.purge_before(2000)
    (tmp_path / "events" / "_purged.json").write_bytes(b"torn")
    with caplog.at_level(logging.WARNING, logger="batchline.checkpoint.events"):
        assert events.purge_before(4000) == 2
    assert storage.listings == 2
    assert any("unreadable purge record" in r.getMessage() for r in caplog.records)
    assert logged_times(storage) == [4000, 5000]


def test_the_purger_works_off_the_callers_thread_and_the_newest_request_wins(tmp_path):
    storage = CountingStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, range(1000, 21000, INTERVAL))
    purger = EventPurger(events)
    storage.hold.clear()  # every delete waits
    purger.request(3000)
    purger.request(8000)  # returns at once although the first purge has not deleted anything
    purger.request(6000)  # older than one requested: changes nothing
    assert not purger.wait_idle(0.2)
    storage.hold.set()
    assert purger.wait_idle(10)
    purger.stop()
    assert logged_times(storage) == list(range(8000, 21000, INTERVAL))
    purger.request(15000)  # after stop: ignored, no thread left to run it
    assert logged_times(storage)[0] == 8000


def test_a_failed_purge_is_logged_and_done_with_the_next_request(tmp_path, caplog):
    storage = CountingStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, range(1000, 6000, INTERVAL))
    purger = EventPurger(events)
    storage.fail_deletes = 1
    with caplog.at_level(logging.WARNING, logger="batchline.checkpoint.events"):
        purger.request(3000)
        assert purger.wait_idle(10)
    assert purger.last_error is not None and "tried again after the next checkpoint" in str(purger.last_error)
    assert any("injected" in r.getMessage() for r in caplog.records)
    purger.request(4000)
    assert purger.wait_idle(10)
    purger.stop()
    assert purger.last_error is None
    assert logged_times(storage) == [4000, 5000]


def test_the_checkpoint_manager_purges_in_the_background_and_stops_its_thread(tmp_path):
    manager = CheckpointManager(CheckpointSettings(str(tmp_path), 2 * INTERVAL, batch_interval_ms=INTERVAL),
                                ManualClock(0))
    manager.open()
    log_batches(manager.events, range(1000, 6000, INTERVAL))
    manager.purge_events_before(4000)
    assert manager.event_purger.wait_idle(10)
    assert logged_times(manager.storage) == [4000, 5000]
    manager.close()
    assert not any(t.name == "batchline-event-purge" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("batches", [1, 3])
def test_a_purge_of_an_older_releases_log_keeps_what_a_restart_reads(tmp_path, batches):
    """The records a restart reads (of batches from the threshold on) stay, byte for byte."""
    storage = CheckpointStorage(str(tmp_path))
    events = JobEventStore(storage, INTERVAL)
    log_batches(events, range(1000, 101_000, INTERVAL), partitions=batches)
    kept = {t: (events.started(t), events.completed(t)) for t in range(95_000, 101_000, INTERVAL)}
    assert events.purge_before(95_000) == 94
    assert logged_times(storage) == list(range(95_000, 101_000, INTERVAL))
    assert {t: (events.started(t), events.completed(t)) for t in kept} == kept
