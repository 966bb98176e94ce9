"""Lag for the console: every group's committed offsets against the data plane's log ends,
read every ``interval_s`` (never per request), with a short history per partition for the
pages' charts and catch-up estimates.

Each round reads, as ``groupctl groups describe --all-groups`` and ``groupctl exporter`` do,
every group's offsets znodes from ZooKeeper (its topics listed, its committed offsets read;
pipelined over all groups) and the log ends of the partitions they name from the data plane
(:class:`LogEnds`: the embedded log, or Kafka), and shapes them with
:mod:`coordinator.documents`, so the console's offsets documents are the CLI's. The round's
rows replace the last ones whole. A failed round keeps the last reading and is counted.

Lag in seconds (:mod:`coordinator.lagtime`): after the offsets, the timestamp of the record
at each lagging partition's committed offset is read from the data plane
(:meth:`LogEnds.timestamps`, one bounded read per spot not read in an earlier round), and
each row's age is taken as of when its committed offset was read; the estimate divides the
lag by the committed offset's growth over the newest :data:`coordinator.lagtime.RATE_WINDOW`
rounds of :class:`History`.

ZooKeeper cost per round: per group, one listing of ``offsets/``, one per topic under it, and
one read per partition; 10,000 groups of one partition is about 30,000 pipelined reads (a few
seconds of one core). Raise ``--lag-interval`` for very many groups.

Threads: the sampler's own thread reads; pages read :meth:`LagSampler.reading` (one
reference, replaced whole) from any thread.
"""
from __future__ import annotations

import logging
import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from kazoo.exceptions import NoNodeError

from coordinator import documents, lagtime, protocol
from coordinator.console.snapshot import ClusterSnapshot, GroupView
from coordinator.errors import CorruptZnode, ZkGroupsError
from coordinator.zkclient import wait_in_order

log = logging.getLogger("zkgroups.console")

DEFAULT_INTERVAL_S = 10.0
#: Samples kept per partition (the charts' width): 60 rounds, ten minutes at the default interval.
HISTORY = 60
#: The catch-up estimate looks at the rate over this many of the newest samples.
RATE_WINDOW = 6
BATCH = 2000

Pair = Tuple[str, int]


class LogEnds(Protocol):
    """Where the console reads log ends: the data plane (built by ``coordinatord``)."""

    name: str  # "embedded" or "kafka"

    def partition_counts(self) -> Dict[str, int]:
        """{topic: partitions} of every topic the data plane has."""

    def latest(self, topic: str, partitions: Sequence[int]) -> Dict[int, int]:
        """The log end of each partition; UnknownTopic when the data plane has no such topic."""

    def details(self, topic: str, partitions: Sequence[int]) -> List[dict]:
        """``topics describe``'s rows (:func:`coordinator.documents.topic_partition_row`)."""

    def timestamps(self, spots: Sequence[lagtime.Spot]) -> Dict[lagtime.Spot, int]:
        """The timestamp (ms) of the record at each (topic, partition, offset) it could read
        (:class:`consumer.dataplane.record_times.RecordTimesReader`)."""


@dataclass
class Reading:
    """One round: each group's offsets rows, total lag and largest lag in seconds (the age of
    its oldest unconsumed record, and the rate's estimate), each topic's partition rows, when
    it was read and how long it took, and the data plane's partition counts."""
    at: float = 0.0
    took_s: float = 0.0
    rows: Dict[str, List[dict]] = field(default_factory=dict)
    total_lag: Dict[str, Optional[int]] = field(default_factory=dict)
    max_lag_s: Dict[str, Optional[float]] = field(default_factory=dict)
    max_estimated_lag_s: Dict[str, Optional[float]] = field(default_factory=dict)
    topics: Dict[str, List[dict]] = field(default_factory=dict)
    counts: Dict[str, int] = field(default_factory=dict)
    data_plane: str = ""


@dataclass
class CatchUp:
    """How a partition (or a group) is doing: ``status`` is ``caught up``, ``catching up``
    (``eta_s``: seconds at the recent rates), ``keeping up`` (consuming as fast as records
    arrive, the lag not growing), ``falling behind``, ``not consuming`` or ``unknown``; rates are
    records per second."""
    status: str
    eta_s: Optional[float] = None
    consumed_per_s: Optional[float] = None
    produced_per_s: Optional[float] = None


def catch_up(times: Sequence[float], committed: Sequence[Optional[int]], ends: Sequence[Optional[int]]) -> CatchUp:
    """The estimate from samples (oldest first; None where unknown), using the newest
    :data:`RATE_WINDOW` known ones: the lag now over how fast it shrinks (pure)."""
    known = [(t, c, e) for t, c, e in zip(times, committed, ends) if c is not None and e is not None]
    if not known:
        return CatchUp("unknown")
    t1, c1, e1 = known[-1]
    lag = e1 - c1
    if lag <= 0:
        return CatchUp("caught up", 0.0)
    window = known[-RATE_WINDOW:]
    t0, c0, e0 = window[0]
    if t1 - t0 <= 0:
        return CatchUp("unknown")
    consumed, produced = (c1 - c0) / (t1 - t0), (e1 - e0) / (t1 - t0)
    net = consumed - produced
    if consumed <= 0:
        return CatchUp("not consuming", None, consumed, produced)
    if net > 0:
        return CatchUp("catching up", lag / net, consumed, produced)
    if lag - (e0 - c0) > max(1, (e1 - e0) // 20):  # grew by more than 5% of what arrived meanwhile
        return CatchUp("falling behind", None, consumed, produced)
    return CatchUp("keeping up", None, consumed, produced)


class History:
    """The last :data:`HISTORY` samples of each partition's committed offset and log end (two
    fixed arrays per partition, -1 where unknown) and of the rounds' times. Written by the
    sampler's thread only; readers take :meth:`series` (copies) under ``lock``."""

    def __init__(self, size: int = HISTORY):
        self.size = size
        self.lock = threading.Lock()
        self.times: deque = deque(maxlen=size)
        self.rounds = 0
        self._series: Dict[Tuple[str, str, int], Tuple[array, array]] = {}

    def add(self, at: float, rows: Mapping[str, List[dict]]) -> None:
        fresh = array("q", [-1]) * self.size
        with self.lock:
            slot = self.rounds % self.size
            self.rounds += 1
            self.times.append(at)
            old, self._series = self._series, {}
            for group, group_rows in rows.items():
                for row in group_rows:
                    key = (group, row["topic"], row["partition"])
                    series = old.get(key) or (array("q", fresh), array("q", fresh))
                    self._series[key] = series  # partitions gone from every group are dropped
                    committed, end = row["current_offset"], row["log_end_offset"]
                    series[0][slot] = -1 if committed is None else committed
                    series[1][slot] = -1 if end is None else end

    def series(self, group: str, topic: str, partition: int):
        """(times, committed, ends) oldest first, None where unknown."""
        with self.lock:
            stored = self._series.get((group, topic, partition))
            times = list(self.times)
            if stored is None:
                return times, [None] * len(times), [None] * len(times)
            n = len(times)
            order = [(self.rounds - n + i) % self.size for i in range(n)]
            committed = [stored[0][i] for i in order]
            ends = [stored[1][i] for i in order]
        return times, [None if v < 0 else v for v in committed], [None if v < 0 else v for v in ends]


def sparkline(values: Sequence[Optional[int]], width: int = 120, height: int = 24) -> str:
    """SVG polyline points of ``values`` (None: a gap is bridged) scaled into width x height;
    "" when there is nothing to draw (pure)."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(known) < 2:
        return ""
    top = max(v for _, v in known) or 1
    last = max(len(values) - 1, 1)
    return " ".join(f"{i * width / last:.1f},{height - 1 - v * (height - 2) / top:.1f}" for i, v in known)


class LagSampler:
    """Reads lag every ``interval_s`` on a thread of its own (see the module docstring).
    ``start()``/``close()`` once each; ``refresh()`` runs one round on the caller's thread."""

    def __init__(self, client, snapshot: ClusterSnapshot, ends: Optional[LogEnds],
                 interval_s: float = DEFAULT_INTERVAL_S):
        self.client, self.snapshot, self.ends, self.interval_s = client, snapshot, ends, interval_s
        self.history = History()
        self.record_times = lagtime.RecordTimes(ends.timestamps) if ends is not None else None
        self._reading = Reading()
        self.failures = 0
        self.last_error = ""
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def reading(self) -> Reading:
        return self._reading

    def start(self) -> "LagSampler":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-lag", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self.snapshot.loaded:
                self.refresh()
                self._stopped.wait(self.interval_s)
            else:
                self._stopped.wait(0.2)

    def refresh(self) -> None:
        started = time.monotonic()
        try:
            reading = self._read()
        except Exception as e:  # ZooKeeper or the data plane (Kafka unreachable, ...): keep the last reading
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("console: reading lag failed (%s); showing the last reading", self.last_error)
            return
        self.history.add(reading.at, reading.rows)
        self._estimate(reading)
        reading.took_s = time.monotonic() - started
        self._reading = reading
        self.last_error = ""

    def _read(self) -> Reading:
        groups = {name: view for name, view in self.snapshot.groups().items() if view.state is not None}
        topics, _ = self.snapshot.topics()
        ends = self.ends
        counts = ends.partition_counts() if ends is not None and ends.name == "kafka" else \
            {t: n for t, n in topics.items() if n is not None}
        reading = Reading(at=time.time(), counts=counts, data_plane=ends.name if ends else "")
        names = sorted(groups)
        batches = [self._read_groups([groups[g] for g in names[i:i + BATCH]], counts, reading)
                   for i in range(0, len(names), BATCH)]
        self._ages(batches)
        if ends is not None:
            for topic, count in sorted(counts.items()):
                try:
                    reading.topics[topic] = ends.details(topic, list(range(count)))
                except ZkGroupsError:  # gone from the data plane meanwhile, or unreadable
                    continue
        return reading

    def _read_groups(self, views: List[GroupView], counts: Dict[str, int], reading: Reading) -> Tuple[List[dict], float]:
        """Read the groups' offsets rows into ``reading``; returns them and when their committed
        offsets were read (what their lag in seconds is as of)."""
        client = self.client
        listings = [(v, client.get_children_async(protocol.offsets_path(v.name))) for v in views]
        wait_in_order([a for _, a in listings])
        topic_listings = []
        for view, a in listings:
            try:
                topics = sorted(a.get())
            except NoNodeError:
                topics = []
            topic_listings.append((view, [(t, client.get_children_async(protocol.offsets_path(view.name, t)))
                                          for t in topics]))
        wait_in_order([a for _, ts in topic_listings for _, a in ts])
        plans = []
        for view, ts in topic_listings:
            offset_topics: Dict[str, Set[int]] = {}
            for topic, a in ts:
                try:
                    offset_topics[topic] = {int(c) for c in a.get() if c.isdigit()}
                except NoNodeError:
                    continue
            snapshot = documents.GroupSnapshot(view.name, view.state, dict(view.members), dict(view.unreadable))
            partitions = documents.group_partitions(snapshot, offset_topics, counts)
            pairs = documents.partition_pairs(partitions)
            # Only the offsets znodes listed are read: the others have no committed offset (None).
            gets = [((t, p), client.get_async(protocol.offsets_path(view.name, t, p)))
                    for t, parts in sorted(offset_topics.items()) for p in sorted(parts)]
            plans.append((snapshot, partitions, pairs, gets))
        wait_in_order([a for *_, gets in plans for _, a in gets])
        read_at = time.time()
        log_ends = self._log_ends([(partitions, counts) for _, partitions, _, _ in plans])
        batch: List[dict] = []
        for snapshot, partitions, pairs, gets in plans:
            committed: Dict[Pair, Optional[int]] = {}
            problems: Dict[Pair, str] = {}
            for pair, a in gets:
                path = protocol.offsets_path(snapshot.group, *pair)
                try:
                    committed[pair] = protocol.decode_offset(a.get()[0], path)
                except NoNodeError:
                    committed[pair] = None
                except CorruptZnode as e:
                    committed[pair], problems[pair] = None, e.problem
            rows = documents.offsets_rows(snapshot, pairs, committed, problems, log_ends)
            reading.rows[snapshot.group] = rows
            batch += rows
            lags = [r["lag"] for r in rows if r["lag"] is not None]
            reading.total_lag[snapshot.group] = sum(lags) if lags else None
        return batch, read_at

    def _ages(self, batches: List[Tuple[List[dict], float]]) -> None:
        """Each row's ``lag_seconds``: the records at the committed offsets of every batch read
        at once (a spot read before is not read again)."""
        if self.record_times is None:
            return
        spots = lagtime.lagging(row for rows, _ in batches for row in rows)
        try:
            stamps = self.record_times.timestamps(spots)
        except ZkGroupsError as e:  # the data plane failed meanwhile: the offsets stand, their ages are unknown
            log.warning("console: reading the records' timestamps failed (%s); lag in seconds unknown", e)
            stamps = {}
        for rows, at in batches:
            lagtime.fill(rows, at, stamps)

    def _estimate(self, reading: Reading) -> None:
        """Each lagging row's ``estimated_lag_seconds`` from the history's consumption rate, and
        the groups' largest lag in seconds."""
        for group, rows in reading.rows.items():
            for row in rows:
                if row["lag"]:
                    times, committed, _ = self.history.series(group, row["topic"], row["partition"])
                    row["estimated_lag_seconds"] = lagtime.estimated_lag_seconds(
                        row["lag"], lagtime.consumption_rate(times, committed))
                elif row["lag"] == 0:
                    row["estimated_lag_seconds"] = 0.0
        rows = [row for group_rows in reading.rows.values() for row in group_rows]
        reading.max_lag_s = lagtime.group_max(rows)
        reading.max_estimated_lag_s = lagtime.group_max(rows, "estimated_lag_seconds")

    def _log_ends(self, wanted: Iterable[Tuple[Dict[str, Set[int]], Dict[str, int]]]) -> Dict[Pair, int]:
        """The log end of every partition the groups name (each topic asked once)."""
        if self.ends is None:
            return {}
        asked: Dict[str, Set[int]] = {}
        for partitions, counts in wanted:
            for topic, parts in documents.partitions_to_read(partitions, counts).items():
                asked.setdefault(topic, set()).update(parts)
        out: Dict[Pair, int] = {}
        for topic, parts in asked.items():
            try:
                out.update({(topic, p): end for p, end in self.ends.latest(topic, sorted(parts)).items()})
            except ZkGroupsError:
                continue  # a topic the data plane does not have: its ends are unknown, as describe shows
        return out
