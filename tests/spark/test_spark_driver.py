"""The driver's checks and reports (:mod:`consumer.spark.driver`) without a Spark session: what
breaks group semantics is refused (speculation, auto-commit), every run option checked in one
line, a failed job's account one line. (Group jobs on Spark: ``test_spark.py``.)"""
import pytest

from consumer.spark.driver import (SparkJobError, _check_run_options, _checked_topics, _checked_worker_config,
                                   _one_line, check_spark_conf)
from coordinator.errors import InvalidConfig, InvalidName

OPTIONS = dict(mode="drain", workers=2, align=None, duration_s=None, trigger_interval_s=None, max_worker_deaths=3,
               death_window_s=60.0, progress_interval_s=None, metrics_port=None)


def test_speculation_is_refused_and_anything_else_goes():
    with pytest.raises(SparkJobError, match="spark.speculation is true"):
        check_spark_conf({"spark.speculation": " TRUE "})
    check_spark_conf({})
    check_spark_conf({"spark.speculation": "false"})


@pytest.mark.parametrize("change, message", [
    (dict(mode="batch"), "mode must be drain or stream, not 'batch'"),
    (dict(workers=0), "workers must be a whole number >= 1, got 0"),
    (dict(align=1.5), "align must be a whole number >= 1"),
    (dict(duration_s=0), "duration_s must be > 0"),
    (dict(max_worker_deaths=-1), "max_worker_deaths must be a whole number >= 0"),
    (dict(death_window_s=0), "death_window_s must be > 0"),
])
def test_every_run_option_is_checked_in_one_line(change, message):
    _check_run_options(**OPTIONS)
    with pytest.raises(InvalidConfig, match=message):
        _check_run_options(**{**OPTIONS, **change})


def test_topics_and_the_workers_consumer_settings_are_checked_on_the_driver():
    assert _checked_topics("g", "orders") == ["orders"]
    with pytest.raises(InvalidConfig, match="give at least one topic"):
        _checked_topics("g", [])
    with pytest.raises(InvalidName, match="topic name 'bad name' is illegal"):
        _checked_topics("g", ["bad name"])
    with pytest.raises(InvalidConfig, match="enable_auto_commit cannot be used"):
        _checked_worker_config({"enable_auto_commit": True})
    with pytest.raises(InvalidConfig, match="unknown key 'max_poll_record'"):
        _checked_worker_config({"max_poll_record": 5})
    assert "enable_auto_commit" not in _checked_worker_config({"max_poll_records": 5})


def test_a_failed_jobs_account_is_its_last_python_exception_else_sparks_reason():
    python = Exception("Job aborted.\nTraceback (most recent call last):\n  File x\nValueError: bad record 7\n")
    assert _one_line(python) == "ValueError: bad record 7"
    lost = Exception("Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: "
                     "Lost task 0.3 in stage 1.0 (TID 7): org.apache.spark.SparkException: Python worker exited "
                     "unexpectedly (crashed)")
    assert _one_line(lost) == "Python worker exited unexpectedly (crashed)"
    assert _one_line(Exception("[CANNOT_OPEN] no such file")) == "no such file"
