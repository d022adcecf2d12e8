"""Exclude-on-failure settings (SPEC H1): the seed's knobs as Spark's settings, the old
``spark.blacklist.*`` names translated, inconsistent settings refused before Spark starts.

Key names and checks are compared with Spark's own: its registered config entries and its
health tracker's validation, through the JVM of the suite's session; one test starts a
session of its own (in a child process) to read the settings back from a running Spark.
"""

import datetime as dt
import json
import logging
import subprocess
import sys
import textwrap

import pytest

from batchline.errors import ConfigurationError
from batchline.exclusion import LEGACY_KEYS, ExcludeOnFailure, check_exclusion_conf, translate_legacy_conf
from batchline.spark import STATUS_RETENTION, local_spark_session, session_conf

SPARK_DEFAULTS = {
    "spark.excludeOnFailure.enabled": "true",
    "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor": "1",
    "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "2",
    "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor": "2",
    "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": "2",
    "spark.excludeOnFailure.application.maxFailedTasksPerExecutor": "2",
    "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": "2",
    "spark.excludeOnFailure.timeout": "3600000ms",
    "spark.excludeOnFailure.killExcludedExecutors": "false",
    "spark.task.maxFailures": "4",
}


def test_the_defaults_are_sparks_with_exclusion_on():
    assert ExcludeOnFailure().spark_conf() == SPARK_DEFAULTS


def test_every_knob_reaches_its_spark_setting():
    settings = ExcludeOnFailure(
        max_task_attempts_per_executor=2, max_task_attempts_per_node=3, stage_max_failed_tasks_per_executor=4,
        stage_max_failed_executors_per_node=5, application_max_failed_tasks_per_executor=6,
        application_max_failed_executors_per_node=7, timeout=dt.timedelta(minutes=10), kill_excluded_executors=True,
        task_max_failures=8,
    )
    assert settings.spark_conf() == {
        "spark.excludeOnFailure.enabled": "true",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor": "2",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "3",
        "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor": "4",
        "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": "5",
        "spark.excludeOnFailure.application.maxFailedTasksPerExecutor": "6",
        "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": "7",
        "spark.excludeOnFailure.timeout": "600000ms",
        "spark.excludeOnFailure.killExcludedExecutors": "true",
        "spark.task.maxFailures": "8",
    }
    assert ExcludeOnFailure(timeout="90s").timeout_ms == 90_000


def test_turned_off_it_sets_only_the_switch():
    assert ExcludeOnFailure(enabled=False).spark_conf() == {"spark.excludeOnFailure.enabled": "false"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_task_attempts_per_node": 4},
     r"max_task_attempts_per_node \(spark.excludeOnFailure.task.maxTaskAttemptsPerNode\) is 4, but a task fails "
     r"for good after 4 attempts \(spark.task.maxFailures\).*bad node.*Lower it below 4, or raise "
     r"spark.task.maxFailures above 4"),
    ({"max_task_attempts_per_executor": 3, "max_task_attempts_per_node": 2, "task_max_failures": 3},
     r"max_task_attempts_per_executor .* is 3, but a task fails for good after 3 attempts .*bad executor"),
    ({"stage_max_failed_tasks_per_executor": 0}, r"stage_max_failed_tasks_per_executor .* at least 1; got 0"),
    ({"application_max_failed_executors_per_node": True}, r"whole number of at least 1; got True"),
    ({"task_max_failures": 0}, r"task_max_failures \(spark.task.maxFailures\) .* got 0"),
    ({"timeout": "soon"}, r"ExcludeOnFailure.timeout 'soon' is not a duration"),
    ({"kill_excluded_executors": "yes"}, r"kill_excluded_executors is True or False; got 'yes'"),
])
def test_inconsistent_settings_are_refused_with_what_to_change(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        ExcludeOnFailure(**kwargs)


def test_the_old_blacklist_names_are_translated_with_a_warning_naming_the_new_key(caplog):
    old = {
        "spark.blacklist.enabled": True,
        "spark.blacklist.task.maxTaskAttemptsPerExecutor": 1,
        "spark.blacklist.task.maxTaskAttemptsPerNode": 2,
        "spark.blacklist.stage.maxFailedTasksPerExecutor": 2,
        "spark.blacklist.stage.maxFailedExecutorsPerNode": 2,
        "spark.blacklist.application.maxFailedTasksPerExecutor": 3,
        "spark.blacklist.application.maxFailedExecutorsPerNode": 3,
        "spark.blacklist.timeout": "30min",
        "spark.blacklist.killBlacklistedExecutors": "true",
        "spark.executor.memory": "1g",
    }
    with caplog.at_level(logging.WARNING, logger="batchline.exclusion"):
        translated = translate_legacy_conf(old)
    assert translated == {
        "spark.executor.memory": "1g",
        "spark.excludeOnFailure.enabled": "true",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor": "1",
        "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "2",
        "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor": "2",
        "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode": "2",
        "spark.excludeOnFailure.application.maxFailedTasksPerExecutor": "3",
        "spark.excludeOnFailure.application.maxFailedExecutorsPerNode": "3",
        "spark.excludeOnFailure.timeout": "30min",
        "spark.excludeOnFailure.killExcludedExecutors": "true",
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 9
    assert ("Spark setting 'spark.blacklist.killBlacklistedExecutors' is deprecated: Spark 3.1 renamed it to "
            "'spark.excludeOnFailure.killExcludedExecutors' and Spark 4 ignores the old name, so batchline passes it "
            "on as spark.excludeOnFailure.killExcludedExecutors=true. Rename it in your settings") in warnings


def test_an_old_and_a_new_name_that_disagree_are_refused():
    with pytest.raises(ConfigurationError, match=(
            r"spark.blacklist.timeout='1h' and spark.excludeOnFailure.timeout='10min' disagree: "
            r"'spark.blacklist.timeout' is the old name of 'spark.excludeOnFailure.timeout'.*Keep only")):
        translate_legacy_conf({"spark.blacklist.timeout": "1h", "spark.excludeOnFailure.timeout": "10min"})


def test_an_old_and_a_new_name_that_agree_keep_the_new_one(caplog):
    with caplog.at_level(logging.WARNING, logger="batchline.exclusion"):
        translated = translate_legacy_conf({"spark.blacklist.enabled": "True", "spark.excludeOnFailure.enabled": True})
    assert translated == {"spark.excludeOnFailure.enabled": "true"}
    assert "remove 'spark.blacklist.enabled' from your settings" in caplog.text
    same_time = translate_legacy_conf({"spark.blacklist.timeout": "1h", "spark.excludeOnFailure.timeout": "60min"})
    assert same_time == {"spark.excludeOnFailure.timeout": "60min"}


def test_settings_given_as_spark_keys_are_checked_too():
    check_exclusion_conf({"spark.excludeOnFailure.enabled": "false", "spark.task.maxFailures": "1"})  # off: anything
    with pytest.raises(ConfigurationError, match=r"Spark setting spark.excludeOnFailure.task.maxTaskAttemptsPerNode "
                                                 r"is 2, but a task fails for good after 2 attempts"):
        check_exclusion_conf({"spark.excludeOnFailure.enabled": "true", "spark.task.maxFailures": "2"})
    with pytest.raises(ConfigurationError, match=r"stage.maxFailedTasksPerExecutor is a whole number; got 'two'"):
        check_exclusion_conf({"spark.excludeOnFailure.enabled": "true",
                              "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor": "two"})


def test_the_session_settings_merge_conf_and_exclusion(caplog):
    with caplog.at_level(logging.WARNING, logger="batchline.exclusion"):
        settings = session_conf(shuffle_partitions=3, conf={"spark.blacklist.timeout": "20min",
                                                            "spark.executor.cores": 1},
                                exclude_on_failure=ExcludeOnFailure(timeout="20min", max_task_attempts_per_node=3))
    assert settings == {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "3", "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false", **STATUS_RETENTION, "spark.executor.cores": "1",
        **SPARK_DEFAULTS, "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "3",
        "spark.excludeOnFailure.timeout": "1200000ms",
    }
    assert "'spark.excludeOnFailure.timeout'" in caplog.text
    with pytest.raises(ConfigurationError, match=r"spark.task.maxFailures is '8' in conf but '4' in "
                                                 r"exclude_on_failure; set it in one place"):
        session_conf(conf={"spark.task.maxFailures": 8}, exclude_on_failure=ExcludeOnFailure())
    with pytest.raises(ConfigurationError, match="maxTaskAttemptsPerNode is 3, but a task fails for good after 3"):
        session_conf(conf={"spark.blacklist.enabled": "true", "spark.blacklist.task.maxTaskAttemptsPerNode": "3",
                           "spark.task.maxFailures": "3"})


# ------------------------------------------------------------------ against Spark itself
def _jvm_object(spark, name):
    jvm = spark.sparkContext._jvm
    package, _, cls = name.rpartition(".")
    return getattr(getattr(jvm, package).__getattr__(cls + "$"), "MODULE$")


def _java_conf(spark, settings):
    conf = spark.sparkContext._jvm.org.apache.spark.SparkConf(False)
    for key, value in settings.items():
        conf.set(key, value)
    return conf


def test_spark_knows_every_new_name_and_no_longer_reads_the_old_ones(spark):
    entries = _jvm_object(spark, "org.apache.spark.internal.config.ConfigEntry")
    _jvm_object(spark, "org.apache.spark.internal.config.package")  # registers the core entries
    _jvm_object(spark, "org.apache.spark.deploy.yarn.config.package")  # and YARN's
    for old, new in LEGACY_KEYS.items():
        entry = entries.findEntry(new)
        assert entry is not None, f"Spark has no setting {new} (the new name of {old})"
        alternatives = [entry.alternatives().apply(i) for i in range(entry.alternatives().size())]
        assert old not in alternatives, f"Spark 4 still reads {old}; the translation would be redundant"
    for key in ExcludeOnFailure().spark_conf():
        assert entries.findEntry(key) is not None, key


def test_spark_reads_the_values_and_agrees_with_the_checks(spark):
    config = _jvm_object(spark, "org.apache.spark.internal.config.package")
    tracker = _jvm_object(spark, "org.apache.spark.scheduler.HealthTracker")
    settings = ExcludeOnFailure(max_task_attempts_per_node=3, stage_max_failed_executors_per_node=5,
                                timeout="15min", kill_excluded_executors=True, task_max_failures=5)
    conf = _java_conf(spark, settings.spark_conf())
    assert tracker.isExcludeOnFailureEnabled(conf)
    tracker.validateExcludeOnFailureConfs(conf)  # raises if Spark would refuse to start
    assert conf.get(config.MAX_TASK_ATTEMPTS_PER_NODE()) == 3
    assert conf.get(config.MAX_FAILED_EXEC_PER_NODE_STAGE()) == 5
    assert conf.get(config.EXCLUDE_ON_FAILURE_KILL_ENABLED()) is True
    assert conf.get(config.TASK_MAX_FAILURES()) == 5
    assert tracker.getExcludeOnFailureTimeout(conf) == 15 * 60_000
    assert not tracker.isExcludeOnFailureEnabled(_java_conf(spark, ExcludeOnFailure(enabled=False).spark_conf()))

    # What batchline refuses, Spark would refuse to start with (its error is just harder to read).
    refused = {**ExcludeOnFailure().spark_conf(), "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "4"}
    with pytest.raises(ConfigurationError):
        check_exclusion_conf(refused)
    with pytest.raises(Exception, match=r"maxTaskAttemptsPerNode \( = 4\) was >= spark.task.maxFailures"):
        tracker.validateExcludeOnFailureConfs(_java_conf(spark, refused))


def test_a_running_session_keeps_its_settings_and_says_which_did_not_take_effect(spark, caplog):
    with caplog.at_level(logging.WARNING, logger="batchline.spark"):
        same = local_spark_session("local[2]", "batchline-tests", shuffle_partitions=2,
                                   exclude_on_failure=ExcludeOnFailure())
    assert same.sparkContext is spark.sparkContext
    [warning] = [r.getMessage() for r in caplog.records if r.name == "batchline.spark"]
    assert warning.startswith("Spark was already running, so these settings did not take effect: ")
    assert "spark.excludeOnFailure.enabled=true" in warning and "spark.task.maxFailures=4" in warning


def test_jvm_options_that_spark_extends_with_its_own_count_as_applied():
    """Spark puts its own options (``--add-opens``, ...) before the JVM options asked for: a
    running session that has them is not reported as missing them."""
    from batchline.spark import _applied

    running = "-Djava.net.preferIPv6Addresses=false --add-opens=java.base/java.lang=ALL-UNNAMED -Xms1g"
    assert _applied(running, "-Xms1g", "spark.driver.extraJavaOptions")
    assert not _applied(running, "-XX:+AlwaysPreTouch", "spark.driver.extraJavaOptions")
    assert not _applied(running, "-Xms1", "spark.driver.extraJavaOptions")  # whole options, not a prefix
    assert not _applied("4", "5", "spark.task.maxFailures")
    assert not _applied(None, "-Xms1g", "spark.driver.extraJavaOptions")


_CHILD = textwrap.dedent("""
    import json, sys
    from batchline.exclusion import ExcludeOnFailure
    from batchline.spark import local_spark_session

    spark = local_spark_session("local[1]", "exclusion-settings", conf={"spark.blacklist.timeout": "20min"},
                                exclude_on_failure=ExcludeOnFailure(max_task_attempts_per_node=3, timeout="20min",
                                                                    kill_excluded_executors=True))
    conf = dict(spark.sparkContext.getConf().getAll())
    tracker = spark.sparkContext._jsc.sc().taskScheduler().healthTrackerOpt()
    print(json.dumps({"conf": conf, "tracker": tracker.isDefined()}))
    spark.stop()
""")


@pytest.mark.spark  # starts Spark in a process of its own
def test_a_new_session_runs_with_the_settings(tmp_path):
    """A session of its own (the suite's is already running), in a child process."""
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    conf = result["conf"]
    expected = {**SPARK_DEFAULTS, "spark.excludeOnFailure.task.maxTaskAttemptsPerNode": "3",
                "spark.excludeOnFailure.killExcludedExecutors": "true",
                "spark.excludeOnFailure.timeout": "1200000ms"}
    assert {k: conf.get(k) for k in expected} == expected
    assert not any(k.startswith("spark.blacklist.") for k in conf)
    assert result["tracker"], "Spark did not start its health tracker: exclusion is off"
    assert "spark.blacklist.timeout' is deprecated" in done.stderr
