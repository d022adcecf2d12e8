"""``batchline demo``, ``batchline run PIPELINE.py`` and ``batchline checkpoints ...``."""

from __future__ import annotations

import argparse
import logging
import runpy
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from types import FrameType

from batchline.api.context import StreamingContext
from batchline.cli.checkpoints import add_checkpoint_commands
from batchline.cli.demo import build_demo
from batchline.cli.progress import BatchSummaryPrinter
from batchline.cli.state import add_state_commands
from batchline.errors import BatchlineError
from batchline.spark import check_java, local_spark_session

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _stop_on_ctrl_c(ssc: StreamingContext) -> None:
    """First Ctrl-C: graceful stop. Second: immediate stop."""
    presses = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        graceful = presses == 1
        if graceful:
            print("\nStopping gracefully: finishing received data and running batches "
                  "(Ctrl-C again to stop immediately)...", flush=True)
        else:
            print("\nStopping immediately...", flush=True)
        threading.Thread(target=ssc.stop, kwargs={"graceful": graceful}, daemon=True).start()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def _await(ssc: StreamingContext, duration: float | None) -> None:
    if duration is not None and not ssc.await_termination(duration):
        print(f"\nRan for {duration:g} s; stopping gracefully...", flush=True)
        ssc.stop(graceful=True)
    while not ssc.await_termination(0.5):
        pass


def _demo(args: argparse.Namespace) -> int:
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="batchline-demo-checkpoint-")
    spark = local_spark_session(args.master, "batchline-demo")
    ssc = StreamingContext(spark, args.batch_interval, checkpoint=checkpoint)
    build_demo(ssc, rate=args.rate, users=args.users)
    ssc.add_listener(BatchSummaryPrinter())
    _stop_on_ctrl_c(ssc)
    print(f"batchline demo: {args.rate:g} events/s from {args.users} users, batches every "
          f"{args.batch_interval} on {args.master}, checkpoints in {checkpoint}. Ctrl-C stops gracefully; "
          f"--checkpoint {checkpoint} resumes.", flush=True)
    ssc.start()
    _await(ssc, args.duration)
    print("Stopped gracefully." if ssc.state.value == "stopped" else "Stopped.", flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    check_java()  # before the pipeline's own SparkSession, which would fail with a Py4J trace
    runpy.run_path(args.pipeline, run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchline", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log the scheduler's INFO lines")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the demo pipeline on local Spark with generated events")
    demo.add_argument("--rate", type=float, default=2000, help="events per second (default 2000)")
    demo.add_argument("--users", type=int, default=100, help="distinct user ids (default 100)")
    demo.add_argument("--batch-interval", default="2s", help="batch interval (default 2s)")
    demo.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    demo.add_argument("--duration", type=float, default=None, help="stop gracefully after this many seconds")
    demo.add_argument("--checkpoint", default=None,
                      help="checkpoint directory to resume from (default: a new temporary directory)")
    demo.set_defaults(handler=_demo)

    run = commands.add_parser("run", help="run a pipeline file (a Python script that builds and starts it)")
    run.add_argument("pipeline", help="path to the pipeline's .py file")
    run.set_defaults(handler=_run)

    add_checkpoint_commands(commands)
    add_state_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.handler(args))
    except BatchlineError as error:
        print(f"batchline: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
