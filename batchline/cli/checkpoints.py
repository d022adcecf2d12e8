"""``batchline checkpoints list|inspect LOCATION``: read a checkpoint location, change nothing."""

from __future__ import annotations

import argparse
import json
from typing import Any

from batchline.batch_time import format_batch_time
from batchline.checkpoint.events import JobEventStore
from batchline.checkpoint.lease import Lease
from batchline.checkpoint.storage import CheckpointStorage, CorruptFileError
from batchline.checkpoint.writer import load_latest_checkpoint, read_checkpoint
from batchline.clock import SystemClock
from batchline.errors import ConfigurationError

__all__ = ["add_checkpoint_commands", "storage_options"]


_PENDING_LEGEND = ("pending: batches generated but not yet committed when the checkpoint was written; a restart "
                   "from it runs them again")


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return json.loads(args.storage_options) if args.storage_options else {}
    except ValueError as error:
        raise ConfigurationError(f"--storage-options must be a JSON object: {error}") from error


def _storage(args: argparse.Namespace) -> CheckpointStorage:
    return CheckpointStorage(args.location, storage_options(args))


def _list(args: argparse.Namespace) -> int:
    storage = _storage(args)
    newest, entries = load_latest_checkpoint(storage)
    if newest is None:
        print(f"No valid checkpoint in {storage.url}.")
        return 1
    lease = Lease(storage, SystemClock()).read()
    if lease is not None:
        state = f"expires {format_batch_time(lease.expires_at_ms)}" if lease.expires_at_ms else "released"
        print(f"lease: {lease.describe()}, {state}")
    print(f"{'checkpoint time':<26} {'pending':>7}  file")
    for entry in entries:
        note = ""
        try:
            checkpoint = read_checkpoint(storage, entry["name"])
            pending = str(len(checkpoint.pending_times))
            finished = checkpoint.finished_inputs
            note = ("  final: the pipeline finished" if checkpoint.final is not None
                    else f"  finished inputs: {', '.join(sorted(finished))}" if finished else "")
        except (CorruptFileError, FileNotFoundError):
            pending = "torn"
        print(f"{format_batch_time(int(entry['time'])):<26} {pending:>7}  {entry['name']}{note}")
    print(_PENDING_LEGEND)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    storage = _storage(args)
    checkpoint, _ = load_latest_checkpoint(storage)
    if checkpoint is None:
        print(f"No valid checkpoint in {storage.url}.")
        return 1
    events = JobEventStore(storage, checkpoint.batch_interval_ms)
    after: list[dict[str, Any]] = []
    t = checkpoint.time + checkpoint.batch_interval_ms
    while (allocations := events.started(t)) is not None:
        after.append({"time": t, "committed": events.is_completed(t), "allocations": allocations})
        t += checkpoint.batch_interval_ms
    report = {"checkpoint": checkpoint.to_json(), "batches_logged_after_it": after}
    print(json.dumps(report, indent=2, default=str))
    return 0


def add_checkpoint_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = commands.add_parser("checkpoints", help="look at a checkpoint location (read only)")
    actions = group.add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("list", _list, "the retained checkpoints, newest first, and the lease holder"),
        ("inspect", _inspect, "the newest valid checkpoint and the batches logged after it, as JSON"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("location", help="checkpoint location: a path or an fsspec URL")
        action.add_argument("--storage-options", default=None, help="fsspec options as a JSON object")
        action.set_defaults(handler=handler)
