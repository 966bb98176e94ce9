"""What runs on the Spark driver: the group job, its summary, session helpers, conf checks.

:class:`GroupJob` validates its options, checks the Spark configuration, the coordinator
and the topics, takes the drain snapshot from the data plane (the embedded log's end
offsets, or Kafka's log-end offsets), starts ``workers`` Spark tasks (each runs
:func:`consumer.spark.executor.task`), and after they all returned reads the group's
committed offsets into a :class:`JobSummary`. A failed Spark job becomes one
:class:`SparkJobError` line. :meth:`GroupJob.request_stop` creates the run's stop znode,
which every worker watches.

Kafka's librdkafka properties (``kafka``: SASL passwords, keys) travel to the executors only
inside the pickled :class:`~consumer.spark.executor.WorkerSpec`: never as Spark configuration
(which the Spark UI and event log show), never in the summary or a log line.
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
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from coordinator import protocol
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS, default_data_dir
from coordinator.errors import InvalidConfig, UnknownTopic, ZkGroupsError
from coordinator.kafka import check_bootstrap_servers
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from consumer.dataplane import DataPlane, bootstrap_servers_from, open_data_plane
from consumer.records import TopicPartition
from consumer.spark.batching import BatchEnd
from consumer.spark.executor import Batch, WorkerSpec, WorkerSummary, read_committed, task

log = logging.getLogger("zkgroups.spark")

MODES = ("drain", "stream")
#: Worker defaults (any ConsumerConfig key can be overridden through ``consumer_config``).
WORKER_DEFAULTS = dict(auto_offset_reset="earliest", max_poll_records=10000)

#: The project root: Spark's Python workers must be able to import this package.
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


# ---------------------------------------------------------------- Spark helpers

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
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PROJECT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *paths])
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "4", **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


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
        self.bootstrap_servers = _job_bootstrap_servers(bootstrap_servers, config.pop("bootstrap_servers", None))
        if kafka and not self.bootstrap_servers:
            raise InvalidConfig("kafka properties are given but no bootstrap_servers: they are for Kafka's brokers")
        self.kafka = dict(kafka or {})
        self.spark, self.group_id, self.topics, self.process = spark, group_id, list(topics), process
        self.zk, self.workers, self.mode = zk, workers, mode
        self.data_dir = "" if self.bootstrap_servers else str(data_dir or default_data_dir())
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

    def open_data_plane(self, client=None) -> DataPlane:
        """The job's data plane, as its workers open it (``client``: ZooKeeper, for the
        embedded log's topic registry)."""
        return open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers, kafka=self.kafka,
                               zk=client, log_options=self.log_options)

    def run(self) -> JobSummary:
        sc = _spark_context(self.spark)
        check_spark_conf(sc.getConf())
        if self.workers > sc.defaultParallelism:
            log.warning("%d workers but only %d task slots: the extra workers start when others finish",
                        self.workers, sc.defaultParallelism)
        client = start_client(self.zk, self.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS),
                              auth=self.consumer_config.get("zk_auth"))
        run_id = uuid.uuid4().hex[:8]
        try:
            if self.require_coordinator and client.exists(protocol.LEADER) is None:
                raise SparkJobError(f"no zkgroups coordinator is running against {self.zk} "
                                    "(start bin/coordinatord); the group would never get partitions")
            with self.open_data_plane(client) as plane:
                counts = topic_partitions(plane, client, self.topics)
                partitions = [TopicPartition(t, p) for t in self.topics for p in range(counts[t])]
                end_offsets = plane.latest_offsets(partitions) if self.mode == "drain" else {}
            client.ensure_path(protocol.SPARK_STOP)
            with self._lock:
                self._client, self.run_id = client, run_id
            if self._stop_requested.is_set():
                self.request_stop()
            started = time.time()
            spec = WorkerSpec(
                group_id=self.group_id, topics=self.topics, process=self.process, zk=self.zk,
                data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers, kafka=self.kafka, mode=self.mode,
                app_id=sc.applicationId, run_id=run_id,
                started_at=started, deadline=started + self.duration_s if self.duration_s else None,
                end_offsets=end_offsets, stop_file=self.stop_file, align=self.align, batch_end=self.batch_end,
                flush_partial=self.flush_partial, poll_timeout_ms=self.poll_timeout_ms,
                commit_interval_ms=self.commit_interval_ms,
                consumer_config=self.consumer_config, log_options=self.log_options)
            job_group = f"zkgroups-{self.group_id}-{run_id}"
            sc.setJobGroup(job_group, f"zkgroups group {self.group_id} ({self.mode}, {self.workers} workers)")
            error = None
            try:
                rows = sc.parallelize(range(self.workers), self.workers).mapPartitions(task(spec)).collect()
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


def topic_partitions(plane: DataPlane, client, topics: Sequence[str]) -> Dict[str, int]:
    """{topic: partition count}: the topic registry in ZooKeeper for the embedded log, Kafka's
    metadata on Kafka (whose topics the coordinator learns from a Kafka in ZooKeeper mode or
    its topic mirror). Raises UnknownTopic for a topic that is not there."""
    if plane.name != "kafka":
        registry = TopicRegistry(client)
        return {t: registry.partitions(t) for t in topics}
    counts = plane.partition_counts(topics)
    for t in topics:
        if t not in counts:
            raise UnknownTopic(t)
    return counts


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
