"""What runs on the Spark driver: the group job, its summary, session helpers, conf checks.

:class:`GroupJob` validates its options, checks the Spark configuration, the coordinator
and the topics, takes the drain snapshot from the data plane (the embedded log's end
offsets, or Kafka's log-end offsets), starts ``workers`` Spark tasks (each runs
:func:`consumer.spark.executor.task`), and after they all returned reads the group's
committed offsets into a :class:`JobSummary`. :meth:`GroupJob.request_stop` creates the
run's stop znode, which every worker watches.

Worker deaths: each worker is its own Spark job (one task), submitted from its own driver
thread. A death is a failed task attempt (a killed Python worker, an exception in
``process``, a lost executor), counted when Spark reports it, whether Spark retries the task
inside the job (``spark.task.maxFailures`` > 1) or the job fails
(:mod:`consumer.spark.deaths`). When a worker's job fails (its task failed
``spark.task.maxFailures`` times) the driver resubmits it as a new member (``restart`` + 1 in
its consumer id), so a long stream survives any number of deaths spread over its life. Only
more than ``max_worker_deaths`` failed task attempts within ``death_window_s`` end the job, at
the death that makes them too many: the other workers are stopped (the stop barrier: they
flush and commit) and the job fails with one :class:`SparkJobError` line naming that death's
own error (the Python exception, or Spark's reason such as a crashed Python worker), not
Py4J's wrapper text.

Kafka's librdkafka properties (``kafka``: SASL passwords, keys) travel to the executors only
inside the pickled :class:`~consumer.spark.executor.WorkerSpec`: never as Spark configuration
(which the Spark UI and event log show), never in the summary or a log line.
"""
from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from kazoo.exceptions import KazooException, NoNodeError
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from coordinator import protocol
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS, default_data_dir
from coordinator.errors import InvalidConfig, ZkGroupsError
from coordinator.kafka import check_bootstrap_servers
from coordinator.metrics_server import MetricsServer, check_port
from coordinator.zkclient import close_client, start_client
from coordinator.zktls import parse_tls
from consumer.dataplane import (DataPlane, bootstrap_servers_from, open_data_plane, registered_partitions,
                                topic_partitions)
from consumer.records import TopicPartition
from consumer.spark.batching import BatchEnd
from consumer.spark.deaths import (DEATH_POLL_INTERVAL_S, DeathBudget, failed_attempts, settled_attempts,
                                   spent_line)
from consumer.spark.executor import (Batch, WorkerSpec, WorkerSummary, read_committed, task, worker_consumer_id,
                                     zk_security)
from consumer.spark.progress import ProgressReporter, progress_log, read_progress
from consumer.spark.session import ENV_SPARK_MASTER, local_session, spark_master  # noqa: F401 (their old home)

log = logging.getLogger("zkgroups.spark")

MODES = ("drain", "stream")
#: Default death budget: more than this many failed worker task attempts within the window end the job.
MAX_WORKER_DEATHS = 3
DEATH_WINDOW_S = 60.0
#: How often the driver logs the run's progress (logger ``zkgroups.spark.progress``, INFO).
PROGRESS_LOG_INTERVAL_S = 10.0
#: Worker defaults (any ConsumerConfig key can be overridden through ``consumer_config``).
WORKER_DEFAULTS = dict(auto_offset_reset="earliest", max_poll_records=10000)

class SparkJobError(ZkGroupsError):
    """A group job cannot start (configuration) or its Spark job failed."""


# ---------------------------------------------------------------- the summary

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
    restarts: int = 0                  # worker jobs the driver resubmitted after they failed
    master: str = ""                   # the Spark master the job ran on
    attempts: Dict[str, int] = field(default_factory=dict)  # records processed per worker attempt (consumer id),
                                                            # failed attempts included (as of their last report)

    @property
    def records(self) -> int:
        """Records processed by the attempts that returned (see ``records_all_attempts``)."""
        return sum(w.records for w in self.workers)

    @property
    def records_all_attempts(self) -> int:
        """Records processed by every worker attempt, failed ones included (their last
        progress report, at most a second old): a record redone after a failure counts twice."""
        returned = {w.consumer_id: w.records for w in self.workers}
        return sum({**self.attempts, **returned}.values())

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
        d.update(records=self.records, records_all_attempts=self.records_all_attempts, complete=self.complete,
                 time_to_first_record_s=self.time_to_first_record_s)
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
                     + f", restarts {self.restarts}"
                     + (f", {self.records_all_attempts:,} records processed by all attempts"
                        if self.records_all_attempts != self.records else "")
                     + (f", drained: {'yes' if self.complete else 'NO'}" if self.mode == "drain" else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------- Spark helpers

def check_spark_conf(conf) -> None:
    """Refuse settings that break group semantics (``conf``: a SparkConf or anything with
    ``get(key, default)``)."""
    if str(conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise SparkJobError("spark.speculation is true: a speculative copy of a worker task would join the group "
                            "as an extra member; set spark.speculation=false")


def _spark_context(spark):
    return getattr(spark, "sparkContext", spark)


# ---------------------------------------------------------------- the job

class GroupJob:
    """Run consumer group ``group_id`` on ``workers`` Spark tasks (see :mod:`consumer.spark`).

    ``process(batch)`` runs on the executors; it must be picklable (cloudpickle). A batch's
    offsets are committed only after it returned; if it raises, the task fails (nothing of
    that batch is committed) and Spark's retry, or another worker, redoes the batch.
    ``consumer_config`` takes any ConsumerConfig key (defaults: WORKER_DEFAULTS) except
    ``enable_auto_commit``.

    Where the records are: Kafka when ``bootstrap_servers`` is given (or ``consumer_config``'s
    ``bootstrap_servers``, or ``KAFKA_BOOTSTRAP_SERVERS`` on the driver), with librdkafka
    properties ``kafka``; every worker opens its consumer with exactly these, so executors need
    no shared disk. Otherwise the embedded log under ``data_dir`` (default: as for a
    Consumer), which must be the same files for the driver and every executor (whose own
    ``KAFKA_BOOTSTRAP_SERVERS`` must then be unset: a Consumer given no brokers reads it).

    ``metrics_port``: serve the run's Prometheus metrics there while ``run`` runs
    (:func:`serve_job_metrics`; 0 picks a free port, ``metrics_server.url`` says which).

    Threads: ``run`` on one thread; ``request_stop`` from any thread (``_lock`` guards the
    run's ZooKeeper client and run id, which ``run`` sets and clears).
    """

    def __init__(self, spark, group_id: str, topics: Sequence[str], process: Callable[[Batch], None], *,
                 zk: str, data_dir: Optional[str] = None, bootstrap_servers: Optional[str] = None,
                 kafka: Optional[Mapping[str, object]] = None, workers: int = 2, mode: str = "drain",
                 duration_s: Optional[float] = None,
                 stop_file: Optional[str] = None, align: Optional[int] = None,
                 batch_end: Optional[BatchEnd] = None,
                 flush_partial: bool = True, poll_timeout_ms: int = 200, commit_interval_ms: int = 100,
                 trigger_interval_s: Optional[float] = None, max_worker_deaths: int = MAX_WORKER_DEATHS,
                 death_window_s: float = DEATH_WINDOW_S, consumer_config: Optional[dict] = None,
                 log_options: Optional[dict] = None, require_coordinator: bool = True,
                 progress_interval_s: Optional[float] = PROGRESS_LOG_INTERVAL_S, metrics_port: Optional[int] = None):
        topics = _checked_topics(group_id, topics)
        _check_run_options(mode=mode, workers=workers, align=align, duration_s=duration_s,
                           trigger_interval_s=trigger_interval_s, max_worker_deaths=max_worker_deaths,
                           death_window_s=death_window_s, progress_interval_s=progress_interval_s,
                           metrics_port=metrics_port)
        if not isinstance(zk, str):
            raise InvalidConfig("zk must be a connect string (workers open their own sessions)")
        config = _checked_worker_config(consumer_config)
        self.bootstrap_servers = _job_bootstrap_servers(bootstrap_servers, config.pop("bootstrap_servers", None))
        if kafka and not self.bootstrap_servers:
            raise InvalidConfig("kafka properties are given but no bootstrap_servers: they are for Kafka's brokers")
        if not isinstance(commit_interval_ms, int) or commit_interval_ms < 0:
            raise InvalidConfig(f"commit_interval_ms must be a whole number >= 0, got {commit_interval_ms!r}")
        self.kafka = dict(kafka or {})
        self.spark, self.group_id, self.topics, self.process = spark, group_id, topics, process
        self.zk, self.workers, self.mode = zk, workers, mode
        self.data_dir = "" if self.bootstrap_servers else str(data_dir or default_data_dir())
        self.duration_s, self.stop_file, self.align, self.batch_end = duration_s, stop_file, align, batch_end
        self.flush_partial, self.poll_timeout_ms = flush_partial, poll_timeout_ms
        self.commit_interval_ms = commit_interval_ms
        self.trigger_interval_s, self.max_worker_deaths = trigger_interval_s, max_worker_deaths
        self.death_window_s, self.progress_interval_s = death_window_s, progress_interval_s
        self.metrics_port = metrics_port
        self.metrics_server = None  # while run() serves the metrics (metrics_port): its MetricsServer
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

    def open_data_plane(self, client=None) -> DataPlane:
        """The job's data plane, as its workers open it (``client``: ZooKeeper, for the
        embedded log's topic registry)."""
        return open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers, kafka=self.kafka,
                               zk=client, log_options=self.log_options)

    def run(self) -> JobSummary:
        sc = _spark_context(self.spark)
        self._check_spark(sc)
        client = start_client(self.zk, self.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS),
                              **zk_security(self.consumer_config))
        run_id = uuid.uuid4().hex[:8]
        try:
            if self.require_coordinator and client.exists(protocol.LEADER) is None:
                raise SparkJobError(f"no zkgroups coordinator is running against {self.zk} "
                                    "(start bin/coordinatord); the group would never get partitions")
            partitions, end_offsets = self._partitions_and_ends(client)
            self._start_run(client, run_id)
            started = time.time()
            pool = _WorkerPool(self, sc, self._worker_spec(sc, run_id, started, end_offsets),
                               f"zkgroups-{self.group_id}-{run_id}", client)
            reporter = ProgressReporter(client, self.group_id, run_id, partitions, end_offsets,
                                        self.progress_interval_s)
            rows = self._run_workers(pool, reporter, run_id)
            if pool.error is not None:
                raise SparkJobError(f"the Spark job failed: {pool.error}")
            return self._summary(sc, client, run_id, started, partitions, end_offsets, rows, pool)
        finally:
            self._end_run(client, run_id)

    def _check_spark(self, sc) -> None:
        check_spark_conf(sc.getConf())
        if self.workers > sc.defaultParallelism:
            log.warning("%d workers but only %d task slots: the extra workers start when others finish",
                        self.workers, sc.defaultParallelism)

    def _partitions_and_ends(self, client) -> Tuple[List[TopicPartition], Dict[TopicPartition, int]]:
        """The topics' partitions and, for a drain, the data plane's end offsets (the snapshot
        the workers drain to; empty for a stream)."""
        end_offsets = {}
        if self.mode == "stream" and not self.bootstrap_servers:
            counts = registered_partitions(client, self.topics)  # the driver leaves the shared log alone
        else:
            with self.open_data_plane(client) as plane:
                counts = topic_partitions(plane, client, self.topics)
                if self.mode == "drain":
                    end_offsets = plane.latest_offsets(
                        [TopicPartition(t, p) for t in self.topics for p in range(counts[t])])
        return [TopicPartition(t, p) for t in self.topics for p in range(counts[t])], end_offsets

    def _start_run(self, client, run_id: str) -> None:
        """Make the run known to ``request_stop`` (a stop asked for already is passed on now)."""
        client.ensure_path(protocol.SPARK_STOP)
        client.ensure_path(protocol.SPARK_RUNS)
        with self._lock:
            self._client, self.run_id = client, run_id
        if self._stop_requested.is_set():
            self.request_stop()

    def _worker_spec(self, sc, run_id: str, started: float, end_offsets) -> WorkerSpec:
        return WorkerSpec(
            group_id=self.group_id, topics=self.topics, process=self.process, zk=self.zk,
            data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers, kafka=self.kafka, mode=self.mode,
            app_id=sc.applicationId, run_id=run_id,
            started_at=started, deadline=started + self.duration_s if self.duration_s else None,
            end_offsets=end_offsets, stop_file=self.stop_file, align=self.align, batch_end=self.batch_end,
            flush_partial=self.flush_partial, poll_timeout_ms=self.poll_timeout_ms,
            commit_interval_ms=self.commit_interval_ms, trigger_interval_s=self.trigger_interval_s,
            consumer_config=self.consumer_config, log_options=self.log_options)

    def _run_workers(self, pool: "_WorkerPool", reporter: ProgressReporter, run_id: str) -> List[dict]:
        """The workers' rows, after every worker returned; progress logged and (``metrics_port``)
        metrics served meanwhile."""
        if self.metrics_port is not None:
            self.metrics_server = serve_job_metrics(self.metrics_port, self.group_id, self.mode, run_id,
                                                    reporter, pool)
            progress_log.info("metrics served at %s", self.metrics_server.url)
        try:
            with reporter:
                return pool.run()
        finally:
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None

    def _summary(self, sc, client, run_id: str, started: float, partitions, end_offsets, rows,
                 pool: "_WorkerPool") -> JobSummary:
        duration = time.time() - started
        committed = read_committed(client, self.group_id, partitions)
        return JobSummary(
            group_id=self.group_id, mode=self.mode, app_id=sc.applicationId, run_id=run_id,
            started_at=started, duration_s=duration, workers=[WorkerSummary(**r) for r in rows],
            end_offsets={str(tp): o for tp, o in end_offsets.items()},
            committed={str(tp): o for tp, o in committed.items()}, task_failures=pool.failures,
            restarts=pool.restarts, master=sc.master,
            attempts={cid: p.records for cid, p in read_progress(client, run_id).items()})

    def _end_run(self, client, run_id: str) -> None:
        """Forget the run's client; delete its stop and run znodes (best effort); close the client."""
        with self._lock:
            self._client = None
        for path in (protocol.spark_stop_path(run_id), protocol.spark_run_path(run_id)):
            try:
                client.delete(path, recursive=True)
            except Exception:
                pass
        close_client(client)


# ---------------------------------------------------------------- metrics

def serve_job_metrics(port: int, group_id: str, mode: str, run_id: str, reporter: ProgressReporter,
                      pool: "_WorkerPool") -> MetricsServer:
    """Serve the run's Prometheus metrics on ``port`` (a private registry) until closed.

    ==========================================  =======  ================  ===================================
    name                                        type     labels            meaning
    ==========================================  =======  ================  ===================================
    zkgroups_spark_info                         gauge    group, run, mode  1; which run
    zkgroups_spark_records_processed_total      counter                    records processed by every attempt
    zkgroups_spark_batches_total                counter                    batches processed by every attempt
    zkgroups_spark_workers_up                   gauge                      workers in the group now
    zkgroups_spark_lag                          gauge                      records behind (see the progress line)
    zkgroups_spark_worker_restarts_total        counter                    worker jobs started again after a failure
    zkgroups_spark_task_failures_total          counter                    failed worker task attempts
    ==========================================  =======  ================  ===================================

    Each scrape reads the progress znodes once (``ProgressReporter.snapshot()``); the
    restarts and failures are the driver's own counts.
    """
    registry = CollectorRegistry()
    registry.register(_JobCollector(group_id, mode, run_id, reporter, pool))
    return MetricsServer(registry, port).start()


class _JobCollector:
    """The scrape-time view of a run (the HTTP server's thread: reads ZooKeeper and the pool's counters)."""

    def __init__(self, group_id, mode, run_id, reporter: ProgressReporter, pool: "_WorkerPool"):
        self.group_id, self.mode, self.run_id, self.reporter, self.pool = group_id, mode, run_id, reporter, pool

    def describe(self):
        return []

    def collect(self):
        info = GaugeMetricFamily("zkgroups_spark_info", "Which run.", labels=["group", "run", "mode"])
        info.add_metric([self.group_id, self.run_id, self.mode], 1)
        with self.pool._lock:
            restarts, failures = self.pool.restarts, self.pool.failures
        families = [info,
                    CounterMetricFamily("zkgroups_spark_worker_restarts", "Worker jobs started again after a failure.",
                                        value=restarts),
                    CounterMetricFamily("zkgroups_spark_task_failures", "Failed worker task attempts.", value=failures)]
        try:
            now = self.reporter.snapshot()
        except (ZkGroupsError, KazooException):
            return families  # ZooKeeper not answering now: the driver's own counts only
        families += [
            CounterMetricFamily("zkgroups_spark_records_processed", "Records processed by every worker attempt.",
                                value=now.records),
            CounterMetricFamily("zkgroups_spark_batches", "Batches processed by every worker attempt.",
                                value=now.batches),
            GaugeMetricFamily("zkgroups_spark_workers_up", "Workers in the group now.", value=now.workers_up)]
        if now.lag is not None:
            families.append(GaugeMetricFamily("zkgroups_spark_lag", "Records behind: a drain's below the snapshot "
                                              "not committed, a stream's behind the log end.", value=now.lag))
        return families


class _WorkerPool:
    """The driver's side of the workers: one Spark job per worker, each from its own thread,
    resubmitted when it fails while the death budget holds (see the module docstring).

    Deaths are counted when Spark reports them (:mod:`consumer.spark.deaths`): a driver thread
    reads every running worker job's failed task attempts every ``DEATH_POLL_INTERVAL_S``, and
    a worker's thread reads its job's final count when the job ended; whichever reads an
    attempt first counts it (``_counted``), once. The death that spends the budget requests the
    stop at once (the other workers flush, commit and leave; the dying worker's retry, if Spark
    starts one, does not join) and is the one the job's error names: by the Python error the
    attempt recorded (``runs/<run>/errors``), else by Spark's reason its job failed with.

    Threads: ``run`` starts one thread per worker and the death watch, and joins them; ``_lock``
    guards the budget, the counters, ``_running``, ``_counted``, ``_causes`` and ``_spent_by``,
    which all of them update. ``error`` is set by ``run`` after the others ended.
    """

    def __init__(self, job: "GroupJob", sc, spec: WorkerSpec, job_group: str, client):
        self.job, self.sc, self.spec, self.job_group, self.client = job, sc, spec, job_group, client
        self.budget = DeathBudget(job.max_worker_deaths, job.death_window_s)
        self.failures = 0                     # failed worker task attempts, counted
        self.restarts = 0
        self.error: Optional[str] = None
        self._running: Dict[int, Tuple[int, str]] = {}      # worker index -> (restart, job group) of its job now
        self._counted: Dict[str, int] = {}                  # job group -> its failed attempts counted
        self._causes: Dict[Tuple[int, int], str] = {}       # (index, restart) -> its failed job's one line
        self._spent_by: Optional[Tuple[int, int, int]] = None  # (index, restart, attempt) that spent the budget
        self._watch_stop = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> List[dict]:
        rows: List[Optional[dict]] = [None] * self.job.workers
        threads = [threading.Thread(target=self._worker, args=(i, rows), name=f"zkgroups-worker-{i}", daemon=True)
                   for i in range(self.job.workers)]
        watch = threading.Thread(target=self._watch_deaths, name=f"zkgroups-deaths-{self.job_group}", daemon=True)
        watch.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._watch_stop.set()
        watch.join()
        self.error = self._error_line()
        return [r for r in rows if r is not None]

    def _worker(self, index: int, rows: List[Optional[dict]]) -> None:
        from dataclasses import replace

        sc, restart = self.sc, 0
        while True:
            group = f"{self.job_group}-w{index}-r{restart}"
            sc.setJobGroup(group, f"zkgroups group {self.job.group_id} ({self.job.mode}) worker {index}")
            with self._lock:
                self._running[index] = (restart, group)
            cause = None
            try:
                spec = replace(self.spec, restart=restart)
                rows[index] = sc.parallelize([index], 1).mapPartitions(task(spec, index)).collect()[0]
            except Exception as e:
                cause = _one_line(e)
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)
                sc.setLocalProperty("spark.job.description", None)
            self._settle(index, restart, group, cause)
            if cause is None or not self._may_restart():
                return
            log.warning("worker %d died (%s); starting it again", index, cause)
            restart += 1

    def _settle(self, index: int, restart: int, group: str, cause: Optional[str]) -> None:
        """Count the ended job's attempts not counted yet (a failed job: at least one death,
        as it may have failed before Spark ran a task)."""
        try:
            failed = settled_attempts(self.sc.statusTracker(), group).failed
        except Exception as e:  # Spark going away: the job's own failure still counts
            log.debug("worker %d: Spark's status tracker not readable: %s", index, e)
            failed = 0
        with self._lock:
            self._running.pop(index, None)
            if cause is not None:
                self._causes[(index, restart)] = cause
                failed = max(failed, self._counted.get(group, 0), 1)
        self._count(index, restart, group, failed)

    def _watch_deaths(self) -> None:
        """The death watch (its own thread): reads the running jobs' failed attempts."""
        stages: Dict[str, List[int]] = {}   # job group -> its stage ids, once Spark recorded its job
        while not self._watch_stop.wait(DEATH_POLL_INTERVAL_S):
            with self._lock:
                running = dict(self._running)
            live = {group for _, group in running.values()}
            stages = {group: ids for group, ids in stages.items() if group in live}
            try:
                tracker = self.sc.statusTracker()
                for index, (restart, group) in running.items():
                    self._count(index, restart, group, failed_attempts(tracker, group, stages).failed)
            except Exception as e:  # Spark going away: each job's end is still counted by its thread
                log.debug("Spark's status tracker not readable: %s", e)

    def _count(self, index: int, restart: int, group: str, failed: int) -> None:
        """``failed`` task attempts of worker ``index``'s job ``group`` so far: count the new ones now."""
        with self._lock:
            new = failed - self._counted.get(group, 0)
            if new <= 0:
                return
            self._counted[group] = failed
            self.failures += new
            spent = self.budget.add(time.monotonic(), new)
            if spent:
                self._spent_by = (index, restart, failed - 1)  # attempts are numbered from 0
        if spent:
            log.warning("worker %d: %d failed task attempts within %g s (at most %d): stopping the job", index,
                        self.budget.spent_with, self.budget.window_s, self.budget.limit)
            self.job.request_stop()  # the others flush, commit and leave

    def _may_restart(self) -> bool:
        with self._lock:
            if self.budget.within:
                self.restarts += 1
                return True
        return False

    def _error_line(self) -> Optional[str]:
        """The job's one line if the budget was spent (:func:`~consumer.spark.deaths.spent_line`)."""
        if self._spent_by is None:
            return None
        index, restart, attempt = self._spent_by
        return spent_line(self.budget, index, attempt, self._recorded_error(index, restart, attempt),
                          self._causes.get((index, restart), ""))

    def _recorded_error(self, index: int, restart: int, attempt: int) -> str:
        consumer_id = worker_consumer_id(self.spec.group_id, self.spec.app_id, self.spec.run_id, index, attempt,
                                         restart)
        try:
            raw, _ = self.client.get(f"{protocol.spark_errors_path(self.spec.run_id)}/{consumer_id}")
        except NoNodeError:
            return ""
        except KazooException as e:
            log.warning("worker %d: its recorded error is not readable: %s", index, e)
            return ""
        return protocol.decode_spark_error(raw)


def _checked_topics(group_id: str, topics) -> List[str]:
    """``topics`` as a list (one name may be given alone), every name valid, the group's too."""
    protocol.validate_name(group_id, "group")
    if isinstance(topics, str):
        topics = [topics]
    if not topics:
        raise InvalidConfig("give at least one topic")
    for t in topics:
        protocol.validate_name(t)
    return list(topics)


def _check_run_options(*, mode: str, workers, align, duration_s, trigger_interval_s, max_worker_deaths,
                       death_window_s, progress_interval_s, metrics_port) -> None:
    """GroupJob's options about how the run goes, each checked with one line."""
    if mode not in MODES:
        raise InvalidConfig(f"mode must be drain or stream, not {mode!r}")
    if not isinstance(workers, int) or workers < 1:
        raise InvalidConfig(f"workers must be a whole number >= 1, got {workers!r}")
    if align is not None and (not isinstance(align, int) or align < 1):
        raise InvalidConfig(f"align must be a whole number >= 1, got {align!r}")
    if duration_s is not None and duration_s <= 0:
        raise InvalidConfig(f"duration_s must be > 0, got {duration_s!r}")
    if trigger_interval_s is not None and not trigger_interval_s > 0:
        raise InvalidConfig(f"trigger_interval_s must be > 0, got {trigger_interval_s!r}")
    if not isinstance(max_worker_deaths, int) or max_worker_deaths < 0:
        raise InvalidConfig(f"max_worker_deaths must be a whole number >= 0, got {max_worker_deaths!r}")
    if not death_window_s > 0:
        raise InvalidConfig(f"death_window_s must be > 0, got {death_window_s!r}")
    if progress_interval_s is not None and not progress_interval_s > 0:
        raise InvalidConfig(f"progress_interval_s must be > 0, got {progress_interval_s!r}")
    if metrics_port is not None:
        check_port(metrics_port, "metrics_port")


def _checked_worker_config(consumer_config: Optional[dict]) -> dict:
    """The workers' consumer settings: WORKER_DEFAULTS under ``consumer_config``, unknown keys
    rejected on the driver; never auto-commit (workers commit after ``process`` returned)."""
    config = {**WORKER_DEFAULTS, **(consumer_config or {})}
    if config.pop("enable_auto_commit", False):
        raise InvalidConfig("enable_auto_commit cannot be used: workers commit after process() returns")
    from consumer.consumer import ConsumerConfig
    from coordinator import config as cfg
    cfg.build(ConsumerConfig, config, "consumer_config")
    if config.get("zk_tls") is not None:  # file names only reach the executors, never a key or its password
        config["zk_tls"] = parse_tls(config["zk_tls"], "consumer_config zk_tls").carried("consumer_config zk_tls")
    return config


def _job_bootstrap_servers(given: Optional[str], in_config: Optional[str]) -> str:
    """The Kafka brokers the job reads ("" for the embedded log), decided on the driver:
    ``bootstrap_servers``, else ``consumer_config``'s, else ``KAFKA_BOOTSTRAP_SERVERS``."""
    named = {check_bootstrap_servers(s) if s.strip() else "" for s in (given, in_config) if s is not None}
    if len(named) > 1:
        raise InvalidConfig("bootstrap_servers and consumer_config's bootstrap_servers differ")
    servers = bootstrap_servers_from(given if given is not None else in_config)
    return check_bootstrap_servers(servers) if servers else ""


def run_group_job(spark, group_id: str, topics: Sequence[str], process: Callable[[Batch], None], **options) -> JobSummary:
    """``GroupJob(spark, group_id, topics, process, **options).run()``."""
    return GroupJob(spark, group_id, topics, process, **options).run()


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
    spark_reason = next((m.group(1) for ln in reversed(lines)
                         for m in [re.search(r"most recent failure: Lost task [^:]*: [\w.$]*(?:Exception|Error): "
                                             r"(.+?)(?:\. Consider .*)?$", ln)] if m), None)
    cause = next((ln for ln in reversed(lines)
                  if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:|$)", ln)
                  and not ln.startswith(("org.", "java.", "py4j.", "scala."))), None)
    if cause:
        return cause
    if spark_reason:  # no Python exception: Spark's reason (a crashed Python worker, a lost executor)
        return spark_reason
    head = lines[0] if lines else type(e).__name__
    return re.sub(r"^\[[A-Z_]+\]\s*", "", head)
