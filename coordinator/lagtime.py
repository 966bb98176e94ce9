"""Lag in seconds: per group and partition, how old the oldest unconsumed record is, and an
estimate from the recent consumption rate (what autoscalers and alerts want from topics of
different rates; records behind mean nothing without the rate).

* ``lag_seconds``: the age of the record at the committed offset (the oldest one the group has
  not consumed), ``now`` minus the record's timestamp, at the moment the committed offset was
  read; 0 when the group is caught up (lag 0), None when the lag or the timestamp is unknown.
  Read by one bounded one-record fetch per lagging partition (the reader the caller gives:
  the embedded log or Kafka; records carry their timestamps on both), cached per (partition,
  committed offset): a group whose commits do not move costs no reads.
* ``estimated_lag_seconds``: the lag in records over the group's recent consumption rate (the
  committed offset's growth over the last readings, :data:`RATE_WINDOW` of them); an
  estimate, None while the rate is unknown or 0 (a stopped consumer: only the age says how far
  behind it is), 0 when caught up. Only readers that read repeatedly (the console, ``groupctl
  exporter``) have a rate; one ``groupctl groups describe`` does not.

Not provided: agreement of clocks. A timestamp is the producer's clock (Kafka's CreateTime) or
the broker's (LogAppendTime); the age is the reader's clock minus it, so a producer clock
ahead of the reader's shows 0, never a negative age. Share groups (not in zkgroups yet) will
take the same age from the share-partition start offset in place of the committed offset.

Everything here but :class:`RecordTimes`' cache is a pure function.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

#: (topic, partition, offset): where a record is.
Spot = Tuple[str, int, int]
#: Reads the timestamp (ms) of the record at each spot; spots it could not read are left out.
Reader = Callable[[Sequence[Spot]], Dict[Spot, int]]

#: The rate is the committed offset's growth over this many of the newest readings.
RATE_WINDOW = 6
FIELDS = ("lag_seconds", "estimated_lag_seconds")


def record_age_s(at_s: float, timestamp_ms: Optional[int]) -> Optional[float]:
    """Seconds from a record's timestamp to ``at_s`` (never below 0); None without a timestamp."""
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    return round(max(0.0, at_s - timestamp_ms / 1000.0), 3)


def lag_seconds(lag: Optional[int], at_s: float, timestamp_ms: Optional[int]) -> Optional[float]:
    """The age of the oldest unconsumed record: 0 when nothing is unconsumed."""
    if lag is None:
        return None
    return 0.0 if lag <= 0 else record_age_s(at_s, timestamp_ms)


def consumption_rate(times: Sequence[float], committed: Sequence[Optional[int]],
                     window: int = RATE_WINDOW) -> Optional[float]:
    """Records per second the committed offset grew over the newest ``window`` known samples
    (oldest first); only samples after its last decrease count (a reset moved it back). None
    with fewer than two."""
    known = [(t, c) for t, c in zip(times, committed) if c is not None]
    start = 0
    for i in range(1, len(known)):
        if known[i][1] < known[i - 1][1]:
            start = i
    known = known[start:][-window:]
    if len(known) < 2 or known[-1][0] <= known[0][0]:
        return None
    return (known[-1][1] - known[0][1]) / (known[-1][0] - known[0][0])


def estimated_lag_seconds(lag: Optional[int], rate: Optional[float]) -> Optional[float]:
    """``lag`` records at ``rate`` records per second: 0 when caught up, None without a rate."""
    if lag is None:
        return None
    if lag <= 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return round(lag / rate, 3)


def lagging(rows: Iterable[dict]) -> List[Spot]:
    """Where the oldest unconsumed record of each offsets row with unconsumed records is (its
    committed offset), each spot once."""
    return list(dict.fromkeys((r["topic"], r["partition"], r["current_offset"]) for r in rows
                              if r["lag"] is not None and r["lag"] > 0 and r["current_offset"] is not None))


def fill(rows: Iterable[dict], at_s: float, timestamps: Mapping[Spot, int],
         rates: Optional[Mapping[Tuple[str, str, int], float]] = None) -> None:
    """Set each offsets row's ``lag_seconds`` and ``estimated_lag_seconds`` (``timestamps``:
    of the records at the committed offsets; ``rates``: records per second, by (group, topic,
    partition))."""
    rates = rates or {}
    for row in rows:
        spot = (row["topic"], row["partition"], row["current_offset"])
        row["lag_seconds"] = lag_seconds(row["lag"], at_s, timestamps.get(spot))
        row["estimated_lag_seconds"] = estimated_lag_seconds(
            row["lag"], rates.get((row["group"], row["topic"], row["partition"])))


def group_max(rows: Iterable[dict], field: str = "lag_seconds") -> Dict[str, Optional[float]]:
    """{group: the largest ``field`` of its rows} (None where no row has one): the figure to
    scale on (a group is as late as its latest partition)."""
    out: Dict[str, Optional[float]] = {}
    for row in rows:
        value, best = row.get(field), out.get(row["group"])
        out[row["group"]] = best if value is None or (best is not None and best >= value) else value
    return out


class RecordTimes:
    """The timestamps of the records at the committed offsets, read through ``reader`` only for
    a spot not read before (a group whose commits do not move costs no reads).

    Threads: one caller at a time (the reading thread of the console or the exporter)."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self.reads = 0  # spots asked of the reader, all told
        self._known: Dict[Spot, int] = {}

    def timestamps(self, wanted: Sequence[Spot]) -> Dict[Spot, int]:
        """{spot: timestamp ms} of each wanted spot (unreadable ones left out); spots not wanted
        any more are forgotten, and a timestamp not read is asked again next time. The reader's
        errors are raised (the cache keeps what it had)."""
        missing = [spot for spot in wanted if spot not in self._known]
        found = self.reader(missing) if missing else {}
        self.reads += len(missing)
        known = {spot: found[spot] if spot in found else self._known[spot] for spot in wanted
                 if spot in found or spot in self._known}
        self._known = known
        return dict(known)


class CommitHistory:
    """The last :data:`RATE_WINDOW` committed offsets of each (group, topic, partition), with
    the readings' times, for :func:`consumption_rate` (for readers without the console's
    :class:`~coordinator.console.lag.History`). Partitions absent from a reading are dropped."""

    def __init__(self, window: int = RATE_WINDOW):
        self.window = window
        self._samples: Dict[Tuple[str, str, int], Deque[Tuple[float, int]]] = {}

    def add(self, at_s: float, rows: Iterable[dict]) -> Dict[Tuple[str, str, int], float]:
        """Record a reading; returns the rate of every (group, topic, partition) that has one."""
        samples, self._samples = self._samples, {}
        rates = {}
        for row in rows:
            key = (row["group"], row["topic"], row["partition"])
            series = samples.get(key) or deque(maxlen=self.window)
            self._samples[key] = series
            if row["current_offset"] is not None:
                series.append((at_s, row["current_offset"]))
            rate = consumption_rate([t for t, _ in series], [c for _, c in series], self.window)
            if rate is not None:
                rates[key] = rate
        return rates


def fill_rows(rows: List[dict], at_s: float, times: RecordTimes, history: Optional[CommitHistory] = None) -> None:
    """:func:`fill` for the offsets rows of any number of groups: the timestamps read through
    ``times`` (each spot asked once), the rates from ``history`` when given."""
    rates = history.add(at_s, rows) if history is not None else {}
    fill(rows, at_s, times.timestamps(lagging(rows)), rates)
