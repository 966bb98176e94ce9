"""What runs in a Spark task: one group member per task, its loop, its commits.

The driver ships a :class:`WorkerSpec` and :func:`task` to the executors (cloudpickle: the
spec's module path, this one, must be importable there). Each task runs a :class:`_Worker`:
a :class:`~consumer.consumer.Consumer` in the group that polls, cuts the records into
batches (:mod:`consumer.spark.batching`), calls the user's ``process(batch)`` and commits
the batch's offsets after ``process`` returned (at-least-once), then leaves the group
cleanly and returns its :class:`WorkerSummary`. Commits are coalesced: at most one every
``commit_interval_ms`` (0 commits every batch), and always before a partition is handed
over, when a partition reaches the drain snapshot and when the worker stops.

On the embedded log a worker polls columns (``Consumer.poll_columns``): its batches hold the
log's :class:`~consumer.log.Columns` and no record object is built unless ``process`` reads
``batch.records``; everything else (owned partitions only, the lease, positions, commits) is
what ``poll()`` gives. On Kafka it polls records.

A worker stops when the group drained the snapshot (drain), at the deadline, when the run's
stop znode appears, or when the stop file appears. Nothing here imports pyspark except the
task function, when it runs.

The stop barrier (deadline, stop znode, stop file): a stopping worker stops fetching,
processes what it fetched (the partial batches, with ``flush_partial``), commits, marks
itself flushed under the run's znode and waits until every live worker of the run has
flushed (at most ``BARRIER_TIMEOUT_S`` beyond the session timeout) before it leaves the
group. So no member leaves while another still holds fetched records: no rebalance of a
stop moves a partition away from records that were fetched and not processed
(``WorkerSummary.stop_rebalances`` counts the generations newer than the group's at a
worker's stop that it applied while another worker had not flushed: 0 unless a worker died
meanwhile; a generation decided before the stop and applied just after it is not one). Once
released, the members leave at about the same time; a revocation that reaches one still
leaving finds nothing to commit and nobody fetches again. A worker started after the stop (a
retry, or a task waiting for a slot) does not join the group at all.

Triggers (``trigger_interval_s``, like Structured Streaming's processing-time trigger): a
batch is cut when it is full (``align``) or when the interval has passed since the last
trigger, whichever comes first; then whatever was fetched and whose cut is not fixed is
processed.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from kazoo.exceptions import KazooException

from coordinator import protocol, read
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import CommitFailedError, ZkGroupsError
from coordinator.zkclient import close_client, start_client
from consumer.log import Columns
from consumer.records import ConsumerRecord, TopicPartition
from consumer.spark.batching import BatchCutter, BatchEnd, ColumnRun, Run, end_offset, first_offset
from consumer.spark.publisher import ProgressPublisher

log = logging.getLogger("zkgroups.spark")

GROUP_CHECK_INTERVAL_S = 0.1
BARRIER_CHECK_INTERVAL_S = 0.05
BARRIER_TIMEOUT_S = 10.0      # beyond the session timeout: a dead worker's znode is gone by then
DRAIN_POLL_TIMEOUT_MS = 50    # drain: idle workers look at the group's progress this often
STOP_FILE_CHECK_INTERVAL_S = 0.2
PROGRESS_INTERVAL_S = 1.0     # a worker's progress znode is at most this old (and written at most this often)
ERROR_RECORD_TIMEOUT_S = 2.0  # a failing worker waits at most this long to record its error


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
    """One call's worth of records: each partition's contiguous run. ``records`` maps each
    partition to its records. On the embedded log the worker polls columns: ``columns`` maps
    each partition to the log's :class:`~consumer.log.Columns` (no object per record) and
    ``records`` builds the record objects the first time it is read; on Kafka ``columns`` is
    None."""

    __slots__ = ("runs", "worker", "_records")

    def __init__(self, runs: Dict[TopicPartition, Run], worker: WorkerContext):
        self.runs = runs
        self.worker = worker
        self._records: Optional[Dict[TopicPartition, List[ConsumerRecord]]] = None

    @property
    def records(self) -> Dict[TopicPartition, List[ConsumerRecord]]:
        if self._records is None:
            self._records = {tp: run.records(tp) if isinstance(run, ColumnRun) else run
                             for tp, run in self.runs.items()}
        return self._records

    @property
    def columns(self) -> Optional[Dict[TopicPartition, List[Columns]]]:
        """Each partition's records as the log's Columns, in offset order; None unless the
        batch came as columns."""
        if not all(isinstance(run, ColumnRun) for run in self.runs.values()):
            return None
        return {tp: run.parts for tp, run in self.runs.items()}

    @property
    def ranges(self) -> Dict[TopicPartition, Tuple[int, int]]:
        """``{tp: (first offset, last offset + 1)}``."""
        return {tp: (first_offset(run), end_offset(run)) for tp, run in self.runs.items()}

    def __len__(self) -> int:
        return sum(map(len, self.runs.values()))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for recs in self.records.values():
            yield from recs

    def __repr__(self) -> str:
        ranges = ", ".join(f"{tp}[{a}:{b})" for tp, (a, b) in sorted(self.ranges.items()))
        return f"Batch({ranges})"


# ---------------------------------------------------------------- what a task returns

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
    stop_rebalances: int = 0       # generations decided after its stop, applied while a worker of the run
                                   # had not flushed (the barrier keeps it 0 unless a worker died meanwhile)
    barrier_s: float = 0.0         # time spent waiting for the other workers to flush


# ---------------------------------------------------------------- helpers

_ILLEGAL = re.compile(r"[^a-zA-Z0-9._-]")


def sanitize_id(raw: str) -> str:
    """A valid znode / consumer-id name: illegal characters become ``_``."""
    name = _ILLEGAL.sub("_", raw)[:protocol.MAX_NAME_LENGTH]
    return name if name not in ("", ".", "..") else "_"


def zk_security(consumer_config: dict) -> dict:
    """``start_client``'s keywords for the job's ZooKeeper identity and transport (digest
    ``zk_auth``, TLS ``zk_tls``, SASL ``zk_sasl``), as the driver and every worker connect. The
    driver carries ``zk_tls`` as file names (:meth:`~coordinator.zktls.ZkTls.carried`): the
    files must exist at those paths on every executor."""
    return {"auth": consumer_config.get("zk_auth"), "tls": consumer_config.get("zk_tls"),
            "sasl": consumer_config.get("zk_sasl")}


def worker_consumer_id(group_id: str, app_id: str, run_id: str, index: int, attempt: int, restart: int = 0) -> str:
    return sanitize_id(f"{group_id}_spark-{app_id}-{run_id}-p{index}-r{restart}-a{attempt}")


def read_committed(client, group_id: str, partitions: Sequence[TopicPartition]) -> Dict[TopicPartition, Optional[int]]:
    """The group's committed offsets of ``partitions`` (None: none committed; a corrupt one is
    logged and read as None), read in parallel. Workers read them to know when the group has
    drained the snapshot; the driver, for the job's summary."""
    problems: Dict[TopicPartition, str] = {}
    committed = read.committed_offsets(client, group_id, partitions, problems)
    for tp, problem in problems.items():
        log.error("%s: %s", protocol.offsets_path(group_id, tp.topic, tp.partition), problem)
    return committed


# ---------------------------------------------------------------- the task

@dataclass
class WorkerSpec:
    """Everything a worker task needs; pickled to the executors (the one way the ``kafka``
    properties, which may hold secrets, reach them: no Spark conf, no repr)."""
    group_id: str
    topics: List[str]
    process: Callable[[Batch], None]
    zk: str
    data_dir: str                             # the embedded log ("" on Kafka)
    bootstrap_servers: str                    # Kafka's brokers ("": the embedded log)
    kafka: Dict[str, object] = field(repr=False)  # librdkafka properties
    mode: str
    app_id: str
    run_id: str
    started_at: float
    deadline: Optional[float]                 # epoch seconds
    end_offsets: Dict[TopicPartition, int]    # drain snapshot
    stop_file: Optional[str]
    align: Optional[int]
    batch_end: Optional[BatchEnd]
    flush_partial: bool
    poll_timeout_ms: int
    commit_interval_ms: int
    consumer_config: dict
    log_options: Optional[dict]
    trigger_interval_s: Optional[float] = None
    restart: int = 0                          # the driver's resubmissions of this worker before this one


def task(spec: WorkerSpec, index: Optional[int] = None):
    """The ``mapPartitions`` function: runs worker ``index`` (default: the Spark partition
    index), yields its summary (a dict)."""
    def run(iterator):
        from pyspark import TaskContext

        # Read the task's input (its index) to the end: pyspark reuses a Python worker only
        # after a task that did, and a fresh one costs the worker's imports again (~0.3 s).
        for _ in iterator:
            pass
        ctx = TaskContext.get()
        yield _Worker(spec, ctx.partitionId() if index is None else index, ctx.attemptNumber()).run()
    return run


class _Worker:
    """One group member inside one Spark task. Listener callbacks run inside poll()."""

    def __init__(self, spec: WorkerSpec, index: int, attempt: int):
        from consumer.consumer import ConsumerRebalanceListener

        self.spec = spec
        self.ctx = WorkerContext(spec.group_id, spec.app_id, spec.run_id, index, attempt,
                                 worker_consumer_id(spec.group_id, spec.app_id, spec.run_id, index,
                                                    attempt, spec.restart))
        self.batches = BatchCutter(spec.align, spec.end_offsets if spec.mode == "drain" else None, spec.batch_end)
        self.uncommitted: Dict[TopicPartition, int] = {}  # processed up to here, not committed yet
        self._next_commit = 0.0
        self.paused: set = set()
        self.handled: set = set()
        self.first_record_at: Optional[float] = None
        self.stop_flag = threading.Event()
        self.consumer = None
        self.columnar = False  # the consumer hands out columns (the embedded log)
        self.client = None
        self._next_group_check = 0.0
        self._next_file_check = 0.0
        self._next_trigger = time.monotonic() + (spec.trigger_interval_s or 0)
        self._generation_at_stop: Optional[int] = None     # the group's, when this worker stopped
        self._generation_at_barrier: Optional[int] = None  # this member's, while a worker had not flushed
        self._barrier_s = 0.0
        self._next_progress = 0.0
        self._last_lag: Optional[int] = None
        self.publisher: Optional[ProgressPublisher] = None

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

        logging.getLogger("kazoo").setLevel(logging.ERROR)
        spec, started = self.spec, time.time()
        client = self.client = start_client(spec.zk, spec.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS),
                                            **zk_security(spec.consumer_config))
        reason = None
        try:
            DataWatch(client, protocol.spark_stop_path(spec.run_id), self._on_stop_node)  # first call: now
            early = self._stop_reason(client)
            if early:
                reason = early  # stopped or drained already: do not join (and rebalance) the group at all
            else:
                reason = self._member(client)
        except Exception as e:
            self._record_error(client, e)
            raise
        finally:
            close_client(client)
        return asdict(WorkerSummary(
            index=self.ctx.index, attempt=self.ctx.attempt, consumer_id=self.ctx.consumer_id,
            records=self.ctx.records, batches=self.ctx.batches, partitions=sorted(map(str, self.handled)),
            rebalances=self._rebalances(), started_at=started,
            first_record_at=self.first_record_at, duration_s=time.time() - started, stop_reason=reason,
            stop_rebalances=(max(0, self._generation_at_barrier - self._generation_at_stop)
                             if self._generation_at_barrier is not None else 0),
            barrier_s=self._barrier_s))

    def _member(self, client) -> str:
        """Join the group, run the loop, leave; the progress znode kept fresh meanwhile."""
        from consumer.consumer import Consumer

        spec = self.spec
        client.create(f"{protocol.spark_workers_path(spec.run_id)}/{self.ctx.consumer_id}", b"",
                      ephemeral=True, makepath=True)
        self.consumer = Consumer(spec.group_id, spec.topics, zk=client, data_dir=spec.data_dir,
                                 bootstrap_servers=spec.bootstrap_servers, kafka=spec.kafka,
                                 listener=self.listener, consumer_id=self.ctx.consumer_id,
                                 log_options=spec.log_options, enable_auto_commit=False, **spec.consumer_config)
        self.columnar = self.consumer.columnar
        self.publisher = ProgressPublisher(client, f"{protocol.spark_progress_path(spec.run_id)}/{self.ctx.consumer_id}",
                                           PROGRESS_INTERVAL_S).start()
        failed = True
        try:
            reason = self._loop(client)
            failed = False
            return reason
        finally:
            try:
                self._close(failed)
            finally:
                if failed:
                    self.publisher.flush()  # what the failed attempt did, for the summary
                self.publisher.close()

    def _rebalances(self) -> int:
        return self.consumer.group_metadata().rebalances if self.consumer else 0

    def _generation(self) -> int:
        return self.consumer.group_metadata().generation if self.consumer else -1

    def _group_generation(self, client) -> int:
        """The group's generation now (the leader's last decision); this member's if unreadable."""
        try:
            return read.group_state(client, self.spec.group_id).generation
        except (ZkGroupsError, KazooException):
            return self._generation()

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

    def _record_error(self, client, error: Exception) -> None:
        """Leave this attempt's Python error for the driver, which cannot get it from Spark
        while the worker's job goes on (Spark retries the task): one line, as Spark's own
        report of a Python worker's failure ends. Only for that line: trouble is logged."""
        from kazoo.handlers.threading import KazooTimeoutError

        line = "".join(traceback.format_exception_only(type(error), error))
        try:
            client.create_async(f"{protocol.spark_errors_path(self.spec.run_id)}/{self.ctx.consumer_id}",
                                protocol.encode_spark_error(line), makepath=True).get(timeout=ERROR_RECORD_TIMEOUT_S)
        except (KazooException, KazooTimeoutError) as e:
            log.debug("worker %s: error not recorded: %s", self.ctx.consumer_id, e)

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
                self._generation_at_stop = self._group_generation(client)
                if reason != "drained" and spec.flush_partial and spec.align:
                    self._flush_partial()
                self._commit(force=True)
                if reason != "drained":
                    self._barrier(client)
                self._publish_progress(force=True)  # after the barrier: the stop path waits for nothing else
                return reason
            timeout = spec.poll_timeout_ms
            if spec.mode == "drain":
                timeout = min(timeout, DRAIN_POLL_TIMEOUT_MS)
            if spec.deadline is not None:
                timeout = max(0, min(timeout, int((spec.deadline - time.time()) * 1000)))
            if self.columnar:  # the embedded log: records read once, as columns, never as objects
                records = {tp: ColumnRun(parts) for tp, parts in consumer.poll_columns(timeout_ms=timeout).items()}
            else:
                records = consumer.poll(timeout_ms=timeout)
            if records:
                self._accept(records)
            ready = self.batches.ready()
            while ready:
                self._process(ready)
                ready = self.batches.ready()
            if spec.trigger_interval_s and time.monotonic() >= self._next_trigger:
                self._next_trigger = time.monotonic() + spec.trigger_interval_s
                self._flush_partial()
            self._commit()
            self._publish_progress()

    def _flush_partial(self) -> None:
        partial = self.batches.partial()
        if partial:
            self._process(partial)

    def _publish_progress(self, force: bool = False) -> None:
        """Refresh the lag (at most every PROGRESS_INTERVAL_S unless ``force``) and hand the
        counts to the progress znode's publisher (:mod:`consumer.spark.publisher`); ``force``
        writes them now. The driver's progress lines and the summary's count of every attempt
        read that znode."""
        now = time.monotonic()
        if force or now >= self._next_progress:
            self._next_progress = now + PROGRESS_INTERVAL_S
            self._last_lag = self._lag()
            self.publisher.update(self.ctx.records, self.ctx.batches, self._last_lag)
        if force:
            self.publisher.flush()

    def _lag(self) -> Optional[int]:
        """Records behind the end offsets of this member's partitions (None: not known now)."""
        try:
            assigned = self.consumer.assignment()
            if not assigned:
                return 0
            ends = self.consumer.end_offsets(assigned)
            return sum(max(0, ends[tp] - self.consumer.position(tp)) for tp in assigned if tp in ends)
        except Exception as e:  # only for the progress report: never the worker's failure
            log.debug("worker %s: lag not known now: %s", self.ctx.consumer_id, e)
            return None

    def _barrier(self, client) -> None:
        """Mark this worker flushed; wait until every live worker of the run has (bounded)."""
        run_id, me = self.spec.run_id, self.ctx.consumer_id
        started = time.monotonic()
        self._generation_at_barrier = self._generation()  # until its mark, others may wait for it
        client.create(f"{protocol.spark_flushed_path(run_id)}/{me}", b"", ephemeral=True, makepath=True)
        session_s = self.spec.consumer_config.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS) / 1000.0
        give_up = started + session_s + BARRIER_TIMEOUT_S
        while True:
            # Flushed marks first: a worker that has left since drops out of both listings at once
            # (its ephemeral znodes go with its session), so it is never taken for one that has
            # not flushed; one that flushes between the two reads is only waited for once more.
            flushed = set(client.get_children(protocol.spark_flushed_path(run_id)))
            waiting = set(client.get_children(protocol.spark_workers_path(run_id))) - flushed
            if not waiting:
                break
            # Read right after seeing a worker that has not flushed: any generation applied so
            # far reached this member while that worker could still hold fetched records.
            self._generation_at_barrier = self._generation()
            if time.monotonic() >= give_up:
                log.warning("worker %s: leaving without %d workers that did not flush: %s", me, len(waiting),
                            ", ".join(sorted(waiting)))
                break
            time.sleep(BARRIER_CHECK_INTERVAL_S)
        self._barrier_s = time.monotonic() - started

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

    # -------------------------------------------------------- batches

    def _accept(self, records: Dict[TopicPartition, Run]) -> None:
        found = self.batches.accept(records)
        for tp, expected, got in found.jumps:
            log.warning("worker %s: %s jumped from %d to %d", self.ctx.consumer_id, tp, expected, got)
        for tp in found.complete:
            if tp not in self.paused:  # everything up to the snapshot is fetched
                try:
                    self.consumer.pause(tp)
                    self.paused.add(tp)
                except ZkGroupsError:  # lost meanwhile (session end): nothing to pause
                    pass

    def _process(self, ready: Dict[TopicPartition, Run]) -> None:
        if self.first_record_at is None:
            self.first_record_at = time.time()
        self.spec.process(Batch(ready, self.ctx))
        for tp, recs in ready.items():
            self.uncommitted[tp] = end_offset(recs)
        finished = self.batches.processed(ready)
        self.handled.update(ready)
        self.ctx.batches += 1
        self.ctx.records += sum(map(len, ready.values()))
        self.publisher.update(self.ctx.records, self.ctx.batches, self._last_lag)  # in ZooKeeper within a second
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
            # Those partitions moved on; their new owner redoes what we did not commit (at-least-once).
            log.warning("worker %s: %s", self.ctx.consumer_id, e)
            self.batches.forget(e.partitions)

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
        self.batches.forget(partitions)  # not processed: the next owner starts at the committed offset
        for tp in partitions:
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
