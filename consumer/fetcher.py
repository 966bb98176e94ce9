"""The fetcher: a background prefetch thread and bounded per-partition buffers behind ``poll()``.

Implements seed 004 (KIP-41, ``max.poll.records``):

* **Prefetch heuristic 1.** The prefetch thread fetches fetchable partitions (assigned, not
  paused, not failed) one chunk at a time, in rotating order, for as long as the number of
  records retained for *unpaused* partitions is below ``max_poll_records``. At most one read
  is in flight at a time, so the retained count never exceeds ``max_poll_records - 1 + one
  chunk`` (plus whatever paused partitions held when they were paused; their buffers are
  kept but never grow).
* **poll() reads when starved.** If nothing is buffered and no read is in flight, ``poll()``
  reads the next chunk in the calling thread rather than waiting for the prefetch thread:
  under the GIL the thread cannot read faster than the caller, and a hand-off per chunk (two
  thread wake-ups) costs about as much as reading 500 records. The prefetch thread reads
  ahead while the application is away from ``poll()`` processing records: ``poll()`` wakes it
  when the application's last absence lasted longer than a read takes (a wake-up per poll in
  a tight poll loop would cost ~10% of throughput), and it looks for work on its own every
  ``fetch_max_wait_ms``.
* **Fair, greedy round-robin in poll().** ``poll()`` starts at a rotating partition, takes as
  many buffered records as it can from it, then the next, and so on until ``max_records`` are
  taken. The next poll starts at the partition *after* the one where this poll stopped, so a
  partition with buffered records is served within at most ``len(assigned)`` polls however
  large another partition's backlog is.
* **Positions** advance only over records actually returned. Records fetched but not
  returned stay buffered.
* **Columns.** On a log that keeps its records in columns (the embedded log's
  ``fetch_columns``), ``poll_columns()`` hands out the same records as the log's
  :class:`~consumer.log.Columns` (one per stored batch a partition's records span), with no
  object per record; everything above holds for it as for ``poll()``. The fetcher buffers
  one form at a time, the one last asked for: switching (the first ``poll_columns()``, or a
  ``poll()`` after one) drops the buffers and reads again from the positions, as a ``seek``
  to each position does, so nothing is skipped or handed out twice.
* **Idle partitions** (no new data) are re-checked every ``fetch_max_wait_ms``; appends by
  other processes are therefore seen within about that long. A fetcher re-checks at most
  :data:`IDLE_CHECKS_PER_S` idle partitions a second, though: with more partitions than
  ``fetch_max_wait_ms`` × that (100 with the defaults) each is re-checked once per
  ``partitions / IDLE_CHECKS_PER_S`` seconds (1,000 partitions: once a second), so what a
  consumer spends looking at partitions with nothing new stays bounded however many it owns
  (each look is a read of the log's directory, ~50 µs; a thousand idle partitions every
  100 ms took half a core per consumer). Partitions with data are read back to back as
  before. The thread sleeps on a condition in between; it never spins. With nothing due it
  sleeps at least 1/:data:`IDLE_SWEEPS` of ``fetch_max_wait_ms`` and re-checks the partitions
  that fell due meanwhile in one sweep; while nothing is buffered, neither it nor ``poll()``
  walks the assignment.

Thread-safety and guarantees
----------------------------
All state is guarded by one lock (with two condition variables: one the prefetch thread waits
on, one ``poll()`` waits on), :class:`~consumer.fetch_buffers.FetchBuffers`' with the partitions
it guards. The log is read *outside* the lock. Every partition state (a
:class:`~consumer.partition_buffer.PartitionBuffer`, which also holds its buffered records) carries
an epoch that is bumped by ``seek``/``assign`` and the state object is dropped by ``revoke``
(each of them also changes ``Fetcher.generation``, the consumer's iterator's cue);
a fetch whose partition changed while it was in flight is discarded when it completes. The
``on_error`` callback runs in whichever thread did the read (the prefetch thread or a
``poll()`` caller), never under the lock, so it may call ``seek``/``revoke``/``wakeup``.

After ``revoke(tps)`` returns: no later ``poll()`` returns a record of ``tps`` (records are
selected under the lock; a ``poll()`` that selected its records before ``revoke`` took the
lock may still be on its way back to its caller) and no new read of them starts (neither in
the prefetch thread nor in ``poll()``). A read already in flight may finish, but its result is
thrown away.

Errors
------
A fetch that fails never makes the fetcher retry by itself. Whatever the exception
(``OffsetOutOfRange``, ``LogCorrupted``, ``PermissionError`` and other ``OSError``, ...), the
partition is *parked*: it is not fetched again until ``seek`` or ``assign`` repositions it,
and the exception is reported exactly once, through ``on_error(tp, exc)`` if given. Records
fetched before the error come first: they stay buffered, and the error is reported only once
``poll()`` has handed out the last of them (by the ``poll()`` that does, in its own thread,
before it returns them) — at once if none are buffered. So a caller that stops at the error
has been given every record up to the unreadable offset, however far the prefetch thread had
read ahead. A ``seek``, an ``assign`` or a ``revoke`` before then drops the pending report
with the records; so does a switch between ``poll()`` and ``poll_columns()`` (the records are
read again, and lead to the error again). Other partitions keep flowing. Every error except
``OffsetOutOfRange`` is also logged as one line (no traceback) when it is reported: ERROR
without ``on_error``, INFO with it (its owner reports the error: the consumer raises it from
``poll()``); ``OffsetOutOfRange`` is logged only when there is no ``on_error`` (the consumer
logs the reset it applies). The log returns the records before damaged data and raises only
for an offset that is itself unreadable, so the error names the first offset ``poll()``
cannot return; ``LogCorrupted.resume_offset`` is where a ``seek`` skips the damage.

What this module does not do: commit offsets, apply ``auto_offset_reset``, turn errors into
exceptions for the application (``on_error`` is the consumer's hook for both), or talk to
ZooKeeper.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional

from consumer.fetch_buffers import FetchBuffers
from consumer.log.batch import Columns
from consumer.records import ConsumerRecord, TopicPartition
from coordinator.errors import IllegalStateError, InvalidConfig, OffsetOutOfRange
from coordinator.lifecycle import Lifecycle

log = logging.getLogger("zkgroups.fetcher")

#: Smallest number of records asked of the log per fetch (keeps per-call overhead low).
MIN_FETCH_CHUNK = 500
#: Idle partitions are re-checked no more often than this, even with fetch_max_wait_ms=0.
MIN_IDLE_WAIT_MS = 1
#: Pause of the prefetch thread after a bug in its own loop (not a fetch error: those park).
ERROR_BACKOFF_S = 0.1
#: With no partition due, a fetch waits at least fetch_max_wait_ms / IDLE_SWEEPS: the idle
#: partitions that fall due meanwhile are then re-checked together, in one walk of the rotation.
IDLE_SWEEPS = 8
#: Idle partitions a fetcher re-checks per second at most, in all (see the module docstring).
IDLE_CHECKS_PER_S = 1000


class FetcherState(enum.Enum):
    NEW = "new"            # poll() works (reading only when starved); no prefetch thread yet
    RUNNING = "running"    # the prefetch thread reads ahead (if the data plane needs one)
    CLOSED = "closed"      # buffers dropped, the thread gone; poll() raises IllegalStateError


_CLOSED = FetcherState.CLOSED  # read on every poll(): one global, no enum class attribute


class Fetcher(FetchBuffers, Lifecycle[FetcherState]):
    """Prefetches records from a ``Log`` and hands them out fairly, ``max_records`` at a time.

    The partitions, their buffers and the fair round-robin over them are
    :class:`~consumer.fetch_buffers.FetchBuffers`' (``assign``, ``revoke``, ``seek``,
    ``pause``, ``resume``, ``give_back``, the positions); this class adds the reads (the
    prefetch thread's and a starved ``poll()``'s, one at a time: the read slot), the waits of
    ``poll()`` and the lifecycle.

    States (:class:`FetcherState`), changed through ``_set_state``::

        NEW --start()--> RUNNING --close()--> CLOSED
        NEW --close()--> CLOSED

    ``start()`` starts the prefetch thread once (a second call does nothing; after ``close()``
    it raises IllegalStateError); ``close()`` does its work once. ``poll()`` works without
    ``start()`` too (it then reads only when starved).

    Threads: all public methods are thread-safe; ``poll()`` is meant to be called from one
    thread at a time. ``_lock`` guards the partitions and buffers (see the module docstring);
    a state move may happen while it is held, never the other way round (``_lock`` before
    ``_state_lock``). Readers under ``_lock`` see ``CLOSED`` once ``close()`` has taken it.
    """

    TRANSITIONS = {
        FetcherState.NEW: {FetcherState.RUNNING, FetcherState.CLOSED},
        FetcherState.RUNNING: {FetcherState.CLOSED},
        FetcherState.CLOSED: set(),
    }

    #: Whether ``start()`` starts the prefetch thread. A data plane whose client prefetches in
    #: threads of its own (librdkafka) needs none: ``poll()`` reads what the client holds.
    _reads_ahead = True

    def __init__(self, log, max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20,
                 fetch_max_bytes: int = 50 << 20,
                 fetch_max_wait_ms: int = 100,
                 on_error: Optional[Callable[[TopicPartition, BaseException], None]] = None):
        for name, value in (("max_poll_records", max_poll_records),
                            ("max_partition_fetch_bytes", max_partition_fetch_bytes),
                            ("fetch_max_bytes", fetch_max_bytes)):
            if not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"{name} must be a positive integer, not {value!r}")
        if fetch_max_wait_ms < 0:
            raise InvalidConfig(f"fetch_max_wait_ms must be >= 0, not {fetch_max_wait_ms!r}")
        Lifecycle.__init__(self, FetcherState.NEW)
        FetchBuffers.__init__(self)
        self._log = log
        self.max_poll_records = max_poll_records
        # One log call reads one partition, so both byte limits bound the same call.
        self._fetch_bytes = min(max_partition_fetch_bytes, fetch_max_bytes)
        self._chunk = max(max_poll_records, MIN_FETCH_CHUNK)
        self._idle_wait = max(fetch_max_wait_ms, MIN_IDLE_WAIT_MS) / 1000.0  # never spin
        self._on_error = on_error

        self._busy = False                      # one read in flight at a time (thread or poll)
        # Who waits on the conditions: hot paths notify only when someone does.
        self._thread_waiting = False
        self._poll_waiters = 0
        # When poll() wakes the thread: only if the application stayed away from poll() (last
        # gap between polls) longer than a read takes (moving average).
        self._read_s = 0.0
        self._away_s = float("inf")
        self._returned_at: Optional[float] = None
        self._wakeup = False
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._lock:
            if not self._start_once(FetcherState.RUNNING):
                return  # started before: start-once
            if not self._reads_ahead:
                return
            self._thread = threading.Thread(target=self._run, name="zkgroups-fetcher", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the prefetch thread, drop all buffers; a blocked ``poll()`` returns ``{}``."""
        if not self._set_state(FetcherState.CLOSED):
            return  # closed before: close-once
        with self._lock:
            self._parts.clear()
            self._order.clear()
            self._fetch_cv.notify_all()
            self._data_cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ the log's ends

    def end_offsets(self, tps: Iterable[TopicPartition]) -> Dict[TopicPartition, int]:
        """Latest offsets asked of the log now (also refreshes ``highwater``)."""
        out = {}
        for tp in map(TopicPartition._make, tps):
            out[tp] = latest = self._log.latest_offset(tp.topic, tp.partition)
            with self._lock:
                st = self._parts.get(tp)
                if st is not None and (st.highwater is None or latest > st.highwater):
                    st.highwater = latest
        return out

    # ------------------------------------------------------------------ poll

    def wakeup(self) -> None:
        """Make a blocked ``poll()`` return ``{}`` at once; if none is blocked, the next
        ``poll()`` does (so a wakeup racing with the start of a poll is never lost)."""
        with self._lock:
            self._wakeup = True
            self._data_cv.notify_all()

    def poll(self, max_records: Optional[int] = None,
             timeout: Optional[float] = 0.0) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """Return up to ``max_records`` buffered records, fairly across partitions.

        Waits up to ``timeout`` seconds (``None``: no limit) for records; returns ``{}`` on
        timeout, ``wakeup()`` or ``close()``. When nothing is buffered and no read is in
        flight, poll() reads the next chunk itself instead of waiting for the prefetch
        thread (a thread hand-off per chunk costs more than the read); so a call may take as
        long as one ``Log.fetch``, even with ``timeout=0``.
        """
        return self._poll(max_records, timeout, False)

    @property
    def columnar(self) -> bool:
        """Whether the log hands out columns (``poll_columns`` works)."""
        return callable(getattr(self._log, "fetch_columns", None))

    def poll_columns(self, max_records: Optional[int] = None,
                     timeout: Optional[float] = 0.0) -> Dict[TopicPartition, List[Columns]]:
        """What :meth:`poll` returns, each partition's records as the log's Columns (one per
        stored batch they span, in offset order): same limits, fairness, positions and
        waits. IllegalStateError if the log does not keep columns (:attr:`columnar`)."""
        if not self.columnar:
            raise IllegalStateError("this log hands out records, not columns: call poll()")
        return self._poll(max_records, timeout, True)

    def poll_batch(self, max_records: Optional[int] = None,
                   timeout: Optional[float] = 0.0) -> Dict[TopicPartition, list]:
        """The batch path: what :meth:`poll` returns, each partition's records in the data
        plane's own form — the log's Columns (:meth:`poll_columns`), or on Kafka librdkafka's
        ``Message`` objects as it made them; same limits, fairness, positions and waits."""
        if not (self.columnar or not self.SWITCH_REFETCHES):
            raise IllegalStateError("this log hands out records, not batches: call poll()")
        return self._poll(max_records, timeout, True)

    def _poll(self, max_records: Optional[int], timeout: Optional[float], columns: bool) -> dict:
        n = self.max_poll_records if max_records is None else max_records
        if n < 1:
            raise ValueError(f"max_records must be >= 1, not {n!r}")
        drained: List[tuple] = []  # (tp, offset, error) of parked partitions this poll emptied
        try:
            return self._poll_locked(n, timeout, columns, drained)
        finally:
            for tp, offset, exc in drained:  # outside the lock, before the records reach the caller
                self._report(tp, offset, exc)

    def _poll_locked(self, n: int, timeout: Optional[float], columns: bool, drained: List[tuple]) -> dict:
        deadline = None
        lock = self._lock
        lock.acquire()
        try:
            if self._state is _CLOSED:
                raise IllegalStateError("fetcher is closed")
            if self._returned_at is not None:
                self._away_s = time.monotonic() - self._returned_at
            if self._columns != columns:
                self._switch_form(columns)
            while True:
                if self._wakeup:
                    self._wakeup = False
                    return {}
                if self._state is _CLOSED:
                    return {}
                result = self._drain(n, columns, drained)
                if result:
                    # The buffer shrank: let the thread read ahead while the application is
                    # away, if it stays away long enough for that to pay (in a tight poll loop
                    # a wake-up per poll costs more than it saves; poll() reads itself).
                    if self._thread_waiting and self._away_s > self._read_s:
                        self._fetch_cv.notify()
                    return result
                now = time.monotonic()
                if timeout is None:
                    remaining = None
                elif deadline is None:  # first pass: one read even with timeout=0
                    deadline = now + timeout
                    remaining = max(timeout, 1e-9)
                else:
                    remaining = deadline - now
                    if remaining <= 0:
                        return {}
                due = None
                if not self._busy:
                    job, due = self._pick(now)
                    if job is not None:
                        lock.release()
                        try:
                            self._fetch(job, wait=remaining)
                        finally:
                            lock.acquire()
                        continue
                if due is not None and (remaining is None or due < remaining):
                    remaining = due
                self._poll_waiters += 1
                try:
                    self._data_cv.wait(remaining)
                finally:
                    self._poll_waiters -= 1
        finally:
            self._returned_at = time.monotonic()
            lock.release()

    # ------------------------------------------------------------------ fetching

    def _run(self) -> None:
        """The prefetch thread: heuristic 1 of seed 004."""
        while True:
            try:
                job = self._next_job()
                if job is None:
                    return
                self._fetch(job)
            except Exception:  # a bug here must not kill consumption
                log.exception("fetcher: unexpected error in the prefetch loop; backing off")
                with self._lock:
                    if self._state is _CLOSED:
                        return
                    self._fetch_cv.wait(ERROR_BACKOFF_S)

    def _next_job(self):
        """Wait until the read slot is free, fewer than max_poll_records records are retained
        for unpaused partitions and some partition is due; None when closed."""
        with self._lock:
            while self._state is not _CLOSED:
                wait = None
                if not self._busy:
                    retained = 0
                    if self._drainable:
                        for st in self._parts.values():
                            if not st.paused:
                                retained += st.count
                    if retained < self.max_poll_records:
                        job, wait = self._pick(time.monotonic())
                        if job is not None:
                            return job
                if self._order and (wait is None or wait > self._idle_wait):
                    # Sleep at most fetch_max_wait_ms while partitions are assigned: poll() does
                    # not wake us after its own reads, nor when it drains the buffer in a tight
                    # poll loop (see poll), so we look for read-ahead work on our own.
                    wait = self._idle_wait
                self._thread_waiting = True
                try:
                    self._fetch_cv.wait(wait)
                finally:
                    self._thread_waiting = False
            return None

    def _pick(self, now: float):
        """Under the lock, with the read slot free: the next due partition in rotating order,
        as a job ``(state, epoch, offset)`` with the slot taken; or ``(None, seconds until an
        idle partition is due, or None)``."""
        size = len(self._order)
        wait = None
        for i, st in self._rotation(self._fetch_next):
            if st.paused or st.error is not None:
                continue
            if st.next_fetch <= now:
                self._fetch_next = i + 1 if i + 1 < size else 0
                self._busy = True
                return (st, st.epoch, st.fetch_offset, self._columns), None
            delay = st.next_fetch - now
            if wait is None or delay < wait:
                wait = delay
        if wait is not None:
            wait = max(wait, self._idle_wait / IDLE_SWEEPS)
        return None, wait

    def _fetch(self, job, wait: Optional[float] = None) -> None:
        """Read one chunk outside the lock (holding the read slot), then apply it under the
        lock, or discard it if its partition was revoked, re-assigned or seeked meanwhile.
        ``wait``: how long a read may wait for data (a ``poll()``'s time left; None from the
        prefetch thread). The log never waits; a data plane that pushes records may."""
        st, epoch, offset, columns = job
        tp = st.tp
        chunks, count, end, exc = [], 0, offset, None
        started = time.monotonic()
        try:
            if columns:
                chunks = self._log.fetch_columns(tp.topic, tp.partition, offset,
                                                 max_records=self._chunk, max_bytes=self._fetch_bytes)
                if chunks and chunks[0].base != offset:  # defensive: never an old record, never a gap
                    raise IllegalStateError(f"{tp}: asked for offset {offset}, read offset {chunks[0].base}")
                if chunks:
                    count, end = sum(c.count for c in chunks), chunks[-1].end
            else:
                records = self._log.fetch(tp.topic, tp.partition, offset,
                                          max_records=self._chunk, max_bytes=self._fetch_bytes)
                if records and records[0].offset < offset:  # defensive: never an old record
                    records = [r for r in records if r.offset >= offset]
                if records:
                    chunks, count, end = [records], len(records), records[-1].offset + 1
        except Exception as e:
            exc = e
        except BaseException:
            with self._lock:
                self._release_slot()
            raise
        with self._lock:
            self._release_slot()
            if not self._current(st, epoch) or st.fetch_offset != offset:
                return
            if exc is None:
                if count:
                    took = time.monotonic() - started
                    self._read_s += (took - self._read_s) / 8  # moving average
                    self._keep(st, chunks, count)
                    st.fetch_offset = last = end
                    if st.highwater is None or last > st.highwater:
                        st.highwater = last
                else:
                    # Nothing new: offset == latest. Look again after fetch_max_wait_ms.
                    st.highwater = offset
                    st.next_fetch = time.monotonic() + max(self._idle_wait, len(self._order) / IDLE_CHECKS_PER_S)
                return
            if not self._park(st, offset, exc):
                return
        self._report(tp, offset, exc)

    def _release_slot(self) -> None:
        # The prefetch thread is not woken here: after its own read it loops anyway, and after
        # a poll()'s read that poll drains the result and wakes the thread when it returns.
        # (Waking it for every read costs a GIL hand-off each time: ~10% of poll throughput.)
        self._busy = False
        if self._poll_waiters:
            self._data_cv.notify_all()  # new data, or a poll may now read itself

    def _report(self, tp: TopicPartition, offset: int, exc: BaseException) -> None:
        """Once per parked partition, outside the lock: one log line, then ``on_error``. With
        ``on_error`` the line is INFO: the callback's owner reports the error (the consumer
        raises it from ``poll()``), and a second ERROR line would say the same again."""
        if not isinstance(exc, OffsetOutOfRange):
            log.log(logging.ERROR if self._on_error is None else logging.INFO,
                    "fetcher: fetch of %s at offset %d failed (%s: %s); not fetching %s until seek",
                    tp, offset, type(exc).__name__, exc, tp)
        elif self._on_error is None:
            log.warning("fetcher: %s; not fetching %s until seek", exc, tp)
        if self._on_error is None:
            return
        try:
            self._on_error(tp, exc)
        except Exception:
            log.exception("fetcher: on_error callback failed for %s", tp)

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        """Under the lock: IllegalStateError once closed (before partitions are added)."""
        if self._state is _CLOSED:
            raise IllegalStateError("fetcher is closed")
