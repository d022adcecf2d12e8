"""``batchline demo``, ``batchline run PIPELINE.py``, ``batchline status|stop LOCATION`` and
``batchline checkpoints ...``."""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from batchline.api.context import StreamingContext
from batchline.api.launch import LaunchDefaults, set_launch_defaults
from batchline.cli.checkpoints import add_checkpoint_commands
from batchline.cli.demo import build_demo
from batchline.cli.operate import add_operate_commands
from batchline.cli.ship import package_folder
from batchline.cli.state import add_state_commands
from batchline.errors import BatchlineError
from batchline.observe.access import check_token, with_token
from batchline.observe.summary import BatchSummaryPrinter
from batchline.spark import check_java, local_spark_session

__all__ = ["main"]

logger = logging.getLogger(__name__)

DEFAULT_DASHBOARD_PORT = 4050
DEFAULT_METRICS_PORT = 9464
DEFAULT_HOST = "127.0.0.1"
ACCESS_TOKEN_VARIABLE = "BATCHLINE_ACCESS_TOKEN"
"""The environment variable ``--access-token`` defaults to: unlike an option, it does not show in
``ps`` to other users of the machine."""


def _configure_logging(command: str, verbose: bool) -> None:
    """WARNING and up from everything; ``batchline run`` adds batchline's INFO lines (the start
    line with the addresses, one line per batch, restarts, the stop); ``-v`` adds batchline's
    DEBUG lines (the scheduler's detail) to any command."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose:
        logging.getLogger("batchline").setLevel(logging.DEBUG)
    elif command == "run":
        logging.getLogger("batchline").setLevel(logging.INFO)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _await(ssc: StreamingContext, duration: float | None) -> None:
    """Until the pipeline stops: Ctrl-C (or SIGTERM) stops it through ``await_termination``'s
    handlers, and ``duration`` through a graceful stop of its own."""
    timer = None
    if duration is not None:
        def stop() -> None:
            print(f"\nRan for {duration:g} s; stopping gracefully...", flush=True)
            ssc.stop(graceful=True)

        timer = threading.Timer(duration, stop)
        timer.daemon = True
        timer.start()
    try:
        ssc.await_termination()
    finally:
        if timer is not None:
            timer.cancel()


def _demo(args: argparse.Namespace) -> int:
    dashboard_port, metrics_port = _observe_ports(args)  # first: a bad option fails before Spark starts
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="batchline-demo-checkpoint-")
    spark = local_spark_session(args.master, "batchline-demo")
    # The demo prints its own summary lines on stdout, beside the sessions it prints.
    ssc = StreamingContext(spark, args.batch_interval, checkpoint=checkpoint, name="batchline-demo",
                           dashboard_port=dashboard_port, metrics_port=metrics_port, dashboard_host=args.host,
                           metrics_host=args.host, access_token=args.access_token, log_batches=False)
    build_demo(ssc, rate=args.rate, users=args.users)
    ssc.add_listener(BatchSummaryPrinter())
    print(f"batchline demo: {args.rate:g} events/s from {args.users} users, batches every "
          f"{args.batch_interval} on {args.master}, checkpoints in {checkpoint}. Ctrl-C stops gracefully; "
          f"--checkpoint {checkpoint} resumes.", flush=True)
    ssc.start()
    # A token made at start is shown in the addresses (nowhere else tells it); a given one is not repeated.
    shown = ssc.access_token if args.access_token is None else None
    note = "" if ssc.access_token is None or shown is not None else " (with the access token given)"
    dashboard = with_token(ssc.dashboard_url, shown) + note if ssc.dashboard_url else "off"
    metrics = with_token(ssc.metrics_url, shown) + note if ssc.metrics_url else "off"
    print(f"dashboard: {dashboard}\nmetrics:   {metrics}\n"
          f"status:    batchline status {checkpoint}\nstop:      batchline stop {checkpoint}", flush=True)
    _await(ssc, args.duration)
    print("Stopped gracefully." if ssc.state.value == "stopped" else "Stopped.", flush=True)
    return 0


def port_or_any(port: int, host: str = DEFAULT_HOST) -> int:
    """``port`` when it is free on ``host``, else 0 (any free port): the demo's and ``run``'s
    default ports must not stop a second pipeline on the same machine."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except OSError:
        return port  # a host that does not resolve: binding to it says so, with its own error
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            logger.warning("Port %d is taken; using any free port instead", port)
            return 0
    return port


def _observe_ports(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The dashboard and metrics ports the demo and ``run`` use: on by default, on the usual
    ports when free (else any free port), off with ``--no-dashboard`` / ``--no-metrics``."""
    # Checked here too, so that a bad token is named as the option or variable it came from.
    check_token(args.access_token, f"--access-token (or ${ACCESS_TOKEN_VARIABLE})")
    dashboard = None if args.no_dashboard else (
        args.dashboard_port if args.dashboard_port is not None else port_or_any(DEFAULT_DASHBOARD_PORT, args.host))
    metrics = None if args.no_metrics else (
        args.metrics_port if args.metrics_port is not None else port_or_any(DEFAULT_METRICS_PORT, args.host))
    return dashboard, metrics


def _run(args: argparse.Namespace) -> int:
    check_java()  # before the pipeline's own SparkSession, which would fail with a Py4J trace
    script = Path(args.pipeline).resolve()
    if not script.is_file():
        print(f"batchline: no pipeline file at {args.pipeline}; give the path of a .py file", file=sys.stderr)
        return 1
    # The script's folder on the driver's path (as `python script.py` does) and, zipped, on the executors'.
    sys.path.insert(0, str(script.parent))
    dashboard_port, metrics_port = _observe_ports(args)
    set_launch_defaults(LaunchDefaults((package_folder(script.parent),), dashboard_port, metrics_port, args.host,
                                       args.access_token))
    sys.argv = [str(script), *args.args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _add_observe_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dashboard-port", type=int, default=None,
                        help=f"serve the dashboard on this port (default {DEFAULT_DASHBOARD_PORT}, or any free one)")
    parser.add_argument("--no-dashboard", action="store_true", help="no dashboard")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help=f"serve Prometheus metrics on this port (default {DEFAULT_METRICS_PORT}, or any free one)")
    parser.add_argument("--no-metrics", action="store_true", help="no metrics endpoint")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"the address the dashboard and metrics bind to (default {DEFAULT_HOST}; 0.0.0.0: every "
                             "interface). Off loopback they require an access token")
    parser.add_argument("--access-token", default=os.environ.get(ACCESS_TOKEN_VARIABLE) or None,
                        help="the token the dashboard and metrics require, on any address (default: "
                             f"${ACCESS_TOKEN_VARIABLE}; without either, one is made at start when --host is not "
                             "loopback and shown in the addresses printed at start)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchline", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log batchline's DEBUG lines too (the scheduler's detail)")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the demo pipeline on local Spark with generated events")
    demo.add_argument("--rate", type=float, default=2000, help="events per second (default 2000)")
    demo.add_argument("--users", type=int, default=100, help="distinct user ids (default 100)")
    demo.add_argument("--batch-interval", default="2s", help="batch interval (default 2s)")
    demo.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    demo.add_argument("--duration", type=float, default=None, help="stop gracefully after this many seconds")
    demo.add_argument("--checkpoint", default=None,
                      help="checkpoint directory to resume from (default: a new temporary directory)")
    _add_observe_options(demo)
    demo.set_defaults(handler=_demo)

    run = commands.add_parser(
        "run", help="run a pipeline file (a Python script that builds and starts it); the modules beside it are "
                    "shipped to the executors, and its contexts serve a dashboard and metrics unless they say not to")
    run.add_argument("pipeline", help="path to the pipeline's .py file (batchline's options go before it)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script (its sys.argv[1:])")
    _add_observe_options(run)
    run.set_defaults(handler=_run)

    add_operate_commands(commands)
    add_checkpoint_commands(commands)
    add_state_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.command, args.verbose)
    try:
        return int(args.handler(args))
    except BatchlineError as error:
        print(f"batchline: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
