"""Spark's exclude-on-failure, the successor of blacklisting, as batchline settings (SPEC H1).

When tasks keep failing on one executor or node (a bad disk, a broken library, a worker that
lost its credentials), Spark can stop scheduling there instead of failing the same task on it
until the job aborts. :class:`ExcludeOnFailure` holds the knobs of seed 003 and maps them onto
Spark's ``spark.excludeOnFailure.*`` settings; :func:`translate_legacy_conf` accepts the
``spark.blacklist.*`` names the seed uses. Spark 3.1 renamed them and Spark 4 no longer reads
the old names at all (it only warns "Not used anymore"), so batchline translates them, with a
WARN naming the new key.

The three levels, as Spark counts them:
- task: how often one task may fail on one executor, or on one node, before it is kept off
  that executor or node (``max_task_attempts_per_executor`` / ``..._per_node``);
- stage: how many different tasks of one stage may fail on an executor before the executor is
  excluded for the stage, and how many executors of a node may be excluded for the stage
  before the whole node is (``stage_max_failed_tasks_per_executor`` /
  ``stage_max_failed_executors_per_node``);
- application: the same two counts over successful task sets, excluding for the whole
  application until ``timeout`` passes (``application_max_failed_tasks_per_executor`` /
  ``application_max_failed_executors_per_node``); ``kill_excluded_executors`` also kills them.

A task is retried at most ``spark.task.maxFailures`` times in all (``task_max_failures``), so
exclusion only helps when a task may fail on one executor or node fewer times than that: Spark
refuses to start otherwise, and batchline says so before Spark starts. A ``local[N]`` master
never retries a task (``local[N,F]`` allows F attempts), so exclusion needs a cluster master.
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from batchline.durations import parse_duration_ms
from batchline.errors import ConfigurationError

__all__ = [
    "ExcludeOnFailure",
    "LEGACY_KEYS",
    "check_exclusion_conf",
    "conf_value",
    "same_value",
    "translate_legacy_conf",
]

logger = logging.getLogger(__name__)

ENABLED = "spark.excludeOnFailure.enabled"
TASK_ATTEMPTS_PER_EXECUTOR = "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor"
TASK_ATTEMPTS_PER_NODE = "spark.excludeOnFailure.task.maxTaskAttemptsPerNode"
STAGE_FAILED_TASKS_PER_EXECUTOR = "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor"
STAGE_FAILED_EXECUTORS_PER_NODE = "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode"
APP_FAILED_TASKS_PER_EXECUTOR = "spark.excludeOnFailure.application.maxFailedTasksPerExecutor"
APP_FAILED_EXECUTORS_PER_NODE = "spark.excludeOnFailure.application.maxFailedExecutorsPerNode"
TIMEOUT = "spark.excludeOnFailure.timeout"
KILL_EXCLUDED_EXECUTORS = "spark.excludeOnFailure.killExcludedExecutors"
TASK_MAX_FAILURES = "spark.task.maxFailures"

SPARK_DEFAULT_TASK_MAX_FAILURES = 4

LEGACY_KEYS: Mapping[str, str] = {
    "spark.blacklist.enabled": ENABLED,
    "spark.blacklist.task.maxTaskAttemptsPerExecutor": TASK_ATTEMPTS_PER_EXECUTOR,
    "spark.blacklist.task.maxTaskAttemptsPerNode": TASK_ATTEMPTS_PER_NODE,
    "spark.blacklist.stage.maxFailedTasksPerExecutor": STAGE_FAILED_TASKS_PER_EXECUTOR,
    "spark.blacklist.stage.maxFailedExecutorsPerNode": STAGE_FAILED_EXECUTORS_PER_NODE,
    "spark.blacklist.application.maxFailedTasksPerExecutor": APP_FAILED_TASKS_PER_EXECUTOR,
    "spark.blacklist.application.maxFailedExecutorsPerNode": APP_FAILED_EXECUTORS_PER_NODE,
    "spark.blacklist.timeout": TIMEOUT,
    "spark.blacklist.killBlacklistedExecutors": KILL_EXCLUDED_EXECUTORS,
    "spark.blacklist.application.fetchFailure.enabled": "spark.excludeOnFailure.application.fetchFailure.enabled",
    "spark.scheduler.blacklist.unschedulableTaskSetTimeout":
        "spark.scheduler.excludeOnFailure.unschedulableTaskSetTimeout",
    "spark.yarn.blacklist.executor.launch.blacklisting.enabled": "spark.yarn.executor.launch.excludeOnFailure.enabled",
    # The pre-2.1 switch: a positive time turns exclusion on for that long, 0 turns it off.
    # Spark still reads the renamed key (internal, with that meaning) when .enabled is unset.
    "spark.scheduler.executorTaskBlacklistTime": "spark.scheduler.executorTaskExcludeOnFailureTime",
}
"""Old blacklisting setting -> the exclude-on-failure setting Spark reads now, as Spark's own
deprecation table lists them (``SparkConf.deprecatedConfigs``, Spark 3.1 onwards)."""

# The counts Spark requires to be positive, with its defaults, and the field that sets each.
_COUNTS: tuple[tuple[str, str, int], ...] = (
    ("max_task_attempts_per_executor", TASK_ATTEMPTS_PER_EXECUTOR, 1),
    ("max_task_attempts_per_node", TASK_ATTEMPTS_PER_NODE, 2),
    ("stage_max_failed_tasks_per_executor", STAGE_FAILED_TASKS_PER_EXECUTOR, 2),
    ("stage_max_failed_executors_per_node", STAGE_FAILED_EXECUTORS_PER_NODE, 2),
    ("application_max_failed_tasks_per_executor", APP_FAILED_TASKS_PER_EXECUTOR, 2),
    ("application_max_failed_executors_per_node", APP_FAILED_EXECUTORS_PER_NODE, 2),
)


@dataclass(frozen=True)
class ExcludeOnFailure:
    """Exclude-on-failure settings; ``spark_conf()`` gives them as Spark settings.

    The defaults are Spark's, with exclusion turned on. ``timeout`` is a duration ("1h",
    "10 minutes", a timedelta, or seconds). See the module's documentation for what each
    count means.
    """

    enabled: bool = True
    max_task_attempts_per_executor: int = 1
    max_task_attempts_per_node: int = 2
    stage_max_failed_tasks_per_executor: int = 2
    stage_max_failed_executors_per_node: int = 2
    application_max_failed_tasks_per_executor: int = 2
    application_max_failed_executors_per_node: int = 2
    timeout: object = "1h"
    kill_excluded_executors: bool = False
    task_max_failures: int = SPARK_DEFAULT_TASK_MAX_FAILURES
    """``spark.task.maxFailures``: how many times a task may fail in all before its job fails."""

    def __post_init__(self) -> None:
        for name in ("enabled", "kill_excluded_executors"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"ExcludeOnFailure.{name} is True or False; got {getattr(self, name)!r}")
        for name, key, _ in (*_COUNTS, ("task_max_failures", TASK_MAX_FAILURES, SPARK_DEFAULT_TASK_MAX_FAILURES)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"ExcludeOnFailure.{name} ({key}) is a whole number of at least 1; "
                                         f"got {value!r}")
        parse_duration_ms(self.timeout, "ExcludeOnFailure.timeout")
        _check_attempts(self.max_task_attempts_per_executor, self.max_task_attempts_per_node, self.task_max_failures,
                        lambda key: f"ExcludeOnFailure.{_field_of(key)} ({key})")

    @property
    def timeout_ms(self) -> int:
        return parse_duration_ms(self.timeout, "ExcludeOnFailure.timeout")

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings these stand for (only the switch when exclusion is off)."""
        if not self.enabled:
            return {ENABLED: "false"}
        conf = {ENABLED: "true"}
        conf.update({key: str(getattr(self, name)) for name, key, _ in _COUNTS})
        conf[TIMEOUT] = f"{self.timeout_ms}ms"
        conf[KILL_EXCLUDED_EXECUTORS] = conf_value(self.kill_excluded_executors)
        conf[TASK_MAX_FAILURES] = str(self.task_max_failures)
        return conf


def conf_value(value: object) -> str:
    """A Spark setting's value as the string Spark reads: booleans in lower case, a timedelta
    in milliseconds, anything else as ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.timedelta):
        return f"{value // _dt.timedelta(milliseconds=1)}ms"
    return str(value).strip()


def translate_legacy_conf(conf: Mapping[str, object]) -> dict[str, str]:
    """``conf`` as strings, with every old ``spark.blacklist.*`` name (see ``LEGACY_KEYS``)
    replaced by its ``spark.excludeOnFailure.*`` name, each with a WARN naming the new key.

    Raises ``ConfigurationError`` when an old name and its new name are both given with
    different values: which one was meant cannot be guessed.
    """
    translated = {key: conf_value(value) for key, value in conf.items() if key not in LEGACY_KEYS}
    for old, value in conf.items():
        new = LEGACY_KEYS.get(old)
        if new is None:
            continue
        old_value = conf_value(value)
        if new in conf:
            new_value = conf_value(conf[new])
            if not same_value(new, old_value, new_value):
                raise ConfigurationError(
                    f"the Spark settings {old}={old_value!r} and {new}={new_value!r} disagree: {old!r} is the old "
                    f"name of {new!r} (Spark renamed blacklisting to exclude-on-failure in 3.1). Keep only {new!r}, "
                    "with the value you mean"
                )
            logger.warning("Spark setting %r is the old name of %r, which is also set (to the same value); "
                           "remove %r from your settings", old, new, old)
            continue
        logger.warning("Spark setting %r is deprecated: Spark 3.1 renamed it to %r and Spark 4 ignores the old "
                       "name, so batchline passes it on as %s=%s. Rename it in your settings", old, new, new,
                       old_value)
        translated[new] = old_value
    return translated


def check_exclusion_conf(conf: Mapping[str, str]) -> None:
    """Check Spark settings the way Spark's health tracker will when exclusion is on, but
    before Spark starts and with a message that says what to change: every count is at least
    1, and a task may fail on one executor and on one node fewer times than
    ``spark.task.maxFailures``, or no task could ever be moved away from a bad one."""
    if conf.get(ENABLED, "false").strip().lower() != "true":
        return
    counts = {key: _int_setting(conf, key, default) for _, key, default in _COUNTS}
    for key, value in counts.items():
        if value < 1:
            raise ConfigurationError(f"Spark setting {key} must be at least 1 when {ENABLED} is true; got {value}")
    max_failures = _int_setting(conf, TASK_MAX_FAILURES, SPARK_DEFAULT_TASK_MAX_FAILURES)
    _check_attempts(counts[TASK_ATTEMPTS_PER_EXECUTOR], counts[TASK_ATTEMPTS_PER_NODE], max_failures,
                    lambda key: f"Spark setting {key}")


def _check_attempts(per_executor: int, per_node: int, max_failures: int, name: Callable[[str], str]) -> None:
    for key, attempts, where in ((TASK_ATTEMPTS_PER_EXECUTOR, per_executor, "executor"),
                                 (TASK_ATTEMPTS_PER_NODE, per_node, "node")):
        if attempts >= max_failures:
            raise ConfigurationError(
                f"{name(key)} is {attempts}, but a task fails for good after {max_failures} attempts "
                f"({TASK_MAX_FAILURES}), so its job would fail before a bad {where} is excluded for it. Lower it "
                f"below {max_failures}, or raise {TASK_MAX_FAILURES} above {attempts}"
            )


def _field_of(key: str) -> str:
    return next(name for name, k, _ in _COUNTS if k == key)


def _int_setting(conf: Mapping[str, str], key: str, default: int) -> int:
    raw = conf.get(key)
    if raw is None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ConfigurationError(f"Spark setting {key} is a whole number; got {raw!r}") from None


def same_value(key: str, a: str, b: str) -> bool:
    """Whether two values of Spark setting ``key`` mean the same: booleans in any case, numbers
    with blanks around, times in any unit ("20min", "1200s", "1200000ms")."""
    a, b = a.strip().lower(), b.strip().lower()
    if a == b:
        return True
    if key in _TIME_KEYS:
        a_ms, b_ms = _spark_time_ms(a), _spark_time_ms(b)
        return a_ms is not None and a_ms == b_ms
    return False


_TIME_KEYS = frozenset({TIMEOUT, "spark.scheduler.excludeOnFailure.unschedulableTaskSetTimeout",
                        "spark.scheduler.executorTaskExcludeOnFailureTime"})
_SPARK_TIME = re.compile(r"^(\d+)\s*(us|ms|s|m|min|h|d)?$")
_SPARK_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _spark_time_ms(value: str) -> float | None:
    """A Spark time setting in milliseconds (a bare number is milliseconds), or None."""
    match = _SPARK_TIME.match(value)
    if match is None:
        return None
    return int(match.group(1)) * _SPARK_TIME_UNITS_MS[match.group(2) or "ms"]
