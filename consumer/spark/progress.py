"""A run's progress, read by the driver: the progress znodes the workers write
(:func:`read_progress`), the line the driver logs every ``progress_interval_s`` and what the
run's metrics serve (:class:`ProgressReporter`, :class:`RunProgress`).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Dict, Optional

from kazoo.exceptions import KazooException, NoNodeError

from coordinator import protocol
from coordinator.errors import ZkGroupsError
from consumer.spark.executor import read_committed

log = logging.getLogger("zkgroups.spark")
progress_log = logging.getLogger("zkgroups.spark.progress")


def read_progress(client, run_id: str) -> Dict[str, protocol.SparkProgress]:
    """Every worker attempt's last progress report in run ``run_id`` (consumer id -> progress);
    an unreadable one is logged and left out (it only feeds reports)."""
    parent = protocol.spark_progress_path(run_id)
    try:
        names = client.get_children(parent)
    except NoNodeError:
        return {}
    found = {}
    for name in names:
        try:
            raw, _ = client.get(f"{parent}/{name}")
            found[name] = protocol.decode_spark_progress(raw, f"{parent}/{name}")
        except NoNodeError:
            continue
        except ZkGroupsError as e:
            log.warning("%s", e)
    return found


class ProgressReporter:
    """A driver thread logging one line every ``interval_s`` while the workers run: records
    and batches processed (every attempt's progress znode), workers up, and the lag (a drain:
    records below the snapshot not committed yet; a stream: what the live workers report).

    Threads: its own; ``__exit__`` stops and joins it. Reads ZooKeeper only.
    """

    def __init__(self, client, group_id: str, run_id: str, partitions, end_offsets, interval_s: Optional[float]):
        self.client, self.group_id, self.run_id = client, group_id, run_id
        self.partitions, self.end_offsets, self.interval_s = partitions, end_offsets, interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "ProgressReporter":
        if self.interval_s:
            self._thread = threading.Thread(target=self._run, name=f"zkgroups-progress-{self.run_id}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                progress_log.info("%s", self.line())
            except (ZkGroupsError, KazooException) as e:
                progress_log.info("group %s run %s: progress not readable now (%s)", self.group_id, self.run_id, e)

    def snapshot(self) -> "RunProgress":
        """The run's progress now: one read of the progress znodes and the live workers (and,
        for a drain, the committed offsets)."""
        attempts = read_progress(self.client, self.run_id)
        try:
            live = set(self.client.get_children(protocol.spark_workers_path(self.run_id)))
        except NoNodeError:
            live = set()
        if self.end_offsets:
            committed = read_committed(self.client, self.group_id, list(self.end_offsets))
            lag: Optional[int] = sum(max(0, end - (committed[tp] or 0)) for tp, end in self.end_offsets.items())
        else:
            lags = [p.lag for cid, p in attempts.items() if cid in live]
            lag = None if any(v is None for v in lags) else sum(lags)
        return RunProgress(records=sum(p.records for p in attempts.values()),
                           batches=sum(p.batches for p in attempts.values()), workers_up=len(live), lag=lag,
                           lag_to_snapshot=bool(self.end_offsets))

    def line(self) -> str:
        now = self.snapshot()
        return (f"group {self.group_id} run {self.run_id}: {now.records:,} records "
                f"in {now.batches:,} batches, {now.workers_up} workers up, "
                f"lag {'-' if now.lag is None else f'{now.lag:,}'}" + (" (to the snapshot)" if now.lag_to_snapshot else ""))


@dataclass
class RunProgress:
    """What ``ProgressReporter.snapshot()`` read: records and batches processed by every
    attempt (as of its last report), live workers, and the lag (None: a live worker did not
    know its own; ``lag_to_snapshot``: a drain's, records below the snapshot not committed)."""
    records: int
    batches: int
    workers_up: int
    lag: Optional[int]
    lag_to_snapshot: bool
