"""What ``groupctl groups describe`` shows, as data, in the three views of Kafka's
``kafka-consumer-groups.sh --describe``:

* **offsets** (the default): one row per partition of the group's topics — ``group``,
  ``topic``, ``partition``, ``current_offset`` (the committed offset), ``log_end_offset`` (from
  the data plane: the embedded log or Kafka), ``lag``, and the owning member's ``consumer_id``,
  ``host`` and ``client_id`` (None when the partition is not assigned), plus ``error`` (why a
  committed offset could not be read).
* **members**: one row per live member — ``group``, ``consumer_id``, ``host``, ``client_id``,
  ``partitions`` (how many it is assigned), ``assignment`` ({topic: [partitions]}),
  ``strategies``, ``pattern``, ``subscription``, ``error`` (an unreadable registration).
* **state**: one row per group — ``group``, ``coordinator`` (the node leading the group's shard),
  ``assignment_strategy``, ``state``, ``members`` (how many), ``generation``, ``error`` (the
  group state's error: a failed rebalance, a member left out, ...).

Rows are dicts with the field names of ``--output json``; the tables are rendered from the same
rows, so both say the same. Missing values are None (``-`` in tables).

The group's topics are those it is assigned, has committed offsets for, or its live members
subscribe to (a pattern is matched against the data plane's topics); every partition of each
is shown. Assignment (and so CONSUMER-ID, HOST, CLIENT-ID) is the leader's last decision, the
group state's; the registration of the member it names gives host and client id. What is not
guaranteed: the views are read one after the other, not as one snapshot, so a rebalance in
between may show a partition's new owner next to its previous committed offset.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import click
from kazoo.exceptions import NoNodeError

from consumer.cli.context import CliContext
from consumer.records import TopicPartition
from coordinator import protocol, read
from coordinator.cli.common import print_table
from coordinator.errors import CorruptZnode, UnknownTopic
from coordinator.protocol import GroupState, LeaderInfo, NodeInfo, Registration

VIEWS = ("offsets", "members", "state")

OFFSETS_COLUMNS = (("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                   ("CURRENT-OFFSET", "current_offset"), ("LOG-END-OFFSET", "log_end_offset"), ("LAG", "lag"),
                   ("CONSUMER-ID", "consumer_id"), ("HOST", "host"), ("CLIENT-ID", "client_id"))
MEMBERS_COLUMNS = (("GROUP", "group"), ("CONSUMER-ID", "consumer_id"), ("HOST", "host"),
                   ("CLIENT-ID", "client_id"), ("#PARTITIONS", "partitions"))
MEMBERS_VERBOSE_COLUMNS = MEMBERS_COLUMNS + (("STRATEGIES", "strategies"), ("SUBSCRIPTION", "subscription"),
                                             ("ASSIGNMENT", "assignment"))
STATE_COLUMNS = (("GROUP", "group"), ("COORDINATOR", "coordinator"), ("ASSIGNMENT-STRATEGY", "assignment_strategy"),
                 ("STATE", "state"), ("#MEMBERS", "members"), ("GENERATION", "generation"))


@dataclass
class GroupSnapshot:
    """One group as read from ZooKeeper: its state, live members' registrations and the ids
    of members whose registration is unreadable (id -> the problem)."""
    group: str
    state: GroupState
    members: Dict[str, Registration]
    unreadable: Dict[str, str] = field(default_factory=dict)

    def owners(self) -> Dict[Tuple[str, int], str]:
        """{(topic, partition): consumer id} of the group state's assignment."""
        return {(topic, p): protocol.consumer_of_stream(stream)
                for topic, parts in self.state.assignment.items() for p, stream in parts.items()}

    def member_ids(self) -> List[str]:
        return sorted({*self.members, *self.unreadable})


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
    """{topic: partitions} of the group's topics: those it is assigned, has committed offsets
    for, or its live members subscribe to; every partition of each (``counts``: the data
    plane's partition counts), and any partition the assignment or an offsets znode names."""
    found: Dict[str, Set[int]] = {t: set(parts) for t, parts in snapshot.state.assignment.items()}
    for topic, parts in offset_topics(zk, snapshot.group).items():
        found.setdefault(topic, set()).update(parts)
    for registration in snapshot.members.values():
        for topic in registration.topics(counts):
            found.setdefault(topic, set())
    for topic, parts in found.items():
        parts.update(range(counts.get(topic, 0)))
    return found


def offsets_rows(cli: CliContext, snapshot: GroupSnapshot, counts: Dict[str, int]) -> List[dict]:
    """The offsets view of one group (see the module docstring)."""
    partitions = group_partitions(cli.zk, snapshot, counts)
    pairs = [(topic, p) for topic in sorted(partitions) for p in sorted(partitions[topic])]
    problems: Dict[object, str] = {}
    committed = read.committed_offsets(cli.zk, snapshot.group, pairs, problems)
    ends: Dict[Tuple[str, int], int] = {}
    for topic in sorted(partitions):
        count = counts.get(topic)
        known = [p for p in sorted(partitions[topic]) if count is None or p < count]
        cli.warn_if_no_data(topic, known)
        ends.update(end_offsets(cli, topic, known))
    owners = snapshot.owners()
    rows = []
    for pair in pairs:
        topic, p = pair
        current, end = committed[pair], ends.get(pair)
        owner = owners.get(pair)
        registration = snapshot.members.get(owner) if owner else None
        rows.append({"group": snapshot.group, "topic": topic, "partition": p, "current_offset": current,
                     "log_end_offset": end, "lag": None if current is None or end is None else end - current,
                     "consumer_id": owner, "host": registration.host if registration else None,
                     "client_id": registration.client_id if registration else None,
                     "error": problems.get(pair)})
    return rows


def all_offsets_rows(cli: CliContext, snapshots: Sequence[GroupSnapshot]) -> List[dict]:
    """The offsets view of several groups (the data plane's partition counts read once)."""
    counts = cli.data_plane.partition_counts() if snapshots else {}
    return [row for s in snapshots for row in offsets_rows(cli, s, counts)]


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

def members_rows(snapshot: GroupSnapshot) -> List[dict]:
    """The members view of one group (see the module docstring)."""
    assigned: Dict[str, Dict[str, List[int]]] = {}
    for (topic, p), owner in sorted(snapshot.owners().items()):
        assigned.setdefault(owner, {}).setdefault(topic, []).append(p)
    rows = []
    for cid in snapshot.member_ids():
        reg = snapshot.members.get(cid)
        assignment = assigned.get(cid, {})
        rows.append({"group": snapshot.group, "consumer_id": cid, "host": reg.host if reg else None,
                     "client_id": reg.client_id if reg else None,
                     "partitions": sum(len(parts) for parts in assignment.values()), "assignment": assignment,
                     "strategies": list(reg.strategies) if reg else None, "pattern": reg.pattern if reg else None,
                     "subscription": dict(reg.subscription) if reg else None,
                     "error": snapshot.unreadable.get(cid)})
    return rows


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

def state_row(snapshot: GroupSnapshot, coordinator: Optional[str]) -> dict:
    """The state view of one group (see the module docstring); ``coordinator``: the node
    leading the group's shard."""
    s = snapshot.state
    return {"group": snapshot.group, "coordinator": coordinator,
            "assignment_strategy": s.strategy or None, "state": s.state,
            "members": len(snapshot.member_ids()), "generation": s.generation, "error": s.error or None}


def leader_fields(info: Optional[LeaderInfo], verified: bool) -> Optional[dict]:
    """The controller as ``groupctl coordinator --output json`` shows it."""
    if info is None:
        return None
    since = dt.datetime.fromtimestamp(info.since / 1000).astimezone()
    return {"node_id": info.node_id, "host": info.host, "pid": info.pid, "epoch": info.epoch,
            "since": since.isoformat(timespec="seconds"), "since_ms": info.since, "verified_all_groups": verified}


def shard_rows(zk, groups: Sequence[str]) -> List[dict]:
    """One row per shard: the node leading it, its epoch, whether that node verified all its
    groups, and the groups in it."""
    count = read.shard_count(zk)
    if not count:  # no controller has run yet
        return []
    members: Dict[int, List[str]] = {s: [] for s in range(count)}
    for g in groups:
        members[protocol.shard_of(g, count)].append(g)
    return [{"shard": s, "node": node or None, "epoch": epoch, "verified": verified, "groups": sorted(members[s])}
            for s, (node, epoch, verified) in sorted(read.shard_leaders(zk, count).items())]


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
