"""A worker attempt's progress znode, kept at most ``interval_s`` behind what the attempt did.

The worker's loop calls :meth:`ProgressPublisher.update` after every batch (a few attributes
under a lock, no ZooKeeper call); the publisher's own thread writes the znode when something
changed, at most once per ``interval_s``, so a change is in ZooKeeper at most ``interval_s``
after it happened, also while the loop is inside a long ``process`` call or a long run of
ready batches. A SIGKILLed attempt's count is therefore at most ``interval_s`` old (plus one
ZooKeeper write); the znode is persistent and stays until the run ends.

Only for reporting (the driver's progress lines, the summary's ``records_all_attempts``, the
run's metrics): trouble writing is logged at DEBUG, never the worker's failure.

Threads: the worker's loop calls ``update``, ``flush`` and ``close``; the publisher's thread
writes. ``_cond`` guards ``_pending`` (the latest counts not written yet) and ``_closed``;
``_write_lock`` orders the writes of a ``flush`` and of the thread (``_created``, ``_written``,
``_last_write``): an older update is never written over a newer one.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Tuple

from kazoo.exceptions import KazooException, NodeExistsError

from coordinator import protocol

log = logging.getLogger("zkgroups.spark")


class ProgressPublisher:
    def __init__(self, client, path: str, interval_s: float):
        self.client, self.path, self.interval_s = client, path, interval_s
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._pending: Optional[Tuple[int, protocol.SparkProgress]] = None  # (its number, the counts)
        self._updates = 0
        self._written = 0   # the number of the last update written
        self._closed = False
        self._created = False
        self._last_write = float("-inf")
        self._thread = threading.Thread(target=self._run, name=f"zkgroups-progress-{path.rsplit('/', 1)[-1]}",
                                        daemon=True)

    def start(self) -> "ProgressPublisher":
        self._thread.start()
        return self

    def update(self, records: int, batches: int, lag: Optional[int]) -> None:
        """The attempt's counts now (written within ``interval_s``)."""
        with self._cond:
            self._updates += 1
            self._pending = (self._updates, protocol.SparkProgress(records, batches, lag, time.time()))
            self._cond.notify()

    def flush(self) -> None:
        """Write what is pending now, in this thread (the stop path: before the worker returns)."""
        with self._cond:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._write(*pending)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                # at most one write per interval: wait out the rest of it (a close ends the wait)
                due = self._last_write + self.interval_s
                while not self._closed and time.monotonic() < due:
                    self._cond.wait(due - time.monotonic())
                if self._closed:
                    return
                pending, self._pending = self._pending, None
            if pending is not None:
                self._write(*pending)

    def _write(self, number: int, progress: protocol.SparkProgress) -> None:
        data = protocol.encode_spark_progress(progress)
        with self._write_lock:
            if number <= self._written:  # a flush wrote newer counts meanwhile
                return
            self._last_write = time.monotonic()
            try:
                if not self._created:
                    try:
                        self.client.create(self.path, data, makepath=True)
                        self._created = True
                        self._written = number
                        return
                    except NodeExistsError:  # an earlier create that timed out did happen
                        self._created = True
                self.client.set(self.path, data)
                self._written = number
            except KazooException as e:
                log.debug("progress %s not published: %s", self.path, e)
