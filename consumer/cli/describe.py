"""What ``groupctl groups describe`` shows, as data, in the three views of Kafka's
``kafka-consumer-groups.sh --describe``:

* **offsets** (the default): one row per partition of the group's topics — ``group``,
  ``topic``, ``partition``, ``current_offset`` (the committed offset), ``log_end_offset`` (from
  the data plane: the embedded log or Kafka), ``lag``, and the owning member's ``consumer_id``,
  ``host`` and ``client_id`` (None when the partition is not assigned), plus ``error`` (why a
  committed offset could not be read), and ``lag_seconds`` (the age of the oldest unconsumed
  record: :mod:`coordinator.lagtime`; ``estimated_lag_seconds`` is None here, it needs the
  consumption rate of repeated readings: the console's, ``groupctl exporter``'s).
* **members**: one row per live member — ``group``, ``consumer_id``, ``host``, ``client_id``,
  ``partitions`` (how many it is assigned), ``assignment`` ({topic: [partitions]}),
  ``strategies``, ``pattern``, ``subscription``, ``error`` (an unreadable registration).
* **state**: one row per group — ``group``, ``coordinator`` (the node leading the group's shard),
  ``assignment_strategy``, ``state``, ``members`` (how many), ``generation``, ``error`` (the
  group state's error: a failed rebalance, a member left out, ...).

Rows are dicts with the field names of ``--output json``, shaped by :mod:`coordinator.documents`
(the console's API serves the same); the tables are rendered from the same rows, so all say the same. Missing values are None (``-`` in tables).

The group's topics are those it is assigned, has committed offsets for, or its live members
subscribe to (a pattern is matched against the data plane's topics); every partition of each
is shown. Assignment (and so CONSUMER-ID, HOST, CLIENT-ID) is the leader's last decision, the
group state's; the registration of the member it names gives host and client id. What is not
guaranteed: the views are read one after the other, not as one snapshot, so a rebalance in
between may show a partition's new owner next to its previous committed offset.
"""
from __future__ import annotations

import time
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import click
from kazoo.exceptions import NoNodeError

from consumer.cli.context import CliContext
from consumer.dataplane.record_times import RecordTimesReader
from consumer.offsets import read_completed
from consumer.records import TopicPartition
from coordinator import documents, lagtime, protocol, read
from coordinator.cli.common import print_table
from coordinator.documents import GroupSnapshot
from coordinator.errors import CorruptZnode, UnknownTopic, ZkGroupsError
from coordinator.protocol import NodeInfo

VIEWS = ("offsets", "members", "state")

OFFSETS_COLUMNS = (("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                   ("CURRENT-OFFSET", "current_offset"), ("LOG-END-OFFSET", "log_end_offset"), ("LAG", "lag"),
                   ("CONSUMER-ID", "consumer_id"), ("HOST", "host"), ("CLIENT-ID", "client_id"),
                   ("LAG-SECONDS", "lag_seconds"))  # last: scripts reading Kafka's columns by position still work
#: Shown after the others where a group has parallel consumers' completed offsets.
COMPLETED_COLUMN = (("COMPLETED-ABOVE", "completed_above"),)
MEMBERS_COLUMNS = (("GROUP", "group"), ("CONSUMER-ID", "consumer_id"), ("HOST", "host"),
                   ("CLIENT-ID", "client_id"), ("#PARTITIONS", "partitions"))
MEMBERS_VERBOSE_COLUMNS = MEMBERS_COLUMNS + (("STRATEGIES", "strategies"), ("SUBSCRIPTION", "subscription"),
                                             ("ASSIGNMENT", "assignment"))
STATE_COLUMNS = (("GROUP", "group"), ("COORDINATOR", "coordinator"), ("ASSIGNMENT-STRATEGY", "assignment_strategy"),
                 ("STATE", "state"), ("#MEMBERS", "members"), ("GENERATION", "generation"))


def read_group(zk, group: str) -> GroupSnapshot:
    """Read ``group``; an unreadable group state raises CorruptZnode, an unreadable
    registration is recorded in ``unreadable``."""
    state = read.group_state(zk, group)
    unreadable: Dict[str, str] = {}
    members = read.members(zk, group, unreadable)
    return GroupSnapshot(group, state, members, unreadable)


def read_groups(zk, groups: Iterable[str], skip_unreadable: bool) -> List[GroupSnapshot]:
    """Each group read; with ``skip_unreadable`` a group whose state cannot be read is one
    warning and left out (``--all-groups``: one bad group does not hide the others)."""
    out = []
    for group in groups:
        try:
            snapshot = read_group(zk, group)
        except CorruptZnode as e:
            if not skip_unreadable:
                raise
            click.echo(f"warning: group {group} left out: {e}", err=True)
            continue
        out.append(snapshot)
        for cid, problem in sorted(snapshot.unreadable.items()):
            click.echo(f"warning: group {group}: the registration of member {cid} is unreadable "
                       f"({protocol.ids_path(group, cid)}: {problem})", err=True)
    return out


# ---------------------------------------------------------------- offsets view

def offset_topics(zk, group: str) -> Dict[str, Set[int]]:
    """{topic: partitions} of the group's offsets znodes (children read pipelined); children
    that are not partition numbers are not the group's offsets and are skipped."""
    topics = read.children(zk, protocol.offsets_path(group))
    pending = [(t, zk.get_children_async(protocol.offsets_path(group, t))) for t in topics]
    out: Dict[str, Set[int]] = {}
    for topic, result in pending:
        try:
            children = result.get()
        except NoNodeError:
            continue
        out[topic] = {int(c) for c in children if c.isdigit()}
    return out


def group_partitions(zk, snapshot: GroupSnapshot, counts: Dict[str, int]) -> Dict[str, Set[int]]:
    """{topic: partitions} of the group's topics (:func:`coordinator.documents.group_partitions`)."""
    return documents.group_partitions(snapshot, offset_topics(zk, snapshot.group), counts)


def offsets_rows(cli: CliContext, snapshot: GroupSnapshot, counts: Dict[str, int]) -> List[dict]:
    """The offsets view of one group (see the module docstring)."""
    partitions = group_partitions(cli.zk, snapshot, counts)
    pairs = documents.partition_pairs(partitions)
    problems: Dict[object, str] = {}
    committed = read.committed_offsets(cli.zk, snapshot.group, pairs, problems)
    ends: Dict[Tuple[str, int], int] = {}
    for topic, known in documents.partitions_to_read(partitions, counts).items():
        cli.warn_if_no_data(topic, known)
        ends.update(end_offsets(cli, topic, known))
    rows = documents.offsets_rows(snapshot, pairs, committed, problems, ends)
    if cli.zk.exists(protocol.completed_path(snapshot.group)):
        add_completed(cli.zk, snapshot.group, rows)
    return rows


def add_completed(zk, group: str, rows: List[dict]) -> None:
    """Each row's ``completed_above``: how many offsets a parallel consumer finished above its
    committed offset (:mod:`consumer.parallel`); 0 where none are recorded or they are stale."""
    known = {TopicPartition(r["topic"], r["partition"]): r["current_offset"] for r in rows
             if isinstance(r.get("current_offset"), int)}
    found = read_completed(zk, group, known)
    for r in rows:
        r["completed_above"] = len(found.get(TopicPartition(r["topic"], r["partition"]), ()))


def all_offsets_rows(cli: CliContext, snapshots: Sequence[GroupSnapshot], times: Optional[lagtime.RecordTimes] = None,
                     history: Optional[lagtime.CommitHistory] = None) -> List[dict]:
    """The offsets view of several groups (the data plane's partition counts read once), with
    their lag in seconds (:mod:`coordinator.lagtime`): the records' timestamps read through
    ``times`` (a reader of the data plane's, for this call alone, when None), the rates from
    ``history`` (readers that read repeatedly)."""
    counts = cli.data_plane.partition_counts() if snapshots else {}
    rows = [row for s in snapshots for row in offsets_rows(cli, s, counts)]
    at = time.time()
    reader = RecordTimesReader(cli.data_plane) if times is None else None
    try:
        lagtime.fill_rows(rows, at, times or lagtime.RecordTimes(reader), history)
    except ZkGroupsError as e:  # Kafka unreachable meanwhile: the offsets still stand, their ages are unknown
        click.echo(f"warning: the records' timestamps could not be read ({e}); lag in seconds is left out", err=True)
    finally:
        if reader is not None:
            reader.close()
    return rows


def end_offsets(cli: CliContext, topic: str, partitions) -> Dict[Tuple[str, int], int]:
    """The log end of each partition; a topic the data plane does not have is one warning
    (its ends are left out: ``-``)."""
    if not partitions:
        return {}
    try:
        latest = cli.data_plane.latest_offsets([TopicPartition(topic, p) for p in partitions])
    except UnknownTopic:
        click.echo(f"warning: topic {topic} is not on {cli.data_plane.describe()}", err=True)
        return {}
    return {(tp.topic, tp.partition): offset for tp, offset in latest.items()}


# ---------------------------------------------------------------- members view

members_rows = documents.members_rows


def _assignment_cell(assignment: Dict[str, List[int]]) -> str:
    """Kafka's form: ``t1(0,1), t2(3)``; ``-`` when nothing is assigned."""
    return ", ".join(f"{t}({','.join(map(str, parts))})" for t, parts in sorted(assignment.items())) or "-"


def _subscription_cell(row: dict) -> str:
    """``t1,t2`` (``t1:2`` for two streams), or ``white_list:REGEX`` / ``black_list:REGEX``."""
    if row["subscription"] is None:
        return "-"
    if row["pattern"] != protocol.PATTERN_STATIC:
        return f"{row['pattern']}:{next(iter(row['subscription']))}"
    return ",".join(t if n == 1 else f"{t}:{n}" for t, n in sorted(row["subscription"].items()))


# ---------------------------------------------------------------- state view

state_row = documents.state_row
leader_fields = documents.leader_fields


def shard_rows(zk, groups: Sequence[str]) -> List[dict]:
    """One row per shard (:func:`coordinator.documents.shard_rows`), read from ZooKeeper."""
    count = read.shard_count(zk)
    return documents.shard_rows(count, read.shard_leaders(zk, count) if count else {}, groups)


def print_shards(rows: List[dict], nodes: Dict[str, NodeInfo], shown: int = 5) -> None:
    """The node table (node, host, pid, shards, groups), then the shard table."""
    led: Dict[str, List[dict]] = {n: [] for n in nodes}
    for r in rows:
        if r["node"]:
            led.setdefault(r["node"], []).append(r)
    print_table(("NODE", "HOST", "PID", "SHARDS", "GROUPS"),
                [(n, nodes[n].host if n in nodes else "-", nodes[n].pid if n in nodes else "-",
                  len(rs), sum(len(r["groups"]) for r in rs)) for n, rs in sorted(led.items())])
    click.echo()

    def names(groups: List[str]) -> str:
        more = f" (+{len(groups) - shown} more)" if len(groups) > shown else ""
        return ",".join(groups[:shown]) + more or "-"
    print_table(("SHARD", "NODE", "EPOCH", "VERIFIED", "GROUPS"),
                [(r["shard"], r["node"] or "-", r["epoch"], "yes" if r["verified"] else "no", names(r["groups"]))
                 for r in rows])


# ---------------------------------------------------------------- tables

def _cell(row: dict, key: str):
    value = row[key]
    if key == "current_offset" and row.get("error"):
        return f"unreadable ({row['error']})"
    if key == "assignment":
        return _assignment_cell(value)
    if key == "subscription":
        return _subscription_cell(row)
    if key == "strategies":
        return ",".join(value) if value else "-"
    if value is None or value == "":
        return "-"
    return value


def print_rows(columns, rows: List[dict]) -> None:
    """A view's rows as a table (its header even when there are none)."""
    print_table([header for header, _ in columns], [[_cell(row, key) for _, key in columns] for row in rows])


def print_state_errors(rows: List[dict]) -> None:
    """After the state table: each group's error, on a line of its own."""
    for row in rows:
        if row["error"]:
            click.echo(f"error in group {row['group']}: {row['error']}")
