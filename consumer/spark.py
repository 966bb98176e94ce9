"""Consumer groups on Spark: every worker task is a member of a zkgroups consumer group.

The driver starts ``workers`` Spark tasks; each task runs a :class:`~consumer.consumer.Consumer`
in group ``group_id``, polls, calls the user's ``process(batch)`` and commits the batch's
offsets after ``process`` returned (at-least-once), then leaves the group cleanly. Commits
are coalesced: at most one every ``commit_interval_ms`` (100 ms; 0 commits every batch), and
always before a partition is handed over, when a partition reaches the drain snapshot and
when the worker stops. Members are ordinary group members: plain Python consumers can share
the group with them.

Modes
-----
``drain``
    The driver snapshots the end offset of every partition of the subscribed topics when
    the job starts. Records at or after a partition's snapshot are not processed. A worker
    keeps going until the *group's* committed offsets (read from ZooKeeper for every
    partition, not only its own; assignments move) reach the snapshot, so the job ends
    when everything that was there at the start has been processed and committed.
``stream``
    Run until ``duration_s`` has passed since the job started (a retried task does not get
    extra time), or until stopped: :meth:`GroupJob.request_stop` (a stop znode every worker
    watches) or ``stop_file`` appearing.

Batches
-------
Without ``align`` a batch is whatever one ``poll()`` returned (up to ``max_poll_records``).
With ``align=N`` batch boundaries do not depend on timing: a partition's records are cut at
offsets that are multiples of N, at the drain snapshot, or where ``batch_end(tp, start)``
says (a sink returns the end of a batch it already wrote, so a redone batch is cut exactly
as before). A batch holds at most one contiguous run of records per partition. This is
what an exactly-once sink needs: write each (partition, start, end) range idempotently,
e.g. to a file named by it, and a batch redone after a failure overwrites the same output.

Guarantees and limits
---------------------
* A worker's consumer id includes the Spark application id, a per-run token, the task's
  partition index and attempt number, so a retried task never collides with its dead
  predecessor (whose partitions move once its ZooKeeper session ends).
* A worker killed mid-batch loses nothing: its uncommitted batch is redone by the next owner.
* ``spark.speculation=true`` is refused: a speculative copy of a task would be an extra
  member processing the same partitions' batches concurrently with the original.
* The log is a shared-disk log: ``data_dir`` must be the same files for the driver and every
  executor (local mode, or a shared filesystem).
* Not handled: partitions added to a topic during a drain are not drained (only the
  snapshot); a worker that keeps running while cut off from ZooKeeper (a zombie) may still
  finish the batch it had started after its partitions moved (at-least-once, as always).

Nothing here imports pyspark until a job runs, so ``import consumer.spark`` is cheap.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from coordinator import protocol, read
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import CommitFailedError, CorruptZnode, InvalidConfig, ZkGroupsError
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from consumer.records import ConsumerRecord, TopicPartition

log = logging.getLogger("zkgroups.spark")

MODES = ("drain", "stream")
#: Worker defaults (any ConsumerConfig key can be overridden through ``consumer_config``).
WORKER_DEFAULTS = dict(auto_offset_reset="earliest", max_poll_records=10000)
GROUP_CHECK_INTERVAL_S = 0.1
DRAIN_POLL_TIMEOUT_MS = 50    # drain: idle workers look at the group's progress this often
STOP_FILE_CHECK_INTERVAL_S = 0.2


class SparkJobError(ZkGroupsError):
    """A group job cannot start (configuration) or its Spark job failed."""


# ---------------------------------------------------------------- what the user function gets

@dataclass
class WorkerContext:
    """Who is processing: the task, its attempt, its group member id and its progress so far."""
    group_id: str
    app_id: str
    run_id: str
    index: int          # the Spark task's partition index (0..workers-1)
    attempt: int        # TaskContext.attemptNumber(): 0 first, 1 after one failure, ...
    consumer_id: str
    batches: int = 0    # batches this task processed before the current one
    records: int = 0


class Batch:
    """One call's worth of records: ``records`` maps each partition to a contiguous run."""

    __slots__ = ("records", "worker")

    def __init__(self, records: Dict[TopicPartition, List[ConsumerRecord]], worker: WorkerContext):
        self.records = records
        self.worker = worker

    @property
    def ranges(self) -> Dict[TopicPartition, Tuple[int, int]]:
        """``{tp: (first offset, last offset + 1)}``."""
        return {tp: (recs[0].offset, recs[-1].offset + 1) for tp, recs in self.records.items()}

    def __len__(self) -> int:
        return sum(map(len, self.records.values()))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for recs in self.records.values():
            yield from recs

    def __repr__(self) -> str:
        ranges = ", ".join(f"{tp}[{a}:{b})" for tp, (a, b) in sorted(self.ranges.items()))
        return f"Batch({ranges})"


# ---------------------------------------------------------------- summaries

@dataclass
class WorkerSummary:
    index: int
    attempt: int
    consumer_id: str
    records: int
    batches: int
    partitions: List[str]          # partitions this task processed records of
    rebalances: int                # rebalance commands its member applied
    started_at: float              # epoch seconds
    first_record_at: Optional[float]
    duration_s: float
    stop_reason: str               # drained | deadline | stopped


@dataclass
class JobSummary:
    group_id: str
    mode: str
    app_id: str
    run_id: str
    started_at: float
    duration_s: float
    workers: List[WorkerSummary]
    end_offsets: Dict[str, int] = field(default_factory=dict)   # drain snapshot, "topic-p" -> offset
    committed: Dict[str, Optional[int]] = field(default_factory=dict)  # after the job
    task_failures: int = 0

    @property
    def records(self) -> int:
        return sum(w.records for w in self.workers)

    @property
    def complete(self) -> bool:
        """Drain only: every partition's committed offset reached the snapshot."""
        return all((self.committed.get(k) or 0) >= end for k, end in self.end_offsets.items())

    @property
    def time_to_first_record_s(self) -> Optional[float]:
        firsts = [w.first_record_at for w in self.workers if w.first_record_at is not None]
        return min(firsts) - self.started_at if firsts else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(records=self.records, complete=self.complete, time_to_first_record_s=self.time_to_first_record_s)
        return d

    def table(self) -> str:
        rows = [("worker", "attempt", "records", "batches", "partitions", "rebalances", "first rec s", "duration s",
                 "stop")]
        for w in sorted(self.workers, key=lambda w: w.index):
            first = f"{w.first_record_at - self.started_at:.2f}" if w.first_record_at else "-"
            rows.append((str(w.index), str(w.attempt), f"{w.records:,}", str(w.batches),
                         ",".join(w.partitions) or "-", str(w.rebalances), first, f"{w.duration_s:.2f}",
                         w.stop_reason))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
        rate = self.records / self.duration_s if self.duration_s > 0 else 0.0
        lines.append(f"group {self.group_id} ({self.mode}): {self.records:,} records in {self.duration_s:.2f} s "
                     f"({rate:,.0f} records/s), task failures {self.task_failures}"
                     + (f", drained: {'yes' if self.complete else 'NO'}" if self.mode == "drain" else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------- helpers

_ILLEGAL = re.compile(r"[^a-zA-Z0-9._-]")


def sanitize_id(raw: str) -> str:
    """A valid znode / consumer-id name: illegal characters become ``_``."""
    name = _ILLEGAL.sub("_", raw)[:protocol.MAX_NAME_LENGTH]
    return name if name not in ("", ".", "..") else "_"


def worker_consumer_id(group_id: str, app_id: str, run_id: str, index: int, attempt: int) -> str:
    return sanitize_id(f"{group_id}_spark-{app_id}-{run_id}-p{index}-a{attempt}")




def check_spark_conf(conf) -> None:
    """Refuse settings that break group semantics (``conf``: a SparkConf or anything with
    ``get(key, default)``)."""
    if str(conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise SparkJobError("spark.speculation is true: a speculative copy of a worker task would join the group "
                            "as an extra member; set spark.speculation=false")


def _spark_context(spark):
    return getattr(spark, "sparkContext", spark)


def local_session(master: str = "local[2]", app_name: str = "zkgroups", conf: Optional[Dict[str, str]] = None,
                  log_level: str = "WARN"):
    """A SparkSession whose Python workers run this interpreter and can import this project.

    Sets ``PYSPARK_PYTHON`` (if unset) to ``sys.executable`` and puts the project root on
    ``PYTHONPATH`` before the JVM starts; turns the UI and the console progress bar off.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "4", **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


def read_committed(client, group_id: str, partitions: Sequence[TopicPartition]) -> Dict[TopicPartition, Optional[int]]:
    """The group's committed offsets of ``partitions`` (None: none committed; a corrupt one is
    logged and read as None), read in parallel."""
    problems: Dict[TopicPartition, str] = {}
    committed = read.committed_offsets(client, group_id, partitions, problems)
    for tp, problem in problems.items():
        log.error("%s: %s", protocol.offsets_path(group_id, tp.topic, tp.partition), problem)
    return committed


# ---------------------------------------------------------------- the job (driver side)

@dataclass
class _WorkerSpec:
    """Everything a worker task needs; pickled to the executors."""
    group_id: str
    topics: List[str]
    process: Callable[[Batch], None]
    zk: str
    data_dir: str
    mode: str
    app_id: str
    run_id: str
    started_at: float
    deadline: Optional[float]                 # epoch seconds
    end_offsets: Dict[TopicPartition, int]    # drain snapshot
    stop_file: Optional[str]
    align: Optional[int]
    batch_end: Optional[Callable[[TopicPartition, int], Optional[int]]]
    flush_partial: bool
    poll_timeout_ms: int
    commit_interval_ms: int
    consumer_config: dict
    log_options: Optional[dict]


class GroupJob:
    """Run consumer group ``group_id`` on ``workers`` Spark tasks (see the module docstring).

    ``process(batch)`` runs on the executors; it must be picklable (cloudpickle). A batch's
    offsets are committed only after it returned; if it raises, the task fails (nothing of
    that batch is committed) and Spark's retry, or another worker, redoes the batch.
    ``consumer_config`` takes any ConsumerConfig key (defaults: WORKER_DEFAULTS) except
    ``enable_auto_commit``.
    """

    def __init__(self, spark, group_id: str, topics: Sequence[str], process: Callable[[Batch], None], *,
                 zk: str, data_dir: str, workers: int = 2, mode: str = "drain", duration_s: Optional[float] = None,
                 stop_file: Optional[str] = None, align: Optional[int] = None,
                 batch_end: Optional[Callable[[TopicPartition, int], Optional[int]]] = None,
                 flush_partial: bool = True, poll_timeout_ms: int = 200, commit_interval_ms: int = 100,
                 consumer_config: Optional[dict] = None,
                 log_options: Optional[dict] = None, require_coordinator: bool = True):
        protocol.validate_name(group_id, "group")
        if isinstance(topics, str):
            topics = [topics]
        if not topics:
            raise InvalidConfig("give at least one topic")
        for t in topics:
            protocol.validate_name(t)
        if mode not in MODES:
            raise InvalidConfig(f"mode must be drain or stream, not {mode!r}")
        if not isinstance(workers, int) or workers < 1:
            raise InvalidConfig(f"workers must be a whole number >= 1, got {workers!r}")
        if align is not None and (not isinstance(align, int) or align < 1):
            raise InvalidConfig(f"align must be a whole number >= 1, got {align!r}")
        if duration_s is not None and duration_s <= 0:
            raise InvalidConfig(f"duration_s must be > 0, got {duration_s!r}")
        if not isinstance(zk, str):
            raise InvalidConfig("zk must be a connect string (workers open their own sessions)")
        config = {**WORKER_DEFAULTS, **(consumer_config or {})}
        if config.pop("enable_auto_commit", False):
            raise InvalidConfig("enable_auto_commit cannot be used: workers commit after process() returns")
        from consumer.consumer import ConsumerConfig
        from coordinator import config as cfg
        cfg.build(ConsumerConfig, config, "consumer_config")  # reject unknown keys on the driver
        self.spark, self.group_id, self.topics, self.process = spark, group_id, list(topics), process
        self.zk, self.data_dir, self.workers, self.mode = zk, str(data_dir), workers, mode
        self.duration_s, self.stop_file, self.align, self.batch_end = duration_s, stop_file, align, batch_end
        self.flush_partial, self.poll_timeout_ms = flush_partial, poll_timeout_ms
        if not isinstance(commit_interval_ms, int) or commit_interval_ms < 0:
            raise InvalidConfig(f"commit_interval_ms must be a whole number >= 0, got {commit_interval_ms!r}")
        self.commit_interval_ms = commit_interval_ms
        self.consumer_config, self.log_options = config, log_options
        self.require_coordinator = require_coordinator
        self.run_id: Optional[str] = None
        self._client = None
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()

    # -------------------------------------------------------- control

    def request_stop(self) -> None:
        """Ask every worker to stop after its current batch (thread-safe; also before run())."""
        self._stop_requested.set()
        with self._lock:
            client, run_id = self._client, self.run_id
        if client is not None and run_id is not None:
            try:
                client.create(protocol.spark_stop_path(run_id), b"", makepath=True)
            except Exception as e:  # NodeExistsError, or ZooKeeper trouble: the workers' deadline still holds
                if type(e).__name__ != "NodeExistsError":
                    log.warning("could not create the stop znode of run %s: %s", run_id, e)

    # -------------------------------------------------------- run

    def run(self) -> JobSummary:
        sc = _spark_context(self.spark)
        check_spark_conf(sc.getConf())
        if self.workers > sc.defaultParallelism:
            log.warning("%d workers but only %d task slots: the extra workers start when others finish",
                        self.workers, sc.defaultParallelism)
        client = start_client(self.zk, self.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS))
        run_id = uuid.uuid4().hex[:8]
        try:
            if self.require_coordinator and client.exists(protocol.LEADER) is None:
                raise SparkJobError(f"no zkgroups coordinator is running against {self.zk} "
                                    "(start bin/coordinatord); the group would never get partitions")
            registry = TopicRegistry(client)
            partitions = [TopicPartition(t, p) for t in self.topics for p in range(registry.partitions(t))]
            end_offsets: Dict[TopicPartition, int] = {}
            if self.mode == "drain":
                from consumer.log import Log
                with Log(self.data_dir, **(self.log_options or {})) as lg:
                    end_offsets = {tp: lg.latest_offset(tp.topic, tp.partition) for tp in partitions}
            client.ensure_path(protocol.SPARK_STOP)
            with self._lock:
                self._client, self.run_id = client, run_id
            if self._stop_requested.is_set():
                self.request_stop()
            started = time.time()
            spec = _WorkerSpec(
                group_id=self.group_id, topics=self.topics, process=self.process, zk=self.zk,
                data_dir=self.data_dir, mode=self.mode, app_id=sc.applicationId, run_id=run_id,
                started_at=started, deadline=started + self.duration_s if self.duration_s else None,
                end_offsets=end_offsets, stop_file=self.stop_file, align=self.align, batch_end=self.batch_end,
                flush_partial=self.flush_partial, poll_timeout_ms=self.poll_timeout_ms,
                commit_interval_ms=self.commit_interval_ms,
                consumer_config=self.consumer_config, log_options=self.log_options)
            job_group = f"zkgroups-{self.group_id}-{run_id}"
            sc.setJobGroup(job_group, f"zkgroups group {self.group_id} ({self.mode}, {self.workers} workers)")
            error = None
            try:
                rows = sc.parallelize(range(self.workers), self.workers).mapPartitions(_task(spec)).collect()
            except Exception as e:
                error = _one_line(e)
            finally:
                failures = _task_failures(sc, job_group)
                sc.setLocalProperty("spark.jobGroup.id", None)  # do not tag later jobs of this thread
                sc.setLocalProperty("spark.job.description", None)
            if error is not None:
                raise SparkJobError(f"the Spark job failed after {failures} failed task attempts: {error}")
            duration = time.time() - started
            committed = read_committed(client, self.group_id, partitions)
            return JobSummary(
                group_id=self.group_id, mode=self.mode, app_id=sc.applicationId, run_id=run_id,
                started_at=started, duration_s=duration, workers=[WorkerSummary(**r) for r in rows],
                end_offsets={str(tp): o for tp, o in end_offsets.items()},
                committed={str(tp): o for tp, o in committed.items()}, task_failures=failures)
        finally:
            with self._lock:
                self._client = None
            try:
                client.delete(protocol.spark_stop_path(run_id))
            except Exception:
                pass
            close_client(client)


def run_group_job(spark, group_id: str, topics: Sequence[str], process: Callable[[Batch], None], **options) -> JobSummary:
    """``GroupJob(spark, group_id, topics, process, **options).run()``."""
    return GroupJob(spark, group_id, topics, process, **options).run()


def _task_failures(sc, job_group: str) -> int:
    try:
        tracker = sc.statusTracker()
        total = 0
        for job_id in tracker.getJobIdsForGroup(job_group):
            info = tracker.getJobInfo(job_id)
            for stage_id in (info.stageIds if info else ()):
                stage = tracker.getStageInfo(stage_id)
                total += stage.numFailedTasks if stage else 0
        return total
    except Exception:  # only for the summary
        return 0


def _one_line(e: BaseException) -> str:
    """A one-line account of a failed Spark job: the last Python exception line of the last
    failed task if there is one, else the first line of the message (no stacks)."""
    texts = [str(e)]
    java = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
    if java is not None:
        try:
            texts.append(str(java.getMessage()))
        except Exception:
            pass
    lines = [ln.strip() for text in texts for ln in text.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines)
                  if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:|$)", ln)
                  and not ln.startswith(("org.", "java.", "py4j.", "scala."))), None)
    if cause:
        return cause
    head = lines[0] if lines else type(e).__name__
    return re.sub(r"^\[[A-Z_]+\]\s*", "", head)


# ---------------------------------------------------------------- the worker (executor side)

def _task(spec: _WorkerSpec):
    def run(_iterator):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        yield _Worker(spec, ctx.partitionId(), ctx.attemptNumber()).run()
    return run


class _Pending:
    """Records of one partition fetched but not processed yet, and where the batch ends."""

    __slots__ = ("start", "records", "cut", "fixed")

    def __init__(self, start: int):
        self.start = start
        self.records: List[ConsumerRecord] = []
        self.cut: Optional[int] = None   # end offset of the current batch (None: unbounded)
        self.fixed = False               # cut decided by batch_end() or the drain snapshot: never cut earlier

    @property
    def next_offset(self) -> int:
        return self.start + len(self.records)


class _Worker:
    """One group member inside one Spark task. Listener callbacks run inside poll()."""

    def __init__(self, spec: _WorkerSpec, index: int, attempt: int):
        from consumer.consumer import ConsumerRebalanceListener

        self.spec = spec
        self.ctx = WorkerContext(spec.group_id, spec.app_id, spec.run_id, index, attempt,
                                 worker_consumer_id(spec.group_id, spec.app_id, spec.run_id, index, attempt))
        self.pending: Dict[TopicPartition, _Pending] = {}
        self.uncommitted: Dict[TopicPartition, int] = {}  # processed up to here, not committed yet
        self._next_commit = 0.0
        self.paused: set = set()
        self.handled: set = set()
        self.first_record_at: Optional[float] = None
        self.stop_flag = threading.Event()
        self.consumer = None
        self.client = None
        self._next_group_check = 0.0
        self._next_file_check = 0.0

        worker = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                worker._revoked(revoked)

            def on_partitions_lost(self, lost):
                worker._forget(lost)

            def on_partitions_assigned(self, assigned):
                worker._assigned(assigned)

        self.listener = Listener()

    # -------------------------------------------------------- lifecycle

    def run(self) -> dict:
        from kazoo.recipe.watchers import DataWatch
        from consumer.consumer import Consumer

        logging.getLogger("kazoo").setLevel(logging.ERROR)
        spec, started = self.spec, time.time()
        client = self.client = start_client(spec.zk, spec.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS))
        reason = None
        try:
            DataWatch(client, protocol.spark_stop_path(spec.run_id), self._on_stop_node)
            if spec.mode == "drain" and self._group_drained(client):
                reason = "drained"  # nothing left: do not join (and rebalance) the group at all
            else:
                self.consumer = Consumer(spec.group_id, spec.topics, zk=client, data_dir=spec.data_dir,
                                         listener=self.listener, consumer_id=self.ctx.consumer_id,
                                         log_options=spec.log_options, enable_auto_commit=False,
                                         **spec.consumer_config)
                failed = True
                try:
                    reason = self._loop(client)
                    failed = False
                finally:
                    self._close(failed)
        finally:
            close_client(client)
        return asdict(WorkerSummary(
            index=self.ctx.index, attempt=self.ctx.attempt, consumer_id=self.ctx.consumer_id,
            records=self.ctx.records, batches=self.ctx.batches, partitions=sorted(map(str, self.handled)),
            rebalances=self.consumer.group_metadata().rebalances if self.consumer else 0, started_at=started,
            first_record_at=self.first_record_at, duration_s=time.time() - started, stop_reason=reason))

    def _close(self, failed: bool) -> None:
        try:
            try:
                self._commit(force=True)  # what process() returned for (never a failed batch)
            finally:
                self.consumer.close(autocommit=False)
        except Exception as e:
            if not failed:
                raise
            log.warning("worker %s: leaving the group after a failure: %s", self.ctx.consumer_id, e)

    def _on_stop_node(self, data, stat):  # kazoo thread: only record
        if stat is not None:
            self.stop_flag.set()
            return False
        return None

    # -------------------------------------------------------- the loop

    def _loop(self, client) -> str:
        spec, consumer = self.spec, self.consumer
        while True:
            reason = self._stop_reason(client)
            if reason:
                if reason != "drained" and spec.flush_partial and spec.align:
                    self._flush_partial()
                self._commit(force=True)
                return reason
            timeout = spec.poll_timeout_ms
            if spec.mode == "drain":
                timeout = min(timeout, DRAIN_POLL_TIMEOUT_MS)
            if spec.deadline is not None:
                timeout = max(0, min(timeout, int((spec.deadline - time.time()) * 1000)))
            records = consumer.poll(timeout_ms=timeout)
            if records:
                self._accept(records)
            ready = self._ready()
            while ready:
                self._process(ready)
                ready = self._ready()
            self._commit()

    def _stop_reason(self, client) -> Optional[str]:
        now = time.time()
        if self.stop_flag.is_set():
            return "stopped"
        if self.spec.deadline is not None and now >= self.spec.deadline:
            return "deadline"
        if self.spec.stop_file and now >= self._next_file_check:
            self._next_file_check = now + STOP_FILE_CHECK_INTERVAL_S
            if os.path.exists(self.spec.stop_file):
                return "stopped"
        if self.spec.mode == "drain" and now >= self._next_group_check:
            self._next_group_check = now + GROUP_CHECK_INTERVAL_S
            if self._group_drained(client):
                return "drained"
        return None

    def _group_drained(self, client) -> bool:
        ends = self.spec.end_offsets
        committed = read_committed(client, self.spec.group_id, list(ends))
        return all((committed[tp] or 0) >= end for tp, end in ends.items())

    # -------------------------------------------------------- batching

    def _limit(self, tp: TopicPartition, st: _Pending) -> Optional[int]:
        """Offset at which this partition's records stop being processed (None: never)."""
        if self.spec.mode != "drain":
            return None
        end = self.spec.end_offsets.get(tp, 0)  # partitions outside the snapshot: not drained
        return max(end, st.cut) if st.fixed and st.cut is not None else end

    def _set_cut(self, tp: TopicPartition, st: _Pending) -> None:
        spec, start = self.spec, st.start
        if spec.batch_end is not None:
            known = spec.batch_end(tp, start)
            if known is not None and known > start:
                st.cut, st.fixed = int(known), True
                return
        st.cut, st.fixed = None, False
        if spec.align:
            st.cut = (start // spec.align + 1) * spec.align
        if spec.mode == "drain":
            end = spec.end_offsets.get(tp, 0)
            if st.cut is None or end <= st.cut:
                st.cut, st.fixed = end, True

    def _accept(self, records: Dict[TopicPartition, List[ConsumerRecord]]) -> None:
        for tp, recs in records.items():
            if not recs:
                continue
            st = self.pending.get(tp)
            if st is None or st.next_offset != recs[0].offset:
                if st is not None:  # cannot happen unless positions jumped (reset): start over
                    log.warning("worker %s: %s jumped from %d to %d", self.ctx.consumer_id, tp, st.next_offset,
                                recs[0].offset)
                st = self.pending[tp] = _Pending(recs[0].offset)
                self._set_cut(tp, st)
            limit = self._limit(tp, st)
            if limit is not None and recs[-1].offset + 1 >= limit:
                recs = recs[:max(0, limit - recs[0].offset)]
                if tp not in self.paused:  # everything up to the snapshot is fetched
                    try:
                        self.consumer.pause(tp)
                        self.paused.add(tp)
                    except ZkGroupsError:  # lost meanwhile (session end): nothing to pause
                        pass
            st.records.extend(recs)
            if not st.records and (limit is not None and st.start >= limit):
                del self.pending[tp]

    def _ready(self) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """At most one contiguous run per partition whose batch is complete."""
        out = {}
        for tp, st in list(self.pending.items()):
            if not st.records:
                continue
            if st.cut is None:
                take = len(st.records)
            elif st.next_offset >= st.cut:
                take = st.cut - st.start
            elif self.spec.align:
                continue  # wait for the rest of the batch
            else:
                take = len(st.records)
            if take > 0:
                out[tp] = st.records[:take]
        return out

    def _flush_partial(self) -> None:
        """On stop (stream): process incomplete aligned batches, except where the end is fixed."""
        ready = {tp: list(st.records) for tp, st in self.pending.items() if st.records and not st.fixed}
        if ready:
            self._process(ready)

    def _process(self, ready: Dict[TopicPartition, List[ConsumerRecord]]) -> None:
        if self.first_record_at is None:
            self.first_record_at = time.time()
        self.spec.process(Batch(ready, self.ctx))
        finished = False
        for tp, recs in ready.items():
            end = recs[-1].offset + 1
            self.uncommitted[tp] = end
            st = self.pending.get(tp)
            if st is None:
                continue
            del st.records[:end - st.start]
            st.start = end
            limit = self._limit(tp, st)
            if limit is not None and end >= limit:
                finished = True
                if not st.records:
                    del self.pending[tp]
                    continue
            self._set_cut(tp, st)
        self.handled.update(ready)
        self.ctx.batches += 1
        self.ctx.records += sum(map(len, ready.values()))
        if finished:  # a partition reached the drain snapshot: let the group see it now
            self._commit(force=True)
            self._next_group_check = 0.0

    def _commit(self, force: bool = False) -> None:
        """Commit processed offsets: at most every commit_interval_ms, unless ``force``."""
        if not self.uncommitted or (not force and time.monotonic() < self._next_commit):
            return
        offsets, self.uncommitted = self.uncommitted, {}
        self._next_commit = time.monotonic() + self.spec.commit_interval_ms / 1000.0
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as e:
            # The partitions moved on; their new owner redoes what we did not commit (at-least-once).
            log.warning("worker %s: %s", self.ctx.consumer_id, e)
            for tp in offsets:
                self.pending.pop(tp, None)

    # -------------------------------------------------------- rebalance callbacks (inside poll)

    def _revoked(self, revoked) -> None:
        """Commit what was processed of ``revoked`` while we still own them, then forget them."""
        offsets = {tp: self.uncommitted.pop(tp) for tp in revoked if tp in self.uncommitted}
        if offsets:
            try:
                self.consumer.commit(offsets)
            except CommitFailedError as e:
                log.warning("worker %s: %s", self.ctx.consumer_id, e)
        self._forget(revoked)

    def _forget(self, partitions) -> None:
        for tp in partitions:
            self.pending.pop(tp, None)  # not processed: the next owner starts at the committed offset
            self.uncommitted.pop(tp, None)  # lost: the next owner redoes it

    def _assigned(self, assigned) -> None:
        again = self.paused & set(assigned)
        if again:
            self.consumer.resume(*again)  # paused in an earlier ownership; start afresh
            self.paused -= again
        if self.spec.mode == "drain":
            self._skip_past_snapshot(assigned)

    def _skip_past_snapshot(self, assigned) -> None:
        """Drain: a partition whose start position is already at or past the snapshot (e.g.
        ``auto_offset_reset="latest"`` and nothing committed) gets that position committed,
        so the group can finish. Runs in on_partitions_assigned, before any record of the
        partition is returned: the position is where consumption starts, nothing is skipped
        that this drain would process."""
        late = {}
        for tp in assigned:
            try:
                position = self.consumer.position(tp)
            except ZkGroupsError:
                continue
            if position >= self.spec.end_offsets.get(tp, 0):
                late[tp] = position
        if not late:
            return
        committed = read_committed(self.client, self.spec.group_id, list(late))
        offsets = {tp: pos for tp, pos in late.items()
                   if (committed[tp] or 0) < self.spec.end_offsets.get(tp, 0)}
        if offsets:
            try:
                self.consumer.commit(offsets)
            except CommitFailedError as e:
                log.warning("worker %s: %s", self.ctx.consumer_id, e)
