"""The death budget and the reading of Spark's status tracker (consumer.spark.deaths: pure,
no Spark, no ZooKeeper), and a worker's recorded error line."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from coordinator import protocol
from consumer.spark.deaths import (BudgetState, DeathBudget, GroupAttempts, failed_attempts, settled_attempts,
                                   spent_line)


@pytest.mark.parametrize("limit, window, deaths, spent_at, spent_with", [
    # (time, how many) in order; the death that spends the budget (its index), and how many were in the window
    (3, 12.0, [(0, 1), (5.5, 1), (11, 1), (16.5, 1), (22, 1), (27.5, 1)], None, None),  # spread: never
    (3, 12.0, [(0, 1), (5.5, 1), (11, 1), (11.5, 1)], 3, 4),
    (3, 12.0, [(0, 4)], 0, 4),                     # four at once (a job's deaths counted at its end)
    (1, 0.5, [(t * 2.0, 1) for t in range(8)], None, None),
    (1, 0.5, [(0, 1), (2, 1), (2.4, 1), (9, 1)], 2, 2),
    (0, 60.0, [(100, 1)], 0, 1),                   # no death allowed
    (2, 10.0, [(0, 1), (10, 1), (20, 1), (30, 1)], None, None),  # a death exactly a window old is out
])
def test_the_budget_is_spent_by_more_than_limit_deaths_within_the_window(limit, window, deaths, spent_at,
                                                                         spent_with):
    budget = DeathBudget(limit, window)
    spent = [i for i, (t, n) in enumerate(deaths) if budget.add(t, n)]
    assert spent == ([] if spent_at is None else [spent_at])
    assert budget.spent_with == spent_with
    assert budget.state is (BudgetState.WITHIN if spent_at is None else BudgetState.SPENT)


def test_a_spent_budget_stays_spent():
    budget = DeathBudget(1, 1.0)
    assert not budget.add(0.0) and budget.add(0.5)
    assert not budget.add(100.0) and not budget.within and budget.spent_with == 2


def test_the_line_of_a_spent_budget_names_the_death_that_spent_it():
    budget = DeathBudget(2, 600)
    budget.add(0.0, 3)
    head = "3 failed worker task attempts within 600 s (at most 2): "
    assert spent_line(budget, 0, 2, "ValueError: x", "Python worker exited unexpectedly (crashed)") == \
        head + "ValueError: x"                             # the attempt's own error, not its job's last one
    assert spent_line(budget, 0, 2, "", "Python worker exited unexpectedly (crashed)") == \
        head + "Python worker exited unexpectedly (crashed)"   # killed: Spark's account, its job failed
    assert spent_line(budget, 1, 2) == head + ("worker 1's task attempt 2 failed without a Python error (its Python "
                                               "worker was killed or crashed, or its executor was lost)")


class Tracker:
    """What consumer.spark.deaths reads of pyspark's StatusTracker; counts its calls."""

    def __init__(self, groups, jobs, stages):
        self.groups, self.jobs, self.stages = groups, jobs, stages  # group -> job ids; id -> (stage ids, status)
        self.calls = 0

    def getJobIdsForGroup(self, group):
        self.calls += 1
        return list(self.groups.get(group, []))

    def getJobInfo(self, job_id):
        self.calls += 1
        if job_id not in self.jobs:
            return None
        stage_ids, status = self.jobs[job_id]
        return SimpleNamespace(jobId=job_id, stageIds=list(stage_ids), status=status)

    def getStageInfo(self, stage_id):
        self.calls += 1
        return SimpleNamespace(numFailedTasks=self.stages[stage_id]) if stage_id in self.stages else None


def test_failed_attempts_are_read_from_the_groups_stages():
    jobs = {1: ([10], "RUNNING"), 2: ([20], "FAILED"), 3: ([30, 31], "SUCCEEDED")}
    tracker = Tracker({"g": [1], "h": [2, 3]}, jobs, {10: 2, 20: 4, 30: 1})
    assert failed_attempts(tracker, "g") == GroupAttempts(2, 1, False)
    assert failed_attempts(tracker, "h") == GroupAttempts(5, 2, True)   # stage 31 not recorded (yet): 0
    assert failed_attempts(tracker, "none") == GroupAttempts(0, 0, False)
    stages = {}
    failed_attempts(tracker, "g", stages)
    tracker.calls, tracker.stages[10] = 0, 3
    assert failed_attempts(tracker, "g", stages).failed == 3 and tracker.calls == 1  # cached: the stage only
    assert failed_attempts(tracker, "none", stages).failed == 0 and "none" not in stages


def test_the_final_count_waits_for_the_jobs_end_and_not_for_a_job_never_run():
    tracker = Tracker({"g": [1]}, {1: ([10], "RUNNING")}, {10: 3})

    def job_ends():
        tracker.stages[10], tracker.jobs[1] = 4, ([10], "FAILED")

    timer = threading.Timer(0.2, job_ends)
    timer.start()
    try:
        assert settled_attempts(tracker, "g", timeout_s=30) == GroupAttempts(4, 1, True)
    finally:
        timer.cancel()
    assert settled_attempts(tracker, "never-run", timeout_s=30) == GroupAttempts(0, 0, False)
    assert settled_attempts(Tracker({"g": [1]}, {1: ([10], "RUNNING")}, {10: 1}), "g", timeout_s=0.1).failed == 1


@pytest.mark.parametrize("raw, line", [
    (b"ValueError: bad record at Batch(t-0[0:100))\n", "ValueError: bad record at Batch(t-0[0:100))"),
    (b"\n  RuntimeError: a\nsecond line\n", "RuntimeError: a"),
    (b"\xff\xfeOSError: x", "\ufffd\ufffdOSError: x"),
    (b"", ""),
    (b"E: " + b"x" * 2000, "E: " + "x" * (protocol.MAX_SPARK_ERROR_CHARS - 3)),
])
def test_a_recorded_worker_error_reads_as_one_bounded_line(raw, line):
    assert protocol.decode_spark_error(raw) == line
    assert protocol.decode_spark_error(protocol.encode_spark_error(line)) == line
