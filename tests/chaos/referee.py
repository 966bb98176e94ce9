"""The chaos run's referee: what consumers printed, judged against ZooKeeper's own log.

Inputs: the records in the topic's log (what was produced), every line the consumers printed
(``groupctl consume --with-metadata``: topic, partition, offset, value, member, at), the
group's history from the ZooKeeper transaction logs (:mod:`tests.chaos.history`) and how
every process ended. Checks, each a :class:`CheckResult`:

1. ``lost``: every produced record was printed by some consumer (with the produced value);
2. ``duplicates``: a record printed more than once was first printed by a member whose
   ownership of the partition then ended (session closed: death or session loss; or released)
   without that session committing an offset past the record while it owned the partition;
3. ``outside-ownership``: every printed record's ``at`` lies in an ownership interval of one
   of the printing member's sessions for that partition (violations carry the gap);
4. ``exits``: every process that ended was ended by the harness (SIGKILL: status -9;
   SIGTERM: status 0); one that exited on its own, or hung, failed;
5. ``offsets``: the group's last committed offsets equal the end offsets.

A sixth, ``referee``, fails when the evidence itself is doubtful: servers that logged one
zxid differently, oddities in the group's history, printed lines that do not parse (a last
line cut short by SIGKILL is expected and only counted).

Times: ``at`` is the consumer's wall clock when ``poll()`` handed the record out
(:attr:`consumer.Consumer.handed_out_at`: after the fetch, before the lease check that let it
go; a stamp taken by the application after ``poll()`` returned could fall after a SIGSTOP that
froze the process in between, and judge the application instead of the library); ZooKeeper times are the
leader's wall clock in whole milliseconds when it prepared the change (same machine, same
clock). An interval's end is widened by 1 ms for that truncation, nothing more.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tests.chaos.history import GroupHistory, Ownership, Partition

TRUNCATION_MS = 1.0


@dataclass(frozen=True)
class Printed:
    """One record as a consumer printed it."""
    topic: str
    partition: int
    offset: int
    value: Optional[str]
    member: str
    at: float       # seconds (wall clock) when poll() returned it
    source: str     # file:line

    @property
    def tp(self) -> Partition:
        return self.topic, self.partition

    @property
    def at_ms(self) -> float:
        return self.at * 1000.0


@dataclass
class PrintedFile:
    records: List[Printed]
    cut_last_line: bool = False     # the process died mid-write: not a record
    bad_lines: List[str] = field(default_factory=list)


def read_printed(path: str) -> PrintedFile:
    """Parse one consumer's stdout; a last line without its newline is a write cut short."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    out = PrintedFile([])
    if lines and lines[-1]:
        out.cut_last_line = True
    for number, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.records.append(Printed(obj["topic"], int(obj["partition"]), int(obj["offset"]), obj.get("value"),
                                       obj["member"], float(obj["at"]), f"{path}:{number}"))
        except (ValueError, KeyError, TypeError) as e:
            out.bad_lines.append(f"{path}:{number}: {e.__class__.__name__}: {line[:120]!r}")
    return out


@dataclass
class ProcessEnd:
    """How one process ended."""
    role: str                  # consumer | coordinatord | producer
    name: str
    log: str
    returncode: Optional[int]  # None: did not exit (hung) even after SIGKILL's wait
    stopped_by: Optional[str]  # "SIGKILL" | "SIGTERM" | None (it exited on its own)
    note: str = ""

    @property
    def expected(self) -> bool:
        if self.stopped_by == "SIGKILL":
            return self.returncode == -9
        if self.stopped_by == "SIGTERM":
            # -15 also when it had not logged a line yet: still starting (importing, on a loaded
            # machine), before the program's own handler existed; it held nothing to lose.
            return self.returncode == 0 or (self.returncode == -15 and _logged_nothing(self.log))
        return False

    def describe(self) -> str:
        how = f"after {self.stopped_by}" if self.stopped_by else "on its own"
        status = "did not exit" if self.returncode is None else f"exit status {self.returncode}"
        return f"{self.role} {self.name}: {status} {how}{'; ' + self.note if self.note else ''} (log {self.log})"


def _logged_nothing(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return True  # never opened


@dataclass
class CheckResult:
    name: str
    ok: bool
    summary: str                 # one line for the verdict
    details: List[str] = field(default_factory=list)


# ---------------------------------------------------------------- 1. nothing lost

def check_lost(produced: Dict[Partition, Sequence[str]], printed: Sequence[Printed],
               producer_count: Optional[int] = None) -> CheckResult:
    """``produced[tp][offset]`` is the value in the log; ``producer_count`` what the producer
    says it sent (values 0..count-1), when it said."""
    seen: Dict[Tuple[str, int, int], set] = defaultdict(set)
    for r in printed:
        seen[(r.topic, r.partition, r.offset)].add(r.value)
    details, lost, wrong = [], 0, 0
    for tp in sorted(produced):
        for offset, value in enumerate(produced[tp]):
            values = seen.get((tp[0], tp[1], offset))
            if not values:
                lost += 1
                details.append(f"lost {tp[0]}/{tp[1]} offset {offset} value {value}")
            elif values != {value}:
                wrong += 1
                details.append(f"wrong value {tp[0]}/{tp[1]} offset {offset}: log has {value}, "
                               f"printed {sorted(values, key=str)}")
    beyond = [k for k in seen if k[2] >= len(produced.get((k[0], k[1]), ()))]
    for k in sorted(beyond):
        details.append(f"printed {k[0]}/{k[1]} offset {k[2]} that the log does not have")
    written = [v for values in produced.values() for v in values]
    missing_from_log = 0
    if producer_count is not None:
        expected = {str(i) for i in range(producer_count)}
        missing_from_log = len(expected - set(written))
        if missing_from_log:
            details.append(f"{missing_from_log} of the {producer_count} records the producer sent are not in the log")
    if len(set(written)) != len(written):
        details.append(f"the log holds {len(written) - len(set(written))} repeated values")
    ok = not details
    summary = f"lost={lost + missing_from_log}" + (f" wrong-value={wrong}" if wrong else "")
    return CheckResult("lost", ok, summary, details)


# ---------------------------------------------------------------- 3. outside ownership

def holding(intervals: Iterable[Ownership], at_ms: float) -> Optional[Ownership]:
    """The interval (latest start first) that holds ``at_ms``, allowing the ms truncation."""
    return next((o for o in sorted(intervals, key=lambda o: o.start_zxid, reverse=True)
                 if o.holds_at(at_ms, TRUNCATION_MS)), None)


def check_ownership(printed: Sequence[Printed], history: GroupHistory) -> CheckResult:
    violations = []  # (gap ms, record, the interval the gap is measured from)
    for r in printed:
        intervals = history.intervals(r.member, r.tp)
        if holding(intervals, r.at_ms) is None:
            gap, reference = _gap(intervals, r.at_ms)
            violations.append((gap, r, reference))
    if not violations:
        return CheckResult("outside-ownership", True, "outside-ownership=0")
    by_member: Dict[str, List[float]] = defaultdict(list)
    for gap, r, _ in violations:
        by_member[r.member].append(gap)
    worst = max(g for g, _, _ in violations)
    details = [f"{len(violations)} records printed by a member that did not own the partition at that moment",
               "per member: " + ", ".join(f"{m}: {len(g)} records, gap up to {_seconds(max(g))}"
                                          for m, g in sorted(by_member.items()))]
    for gap, r, reference in sorted(violations, key=lambda v: (v[1].member, v[1].at)):
        if reference is None:
            where = "its sessions never owned it"
        elif reference.end_ms is not None and reference.end_ms < r.at_ms:
            where = f"{_seconds(gap)} after its ownership ended: {reference.describe()}"
        else:
            where = f"{_seconds(gap)} before its ownership began: {reference.describe()}"
        details.append(f"{r.member} printed {r.topic}/{r.partition} offset {r.offset} at {r.at:.3f}, {where}; "
                       f"{r.source}")
    return CheckResult("outside-ownership", False,
                       f"outside-ownership={len(violations)} (max gap {_seconds(worst)})", details)


def _gap(intervals: Sequence[Ownership], at_ms: float) -> Tuple[float, Optional[Ownership]]:
    """How far outside ownership ``at_ms`` is: since the member's last ownership of the
    partition ended if there was one (a member handing out what it lost), else until its
    first began; infinite if it never owned the partition."""
    ended = [o for o in intervals if o.end_ms is not None and o.end_ms < at_ms]
    if ended:
        last = max(ended, key=lambda o: o.end_zxid)
        return at_ms - last.end_ms, last
    later = [o for o in intervals if o.start_ms > at_ms]
    if later:
        first = min(later, key=lambda o: o.start_zxid)
        return first.start_ms - at_ms, first
    return float("inf"), None


def _seconds(ms: float) -> str:
    return "never owned" if ms == float("inf") else f"{ms / 1000:.3f}s"


# ---------------------------------------------------------------- 2. duplicates explained

def check_duplicates(printed: Sequence[Printed], history: GroupHistory) -> CheckResult:
    by_record: Dict[Tuple[str, int, int], List[Printed]] = defaultdict(list)
    for r in printed:
        by_record[(r.topic, r.partition, r.offset)].append(r)
    extra, unexplained, reasons, details = 0, 0, defaultdict(int), []
    for key in sorted(k for k, v in by_record.items() if len(v) > 1):
        prints = sorted(by_record[key], key=lambda r: r.at)
        for first, again in zip(prints, prints[1:]):
            extra += 1
            why = _unexplained(first, again, history)
            if why is None:
                o = holding(history.intervals(first.member, first.tp), first.at_ms)
                reasons[o.end_reason] += 1
                continue
            unexplained += 1
            details.append(f"{key[0]}/{key[1]} offset {key[2]}: printed by {first.member} at {first.at:.3f} "
                           f"({first.source}) and again by {again.member} at {again.at:.3f} ({again.source}): {why}")
    if unexplained:
        details.insert(0, f"{unexplained} of {extra} repeated prints are not explained by an ownership that ended "
                          "before its member committed past the record")
        return CheckResult("duplicates", False, f"duplicates={extra} ({unexplained} unexplained)", details)
    how = ", ".join(f"{n} after {reason}" for reason, n in sorted(reasons.items()))
    return CheckResult("duplicates", True, f"duplicates={extra} (all explained)", [how] if how else [])


def _unexplained(first: Printed, again: Printed, history: GroupHistory) -> Optional[str]:
    """Why printing ``first``'s record again is not explained (None if it is)."""
    o = holding(history.intervals(first.member, first.tp), first.at_ms)
    again_in = holding(history.intervals(again.member, again.tp), again.at_ms)
    if again_in is None:
        return "printed again by a member that did not own the partition at that moment"
    if o is None:
        return "first printed by a member that did not own the partition at that moment"
    if again_in is o:
        return "printed twice within one ownership"
    if o.end_zxid is None:
        return f"the first printer still owned the partition at the end ({o.describe()})"
    for c in history.commits.get(first.tp, ()):
        if c.session == o.session and o.start_zxid <= c.zxid <= o.end_zxid and c.offset is not None \
                and c.offset > first.offset:
            return f"its session committed {c.offset} (zxid {c.zxid:#x}) before its ownership ended ({o.describe()})"
    return None


# ---------------------------------------------------------------- 4. exits

def check_exits(ends: Sequence[ProcessEnd]) -> CheckResult:
    bad = [e for e in ends if not e.expected]
    if not bad:
        return CheckResult("exits", True, "unexpected-exits=0")
    return CheckResult("exits", False, f"unexpected-exits={len(bad)}", [e.describe() for e in bad])


# ---------------------------------------------------------------- 5. offsets at the end

def check_offsets(end_offsets: Dict[Partition, int], history: GroupHistory,
                  live: Optional[Dict[Partition, Optional[int]]] = None) -> CheckResult:
    """``live``: the committed offsets the harness read from ZooKeeper itself, to compare."""
    committed = history.committed()
    details = []
    for tp in sorted(end_offsets):
        got = committed.get(tp)
        if got != end_offsets[tp]:
            details.append(f"{tp[0]}/{tp[1]}: committed {got}, end offset {end_offsets[tp]}")
    behind = len(details)
    if live is not None:
        for tp in sorted(live):
            if live[tp] != committed.get(tp):
                details.append(f"{tp[0]}/{tp[1]}: ZooKeeper answered {live[tp]} but the transaction log says "
                               f"{committed.get(tp)}")
    summary = "offsets=at end" if not details else f"offsets={len(end_offsets) - behind}/{len(end_offsets)} at end"
    return CheckResult("offsets", not details, summary, details)


# ---------------------------------------------------------------- the evidence itself

def check_evidence(history: GroupHistory, conflicts: Sequence, bad_lines: Sequence[str]) -> CheckResult:
    details = [f"zxid {a.zxid:#x} logged differently: {a.describe()} / {b.describe()}" for a, b in conflicts]
    details += history.problems + list(bad_lines)
    return CheckResult("referee", not details, "" if not details else f"referee-problems={len(details)}", details)
