"""``groupctl groups reset-offsets``, in the shape of Kafka's ``kafka-consumer-groups.sh
--reset-offsets``: which partitions (the scope), where to (the target), and the one transaction
that writes them.

Scope: ``--topic T`` (every partition) or ``--topic T:0,2`` (those), repeatable; ``--all-topics``
(every partition of every topic the group has offsets for, is assigned or subscribes to); or the
partitions a ``--from-file`` plan names.

Targets: ``--to-earliest``, ``--to-latest``, ``--to-current`` (the committed offset; the log end
where there is none), ``--to-offset N``, ``--shift-by N`` (the committed offset plus N; refused
for a partition with none), ``--to-datetime ISO``, ``--by-duration PnDTnHnMnS`` (the first
offset at or after that time, as Kafka; the log end when there is none), ``--from-file FILE``
(CSV ``topic,partition,offset``, what ``--export`` prints). A target outside the partition's
[earliest, latest] is clamped to it, as Kafka does, with a warning naming the partition.

Guaranteed: nothing is written without ``--execute``; with it, nothing is written while the
group has live members, and everything is written in one ZooKeeper transaction that requires
every offsets znode to be as it was read (compare-and-set on its version, or still absent): a
member's claim or commit, or another reset, in between makes the whole reset fail and change
nothing. A reset too large for one ZooKeeper request (:data:`MAX_REQUEST_BYTES`, about 5,000
partitions) is refused rather than split, which would give up that guarantee.

The parsing and planning here are pure functions (unit-tested without a server);
:func:`read_offsets` and :func:`write_offsets` are the ZooKeeper side.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import re
import sys
import time
from dataclasses import dataclass
from typing import BinaryIO, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import click

from consumer import offsets
from consumer.records import TopicPartition
from coordinator import protocol
from coordinator.cli.common import CliUsageError
from coordinator.errors import CorruptZnode, ZkGroupsError
from coordinator.zkclient import MAX_REQUEST_BYTES, TransactionFailed, commit, transaction_bytes

#: The targets, exactly one of which a reset takes (``--from-file`` is the last).
TARGETS = ("--to-earliest", "--to-latest", "--to-offset", "--to-datetime", "--to-current", "--shift-by",
           "--by-duration", "--from-file")
#: A plan file is read up to this size (about a million lines).
MAX_PLAN_BYTES = 64 << 20
#: Clamped partitions named one by one; past this many, the rest are counted.
MAX_CLAMP_LINES = 10

_DURATION = re.compile(r"P(?:(\d{1,18})D)?(?:T(?:(\d{1,18})H)?(?:(\d{1,18})M)?(?:(\d{1,18})(?:[.,](\d{1,9}))?S)?)?",
                       re.IGNORECASE)


# ---------------------------------------------------------------- parsing (pure)

def parse_topic_spec(value: str) -> Tuple[str, Optional[List[int]]]:
    """``T`` -> (T, None: every partition); ``T:0,2`` -> (T, [0, 2]). Raises CliUsageError
    for a malformed list; the name is checked by :func:`protocol.validate_name`."""
    name, colon, listed = value.partition(":")
    protocol.validate_name(name)
    if not colon:
        return name, None
    partitions = []
    for item in listed.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= protocol.MAX_PARTITIONS:
            raise CliUsageError(f"--topic {value!r}: partitions are numbers from 0 to {protocol.MAX_PARTITIONS - 1} "
                                "separated by commas (TOPIC:0,2)")
        partitions.append(int(item))
    return name, sorted(set(partitions))


def merge_topic_specs(values: Sequence[str]) -> Dict[str, Optional[List[int]]]:
    """Every ``--topic`` given: {topic: its partitions, None for all}; a topic named twice gets
    the union (all, if either says all)."""
    scope: Dict[str, Optional[List[int]]] = {}
    for value in values:
        name, partitions = parse_topic_spec(value)
        if name in scope and (scope[name] is None or partitions is None):
            scope[name] = None
        elif name in scope:
            scope[name] = sorted(set(scope[name]) | set(partitions))
        else:
            scope[name] = partitions
    return scope


def parse_duration(text: str) -> int:
    """An ISO-8601 duration as Kafka's ``--by-duration`` takes it (Java's ``Duration.parse``:
    ``PnDTnHnMn.nS``, e.g. ``P1DT2H``, ``PT30M``, ``PT0.5S``; not negative) in milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match or not any(match.groups()) or text.strip().upper().endswith("T"):
        raise CliUsageError(f"--by-duration {text!r} is not an ISO-8601 duration PnDTnHnMnS (e.g. PT1H30M, P2D)")
    days, hours, minutes, seconds, fraction = match.groups()
    ms = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes or 0)) * 60_000 + int(seconds or 0) * 1000
    return ms + int((fraction or "0").ljust(3, "0")[:3])


def parse_datetime(text: str) -> int:
    """``--to-datetime``: ISO 8601, local time unless it carries an offset; epoch milliseconds."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliUsageError(f"--to-datetime {text!r} is not ISO 8601") from None
    try:
        return int(when.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise CliUsageError(f"--to-datetime {text!r} is out of range") from None


def parse_plan(stream: BinaryIO, source: str) -> Dict[TopicPartition, int]:
    """A reset plan: CSV lines ``topic,partition,offset`` (Kafka's ``--export`` format; blank
    lines skipped). Errors name the file and line; a partition named twice is an error."""
    data = stream.read(MAX_PLAN_BYTES + 1)
    if len(data) > MAX_PLAN_BYTES:
        raise ZkGroupsError(f"{source}: larger than {MAX_PLAN_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ZkGroupsError(f"{source}: not UTF-8 (byte {e.start})") from None
    plan: Dict[TopicPartition, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].lstrip("-").isdigit() \
                or len(fields[2]) > 19:
            raise ZkGroupsError(f"{source}, line {number}: expected topic,partition,offset, got {line[:80]!r}")
        try:
            protocol.validate_name(fields[0])
        except ZkGroupsError as e:
            raise ZkGroupsError(f"{source}, line {number}: {e}") from None
        tp = TopicPartition(fields[0], int(fields[1]))
        if tp in plan:
            raise ZkGroupsError(f"{source}, line {number}: {tp.topic}-{tp.partition} is named twice")
        plan[tp] = int(fields[2])
    if not plan:
        raise ZkGroupsError(f"{source}: no offsets in it (expected lines topic,partition,offset)")
    return plan


def export_plan(targets: Mapping[TopicPartition, int]) -> str:
    """The plan as Kafka's ``--export`` prints it: ``topic,partition,offset`` lines."""
    return "".join(f"{tp.topic},{tp.partition},{offset}\n" for tp, offset in sorted(targets.items()))


# ---------------------------------------------------------------- planning (pure)

@dataclass(frozen=True)
class StoredOffset:
    """An offsets znode as read: its offset (None: no znode, or one a claim created before
    anything was committed), its znode version (None: no znode), and what is wrong with data
    that is not an offset."""
    offset: Optional[int]
    version: Optional[int]
    problem: str = ""

    @property
    def shown(self):
        if self.problem:
            return f"unreadable ({self.problem})"
        return "-" if self.offset is None else self.offset


@dataclass(frozen=True)
class Target:
    """Where a reset moves each partition: ``kind`` is one of :data:`TARGETS` without the
    dashes; ``value`` the offset, shift or plan (``to-offset``, ``shift-by``, ``from-file``)."""
    kind: str
    value: object = None


@dataclass(frozen=True)
class Clamped:
    """A target outside the partition's range, and what it became."""
    tp: TopicPartition
    wanted: int
    earliest: int
    latest: int

    def describe(self) -> str:
        if self.wanted > self.latest:
            return (f"{self.tp.topic}-{self.tp.partition}: {self.wanted} is after the log end offset {self.latest}; "
                    f"using {self.latest}")
        return (f"{self.tp.topic}-{self.tp.partition}: {self.wanted} is before the earliest offset {self.earliest}; "
                f"using {self.earliest}")


def plan_targets(target: Target, tps: Sequence[TopicPartition], current: Mapping[TopicPartition, StoredOffset],
                 earliest: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
                 found: Mapping[TopicPartition, Optional[int]]) -> Tuple[Dict[TopicPartition, int], List[Clamped]]:
    """The new offset of each partition and the targets that were clamped into [earliest,
    latest]. ``found``: the offsets for a time (``to-datetime``, ``by-duration``; None: no
    record that late, so the log end). Raises ZkGroupsError for ``shift-by`` where there is
    no committed offset to shift."""
    if target.kind == "shift-by":
        missing = [tp for tp in tps if current[tp].offset is None]
        if missing:
            named = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing[:5]) + \
                (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ZkGroupsError(f"cannot shift {named}: no committed offset to shift from (reset those with "
                                "--to-earliest or --to-latest first, or leave them out with --topic T:PARTITIONS)")
    targets: Dict[TopicPartition, int] = {}
    clamped: List[Clamped] = []
    for tp in tps:
        if target.kind == "to-earliest":
            wanted = earliest[tp]
        elif target.kind == "to-latest":
            wanted = latest[tp]
        elif target.kind == "to-current":
            wanted = latest[tp] if current[tp].offset is None else current[tp].offset
        elif target.kind == "to-offset":
            wanted = target.value
        elif target.kind == "shift-by":
            wanted = current[tp].offset + target.value
        elif target.kind in ("to-datetime", "by-duration"):
            wanted = latest[tp] if found.get(tp) is None else found[tp]
        elif target.kind == "from-file":
            wanted = target.value[tp]
        else:
            raise ValueError(f"unknown reset target {target.kind!r}")
        targets[tp] = max(earliest[tp], min(wanted, latest[tp]))
        if targets[tp] != wanted:
            clamped.append(Clamped(tp, wanted, earliest[tp], latest[tp]))
    return targets, clamped


def clamp_warnings(clamped: Sequence[Clamped]) -> List[str]:
    """One line per clamped partition, at most :data:`MAX_CLAMP_LINES` and a count of the rest."""
    lines = [f"warning: {c.describe()}" for c in clamped[:MAX_CLAMP_LINES]]
    if len(clamped) > MAX_CLAMP_LINES:
        lines.append(f"warning: {len(clamped) - MAX_CLAMP_LINES} more targets were out of range and clamped "
                     "to [earliest, latest]")
    return lines


# ---------------------------------------------------------------- ZooKeeper

def read_offsets(zk, group: str, tps: Iterable[TopicPartition]) -> Dict[TopicPartition, StoredOffset]:
    """Every partition's offsets znode with its version (reads pipelined)."""
    out = {}
    for tp, (raw, version) in offsets.read_offsets(zk, group, tps).items():
        if version is None:
            out[tp] = StoredOffset(None, None)
            continue
        try:
            out[tp] = StoredOffset(offsets.decode_stored(group, tp, raw), version)
        except CorruptZnode as e:
            out[tp] = StoredOffset(None, version, e.problem)  # a reset is how it gets repaired
    return out


def offsets_transaction(zk, group: str, targets: Mapping[TopicPartition, int],
                        stored: Mapping[TopicPartition, StoredOffset]):
    """The transaction that writes ``targets``, each znode only if it is still as ``stored``
    (same version, or still absent), and the partitions in the order of its operations."""
    t = zk.transaction()
    order = sorted(targets)
    for tp in order:
        path, data = protocol.offsets_path(group, tp.topic, tp.partition), protocol.encode_offset(targets[tp])
        if stored[tp].version is None:
            t.create(path, data)
        else:
            t.set_data(path, data, version=stored[tp].version)
    return t, order


def too_large(transaction) -> str:
    """Why ``transaction`` cannot be sent ("" when it fits in one ZooKeeper request)."""
    size = transaction_bytes(transaction)
    if size <= MAX_REQUEST_BYTES:
        return ""
    return (f"resetting {len(transaction.operations):,} partitions at once is a ZooKeeper request of {size:,} bytes, "
            f"more than ZooKeeper takes ({MAX_REQUEST_BYTES:,}, its jute.maxbuffer); reset fewer partitions at a time "
            "(--topic T:PARTITIONS), each reset is then atomic on its own")


def write_offsets(zk, group: str, targets: Mapping[TopicPartition, int],
                  stored: Mapping[TopicPartition, StoredOffset]) -> None:
    """Write ``targets`` in one transaction, each znode only if it is still as ``stored``;
    otherwise (or if it is too large for one request) nothing is written and ZkGroupsError
    says so."""
    transaction, order = offsets_transaction(zk, group, targets, stored)
    problem = too_large(transaction)
    if problem:
        raise ZkGroupsError(problem)
    for topic in sorted({tp.topic for tp in order}):
        zk.ensure_path(protocol.offsets_path(group, topic))
    try:
        commit(transaction)
    except TransactionFailed as e:
        tp = order[e.index]
        raise ZkGroupsError(f"the committed offset of {tp.topic}-{tp.partition} in group {group!r} changed "
                            "while resetting; nothing was written (run the command again)") from None


# ---------------------------------------------------------------- the data plane's offsets

#: Partitions looked up per data-plane call; the progress bar moves this much at a time.
LOOKUP_CHUNK = 500


@dataclass
class PlaneOffsets:
    earliest: Dict[TopicPartition, int]
    latest: Dict[TopicPartition, int]
    found: Dict[TopicPartition, Optional[int]]


def plane_offsets(plane, tps: Sequence[TopicPartition], timestamp_ms: Optional[int],
                  progress: bool = False) -> PlaneOffsets:
    """Earliest and latest offsets of ``tps`` (and the offsets for ``timestamp_ms``), asked in
    chunks; with ``progress``, a bar on stderr."""
    out = PlaneOffsets({}, {}, {})
    bar = click.progressbar(length=len(tps), label="reading offsets", file=sys.stderr, show_pos=True) \
        if progress else contextlib.nullcontext()
    with bar:
        for start in range(0, len(tps), LOOKUP_CHUNK):
            chunk = tps[start:start + LOOKUP_CHUNK]
            out.earliest.update(plane.earliest_offsets(chunk))
            out.latest.update(plane.latest_offsets(chunk))
            if timestamp_ms is not None:
                out.found.update(plane.offsets_for_times({tp: timestamp_ms for tp in chunk}))
            if progress:
                bar.update(len(chunk))
    return out


def now_ms() -> int:
    return int(time.time() * 1000)
