"""``batchline state list|read|rescale LOCATION``: stateful operators' state, offline."""

from __future__ import annotations

import argparse
import json
import sys

from batchline.batch_time import format_batch_time
from batchline.cli.checkpoints import storage_options
from batchline.spark import local_spark_session
from batchline.state.admin import read_state, rescale_state, state_operators, state_versions
from batchline.state.store import StateFiles

__all__ = ["add_state_commands"]


def _list(args: argparse.Namespace) -> int:
    options = storage_options(args)
    names = state_operators(args.location, options)
    if not names:
        print(f"No stateful operator keeps state in {args.location}.")
        return 1
    for name in names:
        files = StateFiles.open(args.location, name, options)
        metadata = files.read_metadata()
        versions = state_versions(args.location, name, options)
        span = (f"versions {versions[0]} .. {versions[-1]} ({len(versions)}), latest "
                f"{format_batch_time(versions[-1])}" if versions else "no committed version")
        partitions = f"{metadata.num_partitions} partitions" if metadata else "no metadata"
        print(f"{name}: {partitions}, {span}")
    return 0


def _read(args: argparse.Namespace) -> int:
    # Seconds of silence otherwise; and a second Spark beside a live pipeline is worth knowing of.
    print(f"Starting a local Spark session ({args.master}) to read the state; this takes about 10 s",
          file=sys.stderr, flush=True)
    spark = local_spark_session(args.master, "batchline-state")
    df = read_state(spark, args.location, args.operator, args.version, storage_options=storage_options(args))
    if args.json:
        for row in df.toLocalIterator():
            print(json.dumps(row.asDict(recursive=True), default=str))
    else:
        df.show(args.limit, truncate=False)
    return 0


def _rescale(args: argparse.Namespace) -> int:
    spark = local_spark_session(args.master, "batchline-state")
    result = rescale_state(spark, args.location, args.operator, args.partitions, storage_options(args))
    print(f"{result.operator}: {result.old_partitions} -> {result.new_partitions} partitions, {result.keys} keys, "
          f"at version {result.version}")
    return 0


def add_state_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = commands.add_parser("state", help="stateful operators' state: list, read, rescale")
    actions = group.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="operators with state, their partition counts and retained versions")
    read = actions.add_parser("read", help="an operator's state at a version (default: latest) as rows")
    read.add_argument("--version", type=int, default=None, help="a retained version (a batch time in ms)")
    read.add_argument("--json", action="store_true", help="one JSON object per key instead of a table")
    read.add_argument("--limit", type=int, default=20, help="rows to show in the table (default 20)")
    rescale = actions.add_parser("rescale", help="move an operator's state to another number of partitions "
                                                 "(the pipeline must be stopped)")
    rescale.add_argument("--partitions", type=int, required=True, help="the new partition count")
    for action, handler in ((listing, _list), (read, _read), (rescale, _rescale)):
        action.add_argument("location", help="checkpoint location: a path or an fsspec URL")
        action.add_argument("--storage-options", default=None, help="fsspec options as a JSON object")
        if action is not listing:
            action.add_argument("--operator", required=True, help="the operator's name")
            action.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        action.set_defaults(handler=handler)
