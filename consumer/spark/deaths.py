"""Worker deaths of a Spark group job, counted when they happen.

A death is a failed task attempt of a worker's Spark job (each worker is its own one-task job:
:mod:`consumer.spark.driver`): a killed or crashed Python worker, ``process`` raising, a lost
executor. Spark retries a failed task inside its job up to ``spark.task.maxFailures`` - 1 times
(none in ``local[N]``, F - 1 in ``local[N,F]``, 3 by default on a cluster) before the job fails, so the job's failure comes late and brings every death of the job at once; counted then,
four deaths hours apart would spend a budget of three within a minute. The driver counts each
attempt when Spark reports it instead.

Where the count comes from: Spark's status tracker (``SparkContext.statusTracker()``), each
worker job's stage's failed task attempts, which the driver's application status store keeps
from Spark's own task-end events (the store the UI and the REST API read; kept with the UI
off). A driver thread reads it for every running worker job every ``DEATH_POLL_INTERVAL_S``
(:func:`failed_attempts`); when a job ends, its thread reads the final count once Spark has
recorded the job's end (:func:`settled_attempts`). Why this source: it is public pyspark API,
the same on every master (local, standalone, YARN, Kubernetes), local to the driver (no port,
no UI, no shared disk), and it sees every failed attempt, however it died. The others fall
short: pyspark has no Python ``SparkListener`` (a Java listener called back through Py4J would
run Python on Spark's listener-bus thread for every event of the application); the workers
recording their own starts in ZooKeeper would learn of a death only when the next attempt
starts (late when it waits for a slot, never for the last attempt of a failed job or one that
dies before it reaches ZooKeeper); the UI's REST API needs the UI on and reachable.

Which death ended the job, and why: Spark tells the driver why an attempt failed only when the
job fails, so a worker attempt that fails with a Python exception records its line under the
run's znode first (``/zkgroups-spark/runs/<run id>/errors/<consumer id>``), and the job's error
names the death that spent the budget by that line, else by Spark's reason for the job's
failure, else as a death without a Python error (:func:`spent_line`).

Limits: a death is counted up to ``DEATH_POLL_INTERVAL_S`` after Spark's status store
recorded it. The store writes a running stage's counts on a task's end only if
``spark.ui.liveUpdate.period`` (100 ms by default) has passed since the stage's previous write;
otherwise they wait for the stage's next write (the retry's start if that comes later than the
period, the next attempt's end, an executor heartbeat's flush, the job's end), which can be
seconds later: two deaths seconds apart are then counted together.
:func:`~consumer.spark.driver.local_session` (and so ``bin/pipeline``) sets the period to 0,
which writes on every task event; a session of the application's own should too.

:class:`DeathBudget` is the pure rule: at most ``limit`` deaths within any ``window_s``.
"""
from __future__ import annotations

import enum
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

from coordinator.lifecycle import Lifecycle

#: How often the driver reads the running worker jobs' failed task attempts.
DEATH_POLL_INTERVAL_S = 0.25
#: How long a worker thread waits for Spark's status store to record its ended job.
SETTLE_TIMEOUT_S = 5.0
_SETTLE_CHECK_INTERVAL_S = 0.02
_FINISHED = ("SUCCEEDED", "FAILED")


class BudgetState(enum.Enum):
    WITHIN = "within"    # at most ``limit`` deaths within the window so far
    SPENT = "spent"      # a death made more than ``limit`` within the window: the job ends


class DeathBudget(Lifecycle[BudgetState]):
    """At most ``limit`` deaths within any ``window_s`` seconds.

    States (:class:`BudgetState`), changed by :meth:`add` only::

        WITHIN --(a death makes more than ``limit`` within the window)--> SPENT

    and never back: a spent budget ends the job. ``spent_with`` is the number of deaths within
    the window when it was spent (what the job's error says).

    Pure (callers pass the times) and not thread-safe: its owner's lock guards it.
    """

    TRANSITIONS = {BudgetState.WITHIN: {BudgetState.SPENT}, BudgetState.SPENT: set()}

    def __init__(self, limit: int, window_s: float):
        super().__init__(BudgetState.WITHIN)
        self.limit, self.window_s = limit, window_s
        self.spent_with: Optional[int] = None
        self._times: List[float] = []   # deaths within the window, oldest first

    @property
    def within(self) -> bool:
        return self.state is BudgetState.WITHIN

    def add(self, now: float, deaths: int = 1) -> bool:
        """Count ``deaths`` at ``now`` (monotonic seconds). True if this spent the budget."""
        self._times = [t for t in self._times if t > now - self.window_s] + [now] * deaths
        if self.within and len(self._times) > self.limit:
            self.spent_with = len(self._times)
            self._set_state(BudgetState.SPENT)
            return True
        return False


def spent_line(budget: DeathBudget, index: int, attempt: int, recorded: str = "", job_failure: str = "") -> str:
    """The job's one line when worker ``index``'s task attempt ``attempt`` spent ``budget``,
    naming that death: the Python error the attempt recorded, else its job's failure as Spark
    reported it (``job_failure``: Spark's reason for the job's last attempt, such as a crashed
    Python worker), else what is known (its job went on: Spark retried the task)."""
    cause = recorded or job_failure or (f"worker {index}'s task attempt {attempt} failed without a Python error "
                                        "(its Python worker was killed or crashed, or its executor was lost)")
    return (f"{budget.spent_with} failed worker task attempts within {budget.window_s:g} s "
            f"(at most {budget.limit}): {cause}")


class GroupAttempts(NamedTuple):
    """What Spark's status tracker says of a job group's jobs."""
    failed: int      # failed task attempts of their stages
    jobs: int        # jobs Spark has recorded in the group
    finished: bool   # every one of them has ended (and at least one is recorded)


def failed_attempts(tracker, job_group: str, stages: Optional[Dict[str, List[int]]] = None) -> GroupAttempts:
    """The failed task attempts of ``job_group``'s jobs, from ``tracker`` (a pyspark
    StatusTracker). ``stages``: a cache of each group's stage ids, which do not change once its
    job is recorded; a poll of a cached group reads only its stages (and does not say whether
    its job ended: ``finished`` is False)."""
    cached = stages.get(job_group) if stages is not None else None
    if cached is not None:
        return GroupAttempts(_failed_in(tracker, cached), 1, False)
    stage_ids: List[int] = []
    jobs, ended = 0, 0
    for job_id in tracker.getJobIdsForGroup(job_group):
        info = tracker.getJobInfo(job_id)
        if info is None:
            continue
        jobs += 1
        ended += info.status in _FINISHED
        stage_ids.extend(info.stageIds)
    if stages is not None and stage_ids:
        stages[job_group] = stage_ids
    return GroupAttempts(_failed_in(tracker, stage_ids), jobs, jobs > 0 and ended == jobs)


def _failed_in(tracker, stage_ids: Sequence[int]) -> int:
    failed = 0
    for stage_id in stage_ids:
        stage = tracker.getStageInfo(stage_id)
        failed += stage.numFailedTasks if stage else 0
    return failed


def settled_attempts(tracker, job_group: str, timeout_s: float = SETTLE_TIMEOUT_S) -> GroupAttempts:
    """:func:`failed_attempts` of a job group whose job has just returned or raised on the
    driver, once Spark's status store has recorded the job's end (events reach it a little
    after the job's caller hears of its end; its last task end comes before its job end).
    Waits at most ``timeout_s``; a group with no job recorded (one that failed before Spark ran
    it, e.g. a function that does not pickle) is not waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = failed_attempts(tracker, job_group)
        if now.finished or now.jobs == 0 or time.monotonic() >= deadline:
            return now
        time.sleep(_SETTLE_CHECK_INTERVAL_S)
