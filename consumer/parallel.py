"""``ParallelConsumer``: many records of one partition in flight at once, in key order,
partition order or none, over a zkgroups consumer group (after Confluent's Parallel Consumer).

``ParallelConsumer(group, topics, ordering="key", max_concurrency=64, ...).run(fn)`` calls
``fn(record)`` for every record: on a thread pool of ``max_concurrency`` threads, or, when
``fn`` is a coroutine function, on an event loop thread of its own with at most
``max_concurrency`` coroutines running. It runs until :meth:`ParallelConsumer.close` (any
thread) or SIGTERM/SIGINT (when ``run`` is called on the main thread).

Guarantees
----------
* **Order.** ``ordering="key"``: records of one key of a partition never overlap and run in
  offset order; ``"partition"``: one record of a partition at a time; ``"unordered"``: none.
  Through retries too (:mod:`consumer.parallel_state`).
* **Commits.** Every ``commit_interval_ms`` (1 s) and before a partition is given up, each
  partition's committed offset is the lowest offset not finished, written with the offsets
  finished above it (``completed/<topic>/<partition>``) in the same fenced transaction
  (:meth:`~consumer.member.GroupMember.commit`). A new owner, or this one restarted, skips
  those: after a crash only the records in flight and those finished since the last commit
  are processed again. The offsets znode keeps Kafka's plain decimal.
* **Rebalances.** A revoked partition's queued records are dropped at once; its records in
  flight get ``revoke_timeout_ms`` to finish, then its point is committed and the partition
  released. A record that finishes later, or of a partition lost, is never committed by this
  member (the epoch of its ownership is gone; the fence would refuse it anyway).
* **Failures.** A record whose ``fn`` raises is tried again after ``retry_backoff_ms``,
  doubling up to ``retry_backoff_max_ms``, without holding up other keys; after
  ``max_attempts`` tries it is written to ``dead_letter_topic`` (headers: the reason, its
  topic, partition, offset and tries) and counts as finished, or, with
  ``on_failure="stop"`` (or no dead-letter topic), the consumer stops: ``run`` raises
  :class:`ProcessingFailed`, and the committed point stays at that record.
* **Back-pressure.** At most ``max_concurrency`` records run at once; a partition with
  ``max_pending_per_partition`` records taken and not finished is paused until half of
  them finished, so one slow key holds a bounded number of records in memory.

Thread rule: the thread that calls :meth:`~ParallelConsumer.run` is the **poller**: it
alone touches the consumer, the lanes, the progress and the counters (rebalance callbacks
run on it, inside ``poll()``). Workers (the pool's threads, or the event loop) run ``fn``
and put what happened on ``_results`` (a thread-safe queue); :meth:`~ParallelConsumer.close`
may be called from any thread (it moves the state and wakes the poller).
"""
from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from typing import Any, Callable, Dict, Optional, Set, Union

from kazoo.client import KazooClient

from coordinator import config as cfg
from coordinator import protocol
from coordinator.errors import CommitFailedError, InvalidConfig, ZkGroupsError
from coordinator.lifecycle import Lifecycle
from coordinator.signals import on_stop_signals
from coordinator.zkclient import close_client, start_client
from consumer.config import Topics, build_consumer_config
from consumer.consumer import Consumer, ConsumerRebalanceListener
from consumer.hand_out import WakeupException
from consumer.offsets import read_completed
from consumer.parallel_state import ORDERINGS, Lanes, Progress, Work
from consumer.producer import Producer
from consumer.records import TopicPartition

log = logging.getLogger("zkgroups.parallel")

#: How long the poller waits for a result when there is nothing else to do.
IDLE_WAIT_S = 0.01


class ProcessingFailed(ZkGroupsError):
    """A record failed ``max_attempts`` times and the consumer stops (``on_failure="stop"``)."""

    def __init__(self, tp: TopicPartition, offset: int, attempts: int, cause: BaseException) -> None:
        super().__init__(f"record {tp.topic}-{tp.partition}@{offset} failed {attempts} times: "
                         f"{type(cause).__name__}: {cause}")
        self.tp, self.offset, self.attempts, self.cause = tp, offset, attempts, cause


class ParallelState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    CLOSED = "closed"


class ThreadRunner:
    """Runs a plain function on ``n`` threads; results go to ``results``."""

    def __init__(self, fn: Callable, n: int, results):
        self._fn, self._results = fn, results
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="parallel-worker")

    def submit(self, work: Work) -> None:
        self._pool.submit(self._run, work)

    def flush(self) -> None:
        pass

    def _run(self, work: Work) -> None:
        try:
            self._fn(work.record)
            self._results.put((work, None))
        except BaseException as e:  # the poller decides: retry, dead-letter or stop
            self._results.put((work, e))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class LoopRunner:
    """Runs a coroutine function on an event loop thread of its own; results go to ``results``."""

    def __init__(self, fn: Callable, results):
        self._fn, self._results = fn, results
        self._loop = asyncio.new_event_loop()
        self._batch = []  # submitted, not handed to the loop yet (poller thread)
        self._thread = threading.Thread(target=self._loop.run_forever, name="parallel-loop", daemon=True)
        self._thread.start()

    def submit(self, work: Work) -> None:
        self._batch.append(work)

    def flush(self) -> None:
        """Hand the records submitted to the loop in one wake-up (not one per record)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._loop.call_soon_threadsafe(self._start, batch)

    def _start(self, batch) -> None:
        for work in batch:
            self._loop.create_task(self._run(work))

    async def _run(self, work: Work) -> None:
        try:
            await self._fn(work.record)
            self._results.put((work, None))
        except BaseException as e:
            self._results.put((work, e))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class _Listener(ConsumerRebalanceListener):
    """The consumer's listener: the parallel consumer's side first, then the application's."""

    def __init__(self, owner: "ParallelConsumer", user: Optional[ConsumerRebalanceListener]):
        self._owner, self._user = owner, user or ConsumerRebalanceListener()

    def on_partitions_assigned(self, assigned: Set[TopicPartition]) -> None:
        self._owner._assigned(assigned)
        self._user.on_partitions_assigned(assigned)

    def on_partitions_revoked(self, revoked: Set[TopicPartition]) -> None:
        self._owner._revoked(revoked)
        self._user.on_partitions_revoked(revoked)

    def on_partitions_lost(self, lost: Set[TopicPartition]) -> None:
        self._owner._lost(lost)
        self._user.on_partitions_lost(lost)


class ParallelConsumer(Lifecycle[ParallelState]):
    """A member of consumer group ``group_id`` that processes records concurrently (see the
    module docstring for what it guarantees). ``zk``, ``data_dir``, ``bootstrap_servers``,
    ``kafka`` and ``**config`` are :class:`~consumer.consumer.Consumer`'s (auto-commit is
    always off: this class commits). ``dead_letter_producer``: a started
    :class:`~consumer.producer.Producer` for ``dead_letter_topic`` (default: one of its own on
    the same data plane).

    States: NEW ──run()──▶ RUNNING ──close(), a signal, a stop──▶ STOPPING ──▶ CLOSED;
    NEW ──close()──▶ CLOSED. Threads: the module docstring's thread rule.
    """

    TRANSITIONS = {
        ParallelState.NEW: {ParallelState.RUNNING, ParallelState.CLOSED},
        ParallelState.RUNNING: {ParallelState.STOPPING},
        ParallelState.STOPPING: {ParallelState.CLOSED},
        ParallelState.CLOSED: set(),
    }

    def __init__(self, group_id: str, topics: Topics = None, pattern: Optional[str] = None, *,
                 zk: Union[None, str, KazooClient] = None, data_dir: Optional[str] = None,
                 ordering: str = "key", max_concurrency: int = 64, max_pending_per_partition: Optional[int] = None,
                 commit_interval_ms: int = 1000, revoke_timeout_ms: int = 5000, max_attempts: int = 5,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 10_000,
                 dead_letter_topic: Optional[str] = None, on_failure: str = "dead_letter",
                 dead_letter_producer: Optional[Producer] = None, listener: Optional[ConsumerRebalanceListener] = None,
                 **config: Any) -> None:
        super().__init__(ParallelState.NEW)
        self._check(ordering, max_concurrency, on_failure, max_attempts, config)
        self.group_id, self.ordering, self.max_concurrency = group_id, ordering, max_concurrency
        self.max_pending = max_pending_per_partition or max(4 * max_concurrency, 500)
        self._commit_interval_s, self._revoke_timeout_s = commit_interval_ms / 1000.0, revoke_timeout_ms / 1000.0
        self._max_attempts, self._backoff = max_attempts, (retry_backoff_ms / 1000.0, retry_backoff_max_ms / 1000.0)
        self.dead_letter_topic = dead_letter_topic
        self._stop_on_failure = on_failure == "stop" or dead_letter_topic is None
        self._lanes = Lanes(ordering)
        self._progress: Dict[TopicPartition, Progress] = {}
        self._paused: Set[TopicPartition] = set()
        self._results: "queue.SimpleQueue" = queue.SimpleQueue()
        self._in_flight = 0
        self._running: Counter = Counter()  # {epoch: records of that ownership running}
        self._epochs = 0
        self._failure: Optional[ProcessingFailed] = None
        self._runner = None
        self.counters = {"processed": 0, "skipped": 0, "retries": 0, "dead_lettered": 0, "commits": 0,
                         "key_wait_s": 0.0, "key_wait_max_s": 0.0, "started": 0}
        zk = zk or cfg.default_connect()
        self._own_client = isinstance(zk, str)
        self._client = self._start_client(zk, config) if self._own_client else zk
        self._dlq, self._own_dlq = dead_letter_producer, False
        try:
            self.consumer = Consumer(group_id, topics, pattern, zk=self._client, data_dir=data_dir,
                                     listener=_Listener(self, listener), enable_auto_commit=False, **config)
        except BaseException:
            if self._own_client:
                close_client(self._client)
            raise
        self._data_dir = data_dir
        # the dead-letter producer's data plane: the consumer's
        servers = self.consumer.config.bootstrap_servers or None
        self._plane = {"bootstrap_servers": servers, **({"kafka": config["kafka"]} if config.get("kafka") else {})}
        self._dlq_pool = ThreadPoolExecutor(1, thread_name_prefix="parallel-dead-letter")

    @staticmethod
    def _start_client(connect: str, config: dict) -> KazooClient:
        """A client of the group's settings, as the Consumer would start (session, identity, TLS);
        shared with it, so completed offsets are read on the same session."""
        c = build_consumer_config({k: v for k, v in config.items() if k != "kafka"})
        return start_client(connect, c.session_timeout_ms, c.connect_timeout_s, auth=c.zk_auth, tls=c.zk_tls,
                            sasl=c.zk_sasl)

    @staticmethod
    def _check(ordering, max_concurrency, on_failure, max_attempts, config) -> None:
        if ordering not in ORDERINGS:
            raise InvalidConfig(f"ordering must be one of {', '.join(ORDERINGS)}, not {ordering!r}")
        if not (isinstance(max_concurrency, int) and max_concurrency >= 1):
            raise InvalidConfig(f"max_concurrency must be a whole number >= 1, not {max_concurrency!r}")
        if on_failure not in ("dead_letter", "stop"):
            raise InvalidConfig(f"on_failure must be dead_letter or stop, not {on_failure!r}")
        if not (isinstance(max_attempts, int) and max_attempts >= 1):
            raise InvalidConfig(f"max_attempts must be a whole number >= 1, not {max_attempts!r}")
        if config.get("enable_auto_commit"):
            raise InvalidConfig("enable_auto_commit: a ParallelConsumer commits itself (commit_interval_ms)")
        config.pop("enable_auto_commit", None)

    # ------------------------------------------------------------ the poller's loop

    def run(self, fn: Callable) -> None:
        """Process every record with ``fn`` (a function, or a coroutine function) until
        :meth:`close` or SIGTERM/SIGINT; then commit and leave the group. Raises
        ProcessingFailed when a record failed for good and ``on_failure`` stops."""
        if not self._set_state(ParallelState.RUNNING, expect={ParallelState.NEW}):
            raise ZkGroupsError("a ParallelConsumer runs once")
        coroutine = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
        self._runner = LoopRunner(fn, self._results) if coroutine else \
            ThreadRunner(fn, self.max_concurrency, self._results)
        restore = self._install_signals()
        try:
            self._loop()
        finally:
            restore()
            self._finish()
        if self._failure is not None:
            raise self._failure

    def _loop(self) -> None:
        next_commit = time.monotonic() + self._commit_interval_s
        while self._state is ParallelState.RUNNING:
            busy = self._drain(block=False)
            busy |= self._dispatch()
            if time.monotonic() >= next_commit:
                self._commit()
                next_commit = time.monotonic() + self._commit_interval_s
            busy |= self._poll()
            if not busy:
                self._drain(block=True)

    def _poll(self) -> bool:
        """Take the records a poll has now (without waiting), as far as the bounds allow."""
        self._throttle()
        room = self.max_pending * max(1, len(self._progress)) - self._lanes.queued - self._in_flight
        try:
            batch = self.consumer.poll(0, max_records=max(1, min(500, room)))
        except WakeupException:  # close(): the loop sees the state
            return False
        except ZkGroupsError as e:
            log.warning("parallel consumer %s: poll failed: %s", self.consumer.consumer_id, e)
            return False
        now = time.monotonic()
        for tp, records in batch.items():
            st = self._progress.get(tp)
            if st is None:
                continue
            for r in records:
                if st.take(r.offset):
                    self._lanes.add(Work(r, tp, st.epoch, self._lanes.lane_of(r, tp, st.epoch), now))
                else:
                    self.counters["skipped"] += 1
        return bool(batch)

    def _throttle(self) -> None:
        """Pause partitions at their bound of pending records (or of their completed span);
        resume them at half."""
        for tp, st in self._progress.items():
            full = st.pending >= self.max_pending or not st.room()
            if full and tp not in self._paused:
                self._paused.add(tp)
                self.consumer.pause(tp)
            elif tp in self._paused and st.pending <= self.max_pending // 2 and st.room():
                self._paused.discard(tp)
                self.consumer.resume(tp)

    def _dispatch(self) -> bool:
        now = time.monotonic()
        started = False
        for work in self._lanes.due(now):  # retries first: their lanes wait for them
            self._start(work, now, retry=True)
            started = True
        while self._in_flight < self.max_concurrency:
            work = self._lanes.take()
            if work is None:
                break
            self._start(work, now)
            started = True
        self._runner.flush()
        return started

    def _start(self, work: Work, now: float, retry: bool = False) -> None:
        if not retry:
            wait = now - work.queued_at
            self.counters["key_wait_s"] += wait
            self.counters["key_wait_max_s"] = max(self.counters["key_wait_max_s"], wait)
            self.counters["started"] += 1
        work.attempts += 1
        self._in_flight += 1
        self._running[work.epoch] += 1
        self._runner.submit(work)

    def _drain(self, block: bool) -> bool:
        """Handle the results there are (waiting up to IDLE_WAIT_S for one when ``block``)."""
        got = False
        timeout = IDLE_WAIT_S
        due = self._lanes.next_due()
        if due is not None:
            timeout = max(0.0, min(timeout, due - time.monotonic()))
        while True:
            try:
                work, error = self._results.get(block=block and not got, timeout=timeout) \
                    if block and not got else self._results.get_nowait()
            except queue.Empty:
                return got
            got = True
            self._result(work, error)

    def _result(self, work: Work, error: Optional[BaseException]) -> None:
        self._in_flight -= 1
        self._running[work.epoch] -= 1
        st = self._progress.get(work.tp)
        if st is None or st.epoch != work.epoch:
            return  # given up (revoked past its timeout, or lost): never committed by this member
        if error is None:
            st.finish(work.record.offset)
            self._lanes.finish(work)
            self.counters["dead_lettered" if isinstance(work, _DeadLettered) else "processed"] += 1
        elif work.attempts < self._max_attempts:
            self.counters["retries"] += 1
            first, most = self._backoff
            self._lanes.retry_at(time.monotonic() + min(most, first * 2 ** (work.attempts - 1)), work)
        elif self._stop_on_failure:
            self._fail(work, error)
        else:
            self._dead_letter(work, error)

    def _fail(self, work: Work, error: BaseException) -> None:
        log.error("parallel consumer %s: %s-%d@%d failed %d times (%s: %s); stopping", self.consumer.consumer_id,
                  work.tp.topic, work.tp.partition, work.record.offset, work.attempts, type(error).__name__, error)
        if self._failure is None:
            self._failure = ProcessingFailed(work.tp, work.record.offset, work.attempts, error)
        self._set_state(ParallelState.STOPPING, expect={ParallelState.RUNNING})

    # ------------------------------------------------------------ the dead-letter topic

    def _dead_letter(self, work: Work, error: BaseException) -> None:
        """Write the record to the dead-letter topic on its own thread; it finishes once written."""
        self._in_flight += 1
        self._running[work.epoch] += 1
        self._dlq_pool.submit(self._send_dead_letter, work, error)

    def _send_dead_letter(self, work: Work, error: BaseException) -> None:
        r = work.record
        headers = [("zkgroups.error", f"{type(error).__name__}: {error}"[:1000].encode()),
                   ("zkgroups.topic", r.topic.encode()), ("zkgroups.partition", str(r.partition).encode()),
                   ("zkgroups.offset", str(r.offset).encode()), ("zkgroups.attempts", str(work.attempts).encode())]
        try:
            if self._dlq is None:
                self._dlq, self._own_dlq = Producer(self._client, data_dir=self._data_dir, **self._plane), True
            self._dlq.send(self.dead_letter_topic, r.value, key=r.key,
                           headers=list(r.headers or ()) + headers).get(timeout=30)
        except Exception as e:  # not written: the record is tried again later
            log.error("parallel consumer: writing %s-%d@%d to %s failed: %s", r.topic, r.partition, r.offset,
                      self.dead_letter_topic, e)
            work.attempts -= 1
            self._results.put((work, error))
            return
        self._results.put((_DeadLettered(work), None))

    # ------------------------------------------------------------ commits

    def _commit(self, partitions=None) -> None:
        """Commit each partition's point with the offsets finished above it, where they changed."""
        offsets, completed, what = {}, {}, {}
        for tp in list(partitions if partitions is not None else self._progress):
            st = self._progress.get(tp)
            now = st.committable() if st is not None else None
            if now is not None:
                offsets[tp], what[tp] = now[0], now
                completed[tp] = protocol.encode_completed(now[0], now[1])
        if not offsets:
            return
        try:
            self.consumer.commit_completed(offsets, completed)
        except CommitFailedError as e:  # moved: the new owner redoes what this one did not commit
            log.warning("parallel consumer %s: commit refused: %s", self.consumer.consumer_id, e)
            what = {tp: w for tp, w in what.items() if tp not in e.partitions}
        except ZkGroupsError as e:  # unreachable: written at the next commit
            log.warning("parallel consumer %s: commit failed: %s", self.consumer.consumer_id, e)
            return
        self.counters["commits"] += 1
        for tp, w in what.items():
            if tp in self._progress:
                self._progress[tp].committed(w)

    # ------------------------------------------------------------ rebalances (poller, inside poll())

    def _assigned(self, assigned: Set[TopicPartition]) -> None:
        bases = {tp: self.consumer.position(tp) for tp in assigned}
        try:
            skip = read_completed(self._client, self.group_id, bases)
        except Exception as e:  # unreadable now: nothing skipped, the records are processed again
            log.warning("parallel consumer %s: reading completed offsets failed: %s", self.consumer.consumer_id, e)
            skip = {}
        for tp, base in bases.items():
            self._epochs += 1
            self._progress[tp] = Progress(self._epochs, base, skip.get(tp, ()))

    def _revoked(self, revoked: Set[TopicPartition]) -> None:
        """Drop what is queued, give what runs ``revoke_timeout_ms``, commit, forget."""
        for tp in revoked:
            self._lanes.drop(tp)
        deadline = time.monotonic() + self._revoke_timeout_s
        while self._running_of(revoked) and time.monotonic() < deadline:
            self._drain(block=True)
        self._commit(revoked & set(self._progress))
        self._forget(revoked)

    def _lost(self, lost: Set[TopicPartition]) -> None:
        for tp in lost:
            self._lanes.drop(tp)
        self._forget(lost)

    def _forget(self, partitions: Set[TopicPartition]) -> None:
        for tp in partitions:
            self._progress.pop(tp, None)
            if tp in self._paused:  # a pause outlives a rebalance: a partition that comes back is fetched
                self._paused.discard(tp)
                self.consumer.resume(tp)

    def _running_of(self, partitions: Set[TopicPartition]) -> bool:
        return any(self._running[self._progress[tp].epoch] > 0 for tp in partitions if tp in self._progress)

    # ------------------------------------------------------------ metrics and lifecycle

    def metrics(self) -> Dict[str, float]:
        """Counters: records processed, skipped (finished by an earlier owner), retried,
        dead-lettered; commits; in flight and queued now; the mean and longest wait of a record
        for its key (from taken to started), in seconds. Read from any thread (a snapshot)."""
        c = dict(self.counters)
        started = c.pop("started")
        c["key_wait_mean_s"] = c.pop("key_wait_s") / started if started else 0.0
        c["in_flight"], c["queued"] = self._in_flight, self._lanes.queued
        return c

    def close(self) -> None:
        """Stop (from any thread): ``run`` finishes what is in flight (up to
        ``revoke_timeout_ms``), commits and leaves the group."""
        if self._set_state(ParallelState.CLOSED, expect={ParallelState.NEW}):
            self._close_parts()
            return
        if self._set_state(ParallelState.STOPPING, expect={ParallelState.RUNNING}):
            self.consumer.wakeup()

    def _finish(self) -> None:
        """Leave: the consumer's close revokes everything (so ``_revoked`` commits), then stop."""
        self._set_state(ParallelState.STOPPING, expect={ParallelState.RUNNING})
        try:
            self.consumer.close(autocommit=self._failure is None)
        finally:
            self._set_state(ParallelState.CLOSED)
            self._close_parts()

    def _close_parts(self) -> None:
        if self._state is ParallelState.CLOSED and self.consumer is not None and not self.consumer.closing:
            self.consumer.close()
        if self._runner is not None:
            self._runner.close()
        self._dlq_pool.shutdown(wait=True)
        if self._own_dlq:
            self._dlq.close()
        if self._own_client:
            close_client(self._client)

    def _install_signals(self) -> Callable[[], None]:
        """SIGTERM and SIGINT close (the main thread's ``run`` only; the handler may run while
        the main thread holds the fetcher's lock, which close() takes: a thread closes);
        returns the undo."""
        return on_stop_signals(self.close, name="parallel-signals")

    def __enter__(self) -> "ParallelConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DeadLettered(Work):
    """A record written to the dead-letter topic: it counts as finished."""

    __slots__ = ()

    def __init__(self, work: Work):
        for name in Work.__slots__:
            setattr(self, name, getattr(work, name))
