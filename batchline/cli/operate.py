"""``batchline status LOCATION`` and ``batchline stop LOCATION``: see and steer a pipeline
from any terminal, through its checkpoint location (SPEC I1)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from batchline.batch_time import format_batch_time
from batchline.checkpoint.storage import CheckpointStorage
from batchline.cli.checkpoints import storage_options
from batchline.clock import SystemClock
from batchline.observe.control import (
    NotRunningError,
    StopHow,
    StopOutcome,
    read_stop_outcome,
    request_stop,
    running_holder,
)
from batchline.observe.status import EMPTY, read_status

__all__ = ["add_operate_commands"]

_POLL_S = 0.2
_EXIT_NOT_RUNNING = 3
_EXIT_TIMED_OUT = 2


def _storage(args: argparse.Namespace) -> CheckpointStorage:
    return CheckpointStorage(args.location, storage_options(args), warn=False)


def _status(args: argparse.Namespace) -> int:
    """Exit status 0, or 3 when nothing at all is at the location (a mistyped path, most likely)."""
    status = read_status(_storage(args), SystemClock())
    if args.json:
        print(json.dumps(status.to_json(), indent=2, sort_keys=True))
    elif status.state == EMPTY:
        print(f"batchline: nothing at {status.location}: no checkpoint, lease or progress; check the path",
              file=sys.stderr)
    else:
        print(status.describe())
    return _EXIT_NOT_RUNNING if status.state == EMPTY else 0


def _describe_outcome(outcome: StopOutcome) -> str:
    last = f"; last committed batch {format_batch_time(outcome.last_committed)}" if outcome.last_committed else ""
    unfinished = ", ".join(format_batch_time(t) for t in outcome.unfinished) or "none"
    return {
        StopHow.GRACEFUL:
            f"Stopped gracefully: every received record was processed and every generated batch committed{last}.",
        StopHow.IMMEDIATE:
            f"Stopped immediately: running batches were cancelled{last}. They were not committed, so the next start "
            "runs them again; nothing is committed twice.",
        StopHow.GRACEFUL_TIMED_OUT:
            f"Stopped, but the graceful stop timed out (batches not finished: {unfinished}){last}. What was not "
            "committed runs at the next start; a larger graceful_stop_timeout lets a stop wait longer.",
        StopHow.FINISHED:
            f"The pipeline had finished on its own: every input ended and the final checkpoint is written{last}.",
    }.get(outcome.how, f"The pipeline stopped after a failure{last}"
                       + (f" ({outcome.reason})" if outcome.reason else "")
                       + "; its log says why, and `batchline status` shows the batch that failed. Fix the cause "
                         "and start it again: what was not committed runs again.")


def _stop(args: argparse.Namespace) -> int:
    storage, clock = _storage(args), SystemClock()
    try:
        request, holder = request_stop(storage, clock, args.immediate)
    except NotRunningError as error:
        print(f"batchline: {error}")
        return _EXIT_NOT_RUNNING
    print(f"Asked {holder.describe()} to stop {'immediately' if args.immediate else 'gracefully'}; waiting up to "
          f"{args.timeout:g} s", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        outcome = read_stop_outcome(storage)
        if outcome is not None and outcome.request_id == request.request_id:
            print(_describe_outcome(outcome))
            return 0
        if running_holder(storage, clock) is None and time.monotonic() + 2 < deadline:
            # Gone without an answer: give its last write a moment, then say what is known.
            time.sleep(2)
            outcome = read_stop_outcome(storage)
            if outcome is not None and outcome.request_id == request.request_id:
                print(_describe_outcome(outcome))
                return 0
            status = read_status(storage, clock)
            print(f"The driver {holder.holder} stopped without answering the request (it was stopped another way, "
                  f"or killed); the location is {status.state}. `batchline status {args.location}` shows its last "
                  "batch; the next start resumes from there.")
            return 1
        time.sleep(_POLL_S)
    print(f"batchline: the pipeline at {args.location} did not stop within {args.timeout:g} s. It looks for the "
          "request every batch interval (at most 2 s) and a graceful stop waits for running batches: wait longer "
          f"with --timeout, or run `batchline stop {args.location} --immediate`.")
    return _EXIT_TIMED_OUT


def add_operate_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    status = commands.add_parser(
        "status", help="whether a pipeline runs at a checkpoint location, its last batch, backlog and state "
                       "(exit status 3 when nothing is there)")
    status.add_argument("location", help="checkpoint location: a path or an fsspec URL (s3://...)")
    status.add_argument("--json", action="store_true", help="print the status as JSON, for scripts")
    status.add_argument("--storage-options", default=None, help="fsspec options as a JSON object")
    status.set_defaults(handler=_status)

    stop = commands.add_parser(
        "stop", help="ask the pipeline running at a checkpoint location to stop, and wait until it has")
    stop.add_argument("location", help="checkpoint location: a path or an fsspec URL (s3://...)")
    stop.add_argument("--immediate", action="store_true",
                      help="cancel running batches instead of finishing them (they run again at the next start)")
    stop.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the stop (default 120)")
    stop.add_argument("--storage-options", default=None, help="fsspec options as a JSON object")
    stop.set_defaults(handler=_stop)
