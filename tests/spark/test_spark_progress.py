"""A run's progress as the driver reads it (:mod:`consumer.spark.progress`): every attempt's
last report (an unreadable one left out), and the line the driver logs: records and batches
of every attempt, the workers up, the lag of the live ones. Real ZooKeeper, no Spark."""
from __future__ import annotations

import logging

from coordinator import protocol
from consumer.spark.progress import ProgressReporter, read_progress

RUN = "run"


def report(zk, attempt, records, batches, lag):
    zk.create(f"{protocol.spark_progress_path(RUN)}/{attempt}",
              protocol.encode_spark_progress(protocol.SparkProgress(records, batches, lag, 1.0)), makepath=True)


def test_every_attempts_last_report_is_read_and_an_unreadable_one_left_out(zk, caplog):
    assert read_progress(zk, RUN) == {}
    report(zk, "m-1", 10, 2, 0)
    zk.create(f"{protocol.spark_progress_path(RUN)}/m-2", b"not json")
    with caplog.at_level(logging.WARNING, logger="zkgroups.spark"):
        found = read_progress(zk, RUN)
    assert list(found) == ["m-1"] and found["m-1"].records == 10
    assert any("m-2" in r.getMessage() for r in caplog.records)


def test_the_line_counts_every_attempt_and_the_lag_of_the_live_workers(zk):
    report(zk, "m-1", 1000, 10, 3)   # gone: its records count, its lag does not
    report(zk, "m-2", 500, 5, 7)
    report(zk, "m-3", 0, 0, None)
    zk.ensure_path(f"{protocol.spark_workers_path(RUN)}/m-2")
    reporter = ProgressReporter(zk, "g", RUN, partitions=[], end_offsets={}, interval_s=None)
    assert reporter.line() == "group g run run: 1,500 records in 15 batches, 1 workers up, lag 7"
    zk.ensure_path(f"{protocol.spark_workers_path(RUN)}/m-3")  # a live worker that does not know its lag
    assert reporter.snapshot().lag is None and reporter.line().endswith("2 workers up, lag -")
