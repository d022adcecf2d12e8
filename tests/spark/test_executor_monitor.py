"""Which executors are excluded, as batch information and WARN lines (SPEC H2). The real
status store is read on the test session and on the standalone cluster (test_cluster.py);
here its answers are scripted, to walk through exclusion, return and loss on a manual clock."""

import logging

from batchline.clock import ManualClock
from batchline.scheduler.executors import ExecutorMonitor, ExecutorStatus, executor_statuses
from batchline.scheduler.listener import ExcludedExecutor


def test_exclusion_return_and_loss_are_reported_once_each(caplog):
    clock = ManualClock(1_000)
    answers = [
        [ExecutorStatus("0", "10.0.0.1", False), ExecutorStatus("1", "10.0.0.2", False)],
        [ExecutorStatus("0", "10.0.0.1", False), ExecutorStatus("1", "10.0.0.2", True)],
        [ExecutorStatus("0", "10.0.0.1", False), ExecutorStatus("1", "10.0.0.2", True)],
        [ExecutorStatus("0", "10.0.0.1", True), ExecutorStatus("1", "10.0.0.2", False)],
        [ExecutorStatus("1", "10.0.0.2", False), ExecutorStatus("2", "10.0.0.1", False)],
    ]
    monitor = ExecutorMonitor(lambda: answers.pop(0), clock)
    seen = []
    with caplog.at_level(logging.WARNING, logger="batchline.scheduler.executors"):
        for _ in range(5):
            seen.append(monitor.excluded())
            clock.advance(500)
    assert seen == [
        [],
        [ExcludedExecutor("1", "10.0.0.2", 1_500)],
        [ExcludedExecutor("1", "10.0.0.2", 1_500)],  # since when it was first seen, not now
        [ExcludedExecutor("0", "10.0.0.1", 2_500)],
        [],
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in messages] == [
        "Spark excluded executor 1 on 10.0.0.2 after repeated task failures",
        "Spark excluded executor 0 on 10.0.0.1 after repeated task failures",
        "Executor 1 on 10.0.0.2 is no longer excluded",
        "Excluded executor 0 on 10.0.0.1 is gone (killed or lost); the cluster manager may start a new one "
        "in its place",
    ]


def test_a_local_session_has_no_executor_but_its_driver(spark):
    assert executor_statuses(spark) == []
