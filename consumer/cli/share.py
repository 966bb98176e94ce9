"""groupctl commands of share groups (queues: :mod:`consumer.share`)::

    groupctl share-groups list [--output json]
    groupctl share-groups describe GROUP [--members | --settings] [--output json]
    groupctl share-groups configure GROUP KEY=VALUE...
    groupctl share-groups reset-offsets GROUP (--topic T[:P,P...]... | --all-topics)
             (--to-earliest | --to-latest | --to-offset N) [--execute]
    groupctl share-groups delete GROUP

``describe`` follows Kafka's ``kafka-share-groups.sh --describe``: per share-partition the
start offset (everything below it is done) and the lag (records not done yet, up to the log
end, which comes from the data plane), then ours: the window's end, what is in flight and in
which state, who holds records, the most deliveries of a record. ``--members`` and
``--settings`` are the other views; ``--output json`` prints the whole document
(:func:`coordinator.documents.share_group_document`, as the console serves it) whatever the view.

``configure`` creates the group's znode if there is none and sets the settings given, checked
by :meth:`~coordinator.protocol.share.ShareGroupConfig.with_settings` (a bad key or value is one
line; nothing is written), by compare-and-set (:func:`consumer.share.configure_share_group`). ``reset-offsets`` starts share-partitions over
at a new start offset (what was in flight is dropped) and, as Kafka's, is refused while the group
has members; its dry run (without ``--execute``) shows the plan. It writes every share-partition
in one transaction at the versions it read, so a member or the group's coordinator writing
meanwhile makes it change nothing. ``delete`` removes the group's znodes, in one transaction,
refused while it has members.

The model worker ``groupctl share-consume`` is in :mod:`consumer.cli.share_consume`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import click
from kazoo.exceptions import NoNodeError

from consumer.cli import describe, groups, reset, share_consume
from consumer.cli.context import CliContext, pass_cli
from consumer.records import TopicPartition
from coordinator import documents, protocol, read
from coordinator import share_partition as rules
from coordinator.cli.common import OUTPUT_OPTION, CliUsageError, print_json, print_table
from coordinator.errors import CorruptZnode, ZkGroupsError
from coordinator.protocol.share import (DONE_STATES, SETTINGS, ShareGroupConfig, SharePartitionState, share_group_path,
                                        share_members_path, share_partitions_path)
from coordinator.zkclient import TransactionFailed, commit

#: The partitions view: Kafka's columns first (GROUP TOPIC PARTITION START-OFFSET LAG), then ours.
PARTITION_COLUMNS = (("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                     ("START-OFFSET", "start_offset"), ("LAG", "lag"), ("END-OFFSET", "end_offset"),
                     ("LOG-END-OFFSET", "log_end_offset"), ("IN-FLIGHT", "in_flight"), ("ACQUIRED", "acquired"),
                     ("AVAILABLE", "available"), ("DELAYED", "delayed"), ("ARCHIVING", "archived_pending"),
                     ("MAX-DELIVERIES", "max_deliveries"), ("HOLDERS", "holders"))
MEMBER_COLUMNS = (("GROUP", "group"), ("CONSUMER-ID", "member_id"), ("HOST", "host"), ("CLIENT-ID", "client_id"),
                  ("SUBSCRIPTION", "subscription"), ("RECORDS-HELD", "records_held"))


def register(main: click.Group) -> None:
    """Add ``share-groups`` and ``share-consume`` to groupctl's ``main`` group."""
    main.add_command(share_groups)
    main.add_command(share_consume.share_consume)


def _view(cli: CliContext, group: str) -> read.ShareGroupView:
    """The share group ``group`` (a valid name that exists); its unreadable znodes are warnings."""
    protocol.validate_name(group, "group")
    view = read.share_group(cli.zk, group)
    if view is None:
        raise ZkGroupsError(f"share group {group!r} does not exist")
    for path, problem in sorted(view.problems.items()):
        click.echo(f"warning: {path}: {problem}", err=True)
    return view


def _cell(value):
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return value


def _print_rows(columns, rows: List[dict]) -> None:
    print_table([header for header, _ in columns], [[_cell(row[key]) for _, key in columns] for row in rows])


@click.group("share-groups")
def share_groups() -> None:
    """List, describe, configure, reset and delete share groups (queues)."""


@share_groups.command("list")
@OUTPUT_OPTION
@pass_cli
def share_groups_list(cli: CliContext, output: str) -> None:
    """Every share group: its members, its share-partitions and the records in flight."""
    found = []
    for name in read.share_groups(cli.zk):
        view = read.share_group(cli.zk, name)
        if view is None:  # deleted meanwhile
            continue
        found.append(documents.share_group_row(view))
    if output == "json":
        print_json({"share_groups": found})
    elif found:
        print_table(("GROUP", "MEMBERS", "PARTITIONS", "IN-FLIGHT", "ERROR"),
                    [(g["group"], g["members"], g["partitions"], g["in_flight"], g["error"] or "-") for g in found])
    else:
        click.echo("no share groups", err=True)


@share_groups.command("describe")
@click.argument("group")
@click.option("--members", is_flag=True, help="Per member: host, client id, subscription, records held.")
@click.option("--settings", is_flag=True, help="The group's settings, their defaults and what they mean.")
@OUTPUT_OPTION
@pass_cli
def share_groups_describe(cli: CliContext, group: str, members: bool, settings: bool, output: str) -> None:
    """Describe GROUP as kafka-share-groups.sh --describe does: per share-partition the start
    offset and the lag, then what is in flight (the default); --members; --settings. With
    --output json: the whole document, whatever the view."""
    if members and settings:
        raise CliUsageError("give at most one of --members, --settings")
    view = _view(cli, group)
    if settings and output != "json":
        _print_settings(view.config)
        return
    doc = documents.share_group_document(view, {} if members and output != "json" else _log_ends(cli, view))
    if output == "json":
        print_json(doc)
    elif members:
        _print_rows(MEMBER_COLUMNS, [{"group": group, **row} for row in doc["members"]])
    else:
        _print_rows(PARTITION_COLUMNS, [{"group": group, **row} for row in doc["partitions"]])


def _log_ends(cli: CliContext, view: read.ShareGroupView) -> Dict[Tuple[str, int], int]:
    """The log end of every share-partition of ``view`` (a topic not on the data plane: left out)."""
    by_topic: Dict[str, List[int]] = {}
    for topic, partition in sorted(view.partitions):
        by_topic.setdefault(topic, []).append(partition)
    ends: Dict[Tuple[str, int], int] = {}
    for topic, partitions in by_topic.items():
        ends.update(describe.end_offsets(cli, topic, partitions))
    return ends


def _print_settings(config: ShareGroupConfig) -> None:
    print_table(("SETTING", "VALUE", "DEFAULT", "MEANING"),
                [(key, _cell(value), _cell(SETTINGS[key].default), SETTINGS[key].doc)
                 for key, value in config.settings().items()])


# ---------------------------------------------------------------- configure

def parse_assignments(assignments) -> Dict[str, str]:
    """``KEY=VALUE`` arguments as {key: text}; a malformed one is a usage error."""
    updates: Dict[str, str] = {}
    for item in assignments:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CliUsageError(f"{item[:60]!r} is not KEY=VALUE (e.g. share.delivery.count.limit=3)")
        updates[key.strip()] = value
    return updates


@share_groups.command("configure")
@click.argument("group")
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@pass_cli
def share_groups_configure(cli: CliContext, group: str, assignments: Tuple[str, ...]) -> None:
    """Set GROUP's settings (creating the group if it does not exist), then print them all.

    Keys: share.record.lock.duration.ms, share.delivery.count.limit,
    share.partition.max.record.locks, share.auto.offset.reset (latest | earliest),
    errors.deadletterqueue.topic.name (empty: none), share.redelivery.backoff.ms,
    share.redelivery.backoff.max.ms. A bad key or value changes nothing.
    """
    from consumer.share import configure_share_group
    protocol.validate_name(group, "group")
    updates = parse_assignments(assignments)
    ShareGroupConfig().with_settings(updates)   # checked before connecting
    config, created = configure_share_group(cli.zk, group, updates)
    click.echo(f"{'created' if created else 'configured'} share group {group}")
    _print_settings(config)


# ---------------------------------------------------------------- reset-offsets

@share_groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "topic_specs", multiple=True, metavar="TOPIC[:P,P...]",
              help="A topic, or some of its partitions (orders:0,2); repeatable.")
@click.option("--all-topics", is_flag=True, help="Every topic the group has share-partitions for or subscribes to.")
@click.option("--to-earliest", is_flag=True, help="The first offset still held.")
@click.option("--to-latest", is_flag=True, help="The log end.")
@click.option("--to-offset", type=click.IntRange(min=0), metavar="N", help="Offset N (clamped to what the log holds).")
@click.option("--execute", is_flag=True, help="Apply; without it, only show what would change.")
@pass_cli
def share_groups_reset_offsets(cli: CliContext, group: str, topic_specs: Tuple[str, ...], all_topics: bool,
                               to_earliest: bool, to_latest: bool, to_offset: Optional[int], execute: bool) -> None:
    """Start GROUP's share-partitions over at a new start offset (dry run unless --execute):
    the records in flight are dropped. Refused while the group has members, as Kafka does."""
    if [to_earliest, to_latest, to_offset is not None].count(True) != 1:
        raise CliUsageError("give exactly one of --to-earliest, --to-latest, --to-offset")
    if bool(topic_specs) == all_topics:
        raise CliUsageError("give --topic or --all-topics (one of them)")
    scope = reset.merge_topic_specs(topic_specs)
    view = _view(cli, group)
    if all_topics:
        scope = {t: None for t in sorted({t for t, _ in view.partitions} |
                                         {t for m in view.members.values() for t in m.topics})}
        if not scope:
            raise ZkGroupsError(f"share group {group!r} has no topics to reset (no share-partitions or subscriptions)")
    tps = _reset_scope(cli, scope)
    found = reset.plane_offsets(cli.data_plane, tps, None)
    targets = {}
    for tp in tps:
        low, high = found.earliest[tp], found.latest[tp]
        target = low if to_earliest else high if to_latest else min(max(to_offset, low), high)
        if to_offset is not None and target != to_offset:
            click.echo(f"warning: {tp}: {to_offset} is outside [{low}, {high}]; using {target}", err=True)
        targets[tp] = target
    states = _read_states(cli.zk, group, tps)
    print_table(("TOPIC", "PARTITION", "START-OFFSET", "NEW-START-OFFSET", "IN-FLIGHT"),
                [(tp.topic, tp.partition, "-" if states[tp][0] is None else states[tp][0].start, targets[tp],
                  _in_flight(states[tp][0])) for tp in tps])
    live = list(view.members)
    if live:
        message = f"share group {group!r} has {len(live)} members; stop them before resetting its offsets"
        if execute:
            raise ZkGroupsError(message)
        click.echo(f"warning: {message} (--execute would be refused)", err=True)
    if not execute:
        click.echo("dry run: nothing changed (add --execute to apply)")
        return
    _write_states(cli.zk, group, targets, states)
    click.echo(f"reset {len(targets)} share-partitions of {', '.join(sorted({tp.topic for tp in tps}))}")


def _reset_scope(cli: CliContext, scope: Dict[str, Optional[List[int]]]) -> List[TopicPartition]:
    tps = []
    for topic, partitions in sorted(scope.items()):
        count = cli.partition_count(topic)
        missing = [p for p in partitions or () if p >= count]
        if missing:
            raise ZkGroupsError(f"topic {topic!r} has {count} partitions; there is no partition "
                                f"{', '.join(map(str, missing))}")
        tps.extend(TopicPartition(topic, p) for p in (range(count) if partitions is None else partitions))
    return tps


def _read_states(zk, group: str, tps: List[TopicPartition]) -> Dict[TopicPartition, Tuple[Optional[SharePartitionState], int]]:
    """{tp: (its state or None, its znode's version, -1 if there is none)}; reads pipelined."""
    answers = [(tp, zk.get_async(share_partitions_path(group, tp.topic, tp.partition))) for tp in tps]
    out = {}
    for tp, answer in answers:
        try:
            raw, stat = answer.get()
        except NoNodeError:
            out[tp] = (None, -1)
            continue
        path = share_partitions_path(group, tp.topic, tp.partition)
        try:
            out[tp] = (SharePartitionState.decode(raw, path), stat.version)
        except CorruptZnode as e:   # a reset is how it is mended: overwritten
            click.echo(f"warning: {e}; the reset overwrites it", err=True)
            out[tp] = (rules.initial(0), stat.version)
    return out


def _in_flight(state: Optional[SharePartitionState]) -> int:
    if state is None:
        return 0
    c = rules.counts(state)
    return state.end - state.start - sum(c.get(s, 0) for s in DONE_STATES)


def _write_states(zk, group: str, targets: Dict[TopicPartition, int],
                  states: Dict[TopicPartition, Tuple[Optional[SharePartitionState], int]]) -> None:
    """Every target in one transaction, each at the version read (or created where there was none)."""
    t = zk.transaction()
    for tp, target in targets.items():
        state, version = states[tp]
        path = share_partitions_path(group, tp.topic, tp.partition)
        if state is None:
            zk.ensure_path(share_partitions_path(group, tp.topic))
            t.create(path, rules.initial(target).encode())
            continue
        try:
            fresh = rules.reset(state, target)
        except ValueError:
            holders = sorted({h for h, _ in state.held.values()})
            raise ZkGroupsError(f"records of {tp} are still held by {', '.join(holders)} (a member that left); "
                                "their locks end by the group's coordinator: try again then") from None
        t.set_data(path, fresh.encode(), version=version)
    try:
        commit(t)
    except TransactionFailed:
        raise ZkGroupsError(f"share group {group!r} changed while resetting it (a member or its coordinator "
                            "wrote); nothing was reset") from None


# ---------------------------------------------------------------- delete

@share_groups.command("delete")
@click.argument("group")
@pass_cli
def share_groups_delete(cli: CliContext, group: str) -> None:
    """Delete GROUP: its settings and every share-partition's state (refused while it has members)."""
    protocol.validate_name(group, "group")
    zk = cli.zk
    if not zk.exists(share_group_path(group)):
        raise ZkGroupsError(f"share group {group!r} does not exist")
    live = read.children(zk, share_members_path(group))
    if live:
        raise ZkGroupsError(f"share group {group!r} has {len(live)} members; stop them before deleting it")
    groups.delete_tree(zk, share_group_path(group), f"share group {group!r}")
    click.echo(f"deleted share group {group}")
