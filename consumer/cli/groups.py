"""groupctl commands about the coordinator and consumer groups::

    groupctl coordinator [--output json]
    groupctl groups list [--output json]
    groupctl groups describe (GROUP | --all-groups) [--offsets | --members [--verbose] | --state] [--output json]
    groupctl groups reset-offsets GROUP (--topic T[:P,P...]... | --all-topics)
             (--to-earliest | --to-latest | --to-current | --to-offset N | --shift-by N | --to-datetime ISO
              | --by-duration PnDTnHnMnS) [--export] [--execute]
    groupctl groups reset-offsets GROUP --from-file PLAN.csv [--export] [--execute]
    groupctl groups delete GROUP

``describe`` and ``reset-offsets`` follow Kafka's ``kafka-consumer-groups.sh`` (their views and
planning live in :mod:`consumer.cli.describe` and :mod:`consumer.cli.reset`). Every read command
takes ``--output json``: one JSON document on stdout, with the field names of the docs' output reference.

On Kafka (``--bootstrap-servers``) committed offsets stay in ZooKeeper (``describe`` and
``reset-offsets`` read and write them there, compare-and-set as always); end offsets, lag and
reset targets come from Kafka's offsets.

``reset-offsets`` writes by compare-and-set: every offsets znode is read with its version and
written in one transaction that requires the same version (or creates a missing one), so a
concurrent change (a member's claim or commit, another reset) makes it fail and change nothing.
Over many partitions, with stderr a terminal, it shows a progress bar while it reads offsets.

``groupctl consume`` is in :mod:`consumer.cli.consume`.
"""
from __future__ import annotations

import datetime as dt
import functools
import logging
import sys
from typing import Dict, List, Optional, Tuple

import click

from coordinator import documents, protocol, read
from consumer.cli import consume, describe, reset
from consumer.cli.exporter import exporter
from consumer.cli.context import CliContext, pass_cli
from consumer.records import TopicPartition
from coordinator.cli.common import (OUTPUT_OPTION, CliUsageError, print_json, print_table)
from coordinator.errors import (CorruptZnode, ZkGroupsError)
from coordinator.zkclient import TransactionFailed, commit

log = logging.getLogger("zkgroups.groupctl")


def _existing_group(cli: CliContext, group: str):
    """The ZooKeeper client, once ``group`` is known to be a valid name that exists."""
    protocol.validate_name(group, "group")
    if not cli.zk.exists(protocol.group_path(group)):
        raise ZkGroupsError(f"group {group!r} does not exist")
    return cli.zk


def register(main: click.Group) -> None:
    """Add these commands to groupctl's ``main`` group."""
    main.add_command(coordinator)
    main.add_command(groups)
    main.add_command(consume.consume)
    main.add_command(exporter)


# ---------------------------------------------------------------- coordinator

@click.command()
@OUTPUT_OPTION
@pass_cli
def coordinator(cli: CliContext, output: str) -> None:
    """Show the controller (the elected node that places shards), the contenders, the live
    nodes and which node leads which shard of groups."""
    zk = cli.zk
    info = read.leader(zk)
    contenders = zk.Election(protocol.ELECTION).contenders() if zk.exists(protocol.ELECTION) else []
    verified = read.all_verified(zk)
    shards = describe.shard_rows(zk, read.groups(zk))
    nodes = read.nodes(zk)
    if output == "json":
        print_json(documents.coordinator_document(info, verified, contenders, nodes, shards))
        return
    if info is None:
        click.echo("leader: none")
    else:
        since = dt.datetime.fromtimestamp(info.since / 1000).isoformat(timespec="seconds")
        click.echo(f"leader: {info.node_id} (host {info.host}, pid {info.pid}): the controller, it places the shards")
        click.echo(f"epoch: {info.epoch}")
        click.echo(f"since: {since}")
    click.echo(f"verified all groups: {'yes' if verified else 'not yet'}")
    click.echo(f"contenders: {', '.join(contenders) or 'none'}")
    if shards:
        click.echo()
        describe.print_shards(shards, nodes)


# ---------------------------------------------------------------- groups

@click.group()
def groups() -> None:
    """List, describe and reset consumer groups."""


@groups.command("list")
@OUTPUT_OPTION
@pass_cli
def groups_list(cli: CliContext, output: str) -> None:
    """Every group with its state, generation and member count."""
    found = []
    for group in read.groups(cli.zk):
        try:
            s = read.group_state(cli.zk, group)
            found.append(documents.list_row(group, s, len(read.children(cli.zk, protocol.ids_path(group)))))
        except CorruptZnode as e:
            found.append(documents.list_row(group, None, None, e.problem))
    if output == "json":
        print_json({"groups": found})
        return
    print_table(["GROUP", "STATE", "GENERATION", "MEMBERS"],
                [(g["group"], f"unreadable ({g['error']})" if g["error"] else g["state"],
                  "-" if g["error"] else g["generation"], "-" if g["error"] else g["members"]) for g in found])


@groups.command("describe")
@click.argument("group", required=False)
@click.option("--all-groups", is_flag=True, help="Describe every group.")
@click.option("--offsets", is_flag=True, help="Per partition: committed and log-end offsets, lag, owner (the default).")
@click.option("--members", is_flag=True, help="Per member: host, client id, partitions assigned.")
@click.option("--state", is_flag=True,
              help="Per group: coordinator, assignment strategy, state, members, generation, error.")
@click.option("--verbose", is_flag=True, help="With --members: also strategies, subscription and assignment.")
@OUTPUT_OPTION
@pass_cli
def groups_describe(cli: CliContext, group: Optional[str], all_groups: bool, offsets: bool, members: bool,
                    state: bool, verbose: bool, output: str) -> None:
    """Describe GROUP (or --all-groups) as kafka-consumer-groups.sh --describe does: offsets
    and lag per partition (the default, --offsets), --members [--verbose], or --state."""
    if not group and not all_groups:
        raise CliUsageError("Missing argument 'GROUP' (or --all-groups)")
    if group and all_groups:
        raise CliUsageError("give GROUP or --all-groups, not both")
    chosen = [name for name, given in zip(describe.VIEWS, (offsets, members, state)) if given]
    if len(chosen) > 1:
        raise CliUsageError("give at most one of --offsets, --members, --state")
    view = chosen[0] if chosen else "offsets"
    zk = _existing_group(cli, group) if group else cli.zk
    names = [group] if group else read.groups(zk)
    snapshots = describe.read_groups(zk, names, skip_unreadable=all_groups)
    if view == "state":
        coordinators = read.group_coordinators(zk, [s.group for s in snapshots])
        rows = [describe.state_row(s, coordinators[s.group]) for s in snapshots]
        if output == "json":
            print_json({"groups": rows})
        else:
            describe.print_rows(describe.STATE_COLUMNS, rows)
            describe.print_state_errors(rows)
        return
    if view == "members":
        rows = [row for s in snapshots for row in describe.members_rows(s)]
        if output == "json":
            print_json({"members": rows})
        else:
            describe.print_rows(describe.MEMBERS_VERBOSE_COLUMNS if verbose else describe.MEMBERS_COLUMNS, rows)
        return
    rows = describe.all_offsets_rows(cli, snapshots)
    completed = any("completed_above" in r for r in rows)  # a group with parallel consumers
    for r in rows if completed else ():
        r.setdefault("completed_above", None)
    if output == "json":
        print_json({"offsets": rows})
    else:
        describe.print_rows(describe.OFFSETS_COLUMNS + (describe.COMPLETED_COLUMN if completed else ()), rows)


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "topic_specs", multiple=True, metavar="TOPIC[:P,P...]",
              help="A topic, or some of its partitions (orders:0,2); repeatable.")
@click.option("--all-topics", is_flag=True,
              help="Every topic the group has offsets for, is assigned, or subscribes to.")
@click.option("--to-earliest", is_flag=True, help="The first offset still held.")
@click.option("--to-latest", is_flag=True, help="The log end.")
@click.option("--to-current", is_flag=True, help="The committed offset (the log end where there is none).")
@click.option("--to-offset", type=click.IntRange(min=0), metavar="N", help="Offset N.")
@click.option("--shift-by", type=int, metavar="N", help="The committed offset plus N (N may be negative).")
@click.option("--to-datetime", metavar="ISO",
              help="The first offset at or after this time: ISO 8601, e.g. 2026-11-22T08:00:00 "
                   "(local time unless it has an offset).")
@click.option("--by-duration", metavar="PnDTnHnMnS",
              help="The first offset at or after this long ago (ISO-8601 duration, e.g. PT1H30M, P2D).")
@click.option("--from-file", "plan_file", type=click.File("rb"), metavar="FILE",
              help="The offsets in FILE: CSV lines topic,partition,offset (what --export prints; - for stdin).")
@click.option("--export", is_flag=True, help="Print the plan as CSV (topic,partition,offset) instead of a table.")
@click.option("--execute", is_flag=True, help="Apply; without it, only show what would change.")
@pass_cli
def groups_reset_offsets(cli: CliContext, group: str, topic_specs: Tuple[str, ...], all_topics: bool,
                         to_earliest: bool, to_latest: bool, to_current: bool, to_offset: Optional[int],
                         shift_by: Optional[int], to_datetime: Optional[str], by_duration: Optional[str],
                         plan_file, export: bool, execute: bool) -> None:
    """Move GROUP's committed offsets (dry run unless --execute), as kafka-consumer-groups.sh
    --reset-offsets does. Targets out of a partition's range are clamped to it."""
    given = {"to-earliest": to_earliest, "to-latest": to_latest, "to-offset": to_offset is not None,
             "to-datetime": to_datetime is not None, "to-current": to_current, "shift-by": shift_by is not None,
             "by-duration": by_duration is not None, "from-file": plan_file is not None}
    chosen = [kind for kind, on in given.items() if on]
    if len(chosen) != 1:
        raise CliUsageError(f"give exactly one of {', '.join(reset.TARGETS)}")
    kind = chosen[0]
    if kind == "from-file" and (topic_specs or all_topics):
        raise CliUsageError("--from-file names its own partitions: leave out --topic and --all-topics")
    if kind != "from-file" and not topic_specs and not all_topics:
        raise CliUsageError("Missing option '--topic' (or --all-topics)")
    if topic_specs and all_topics:
        raise CliUsageError("give --topic or --all-topics, not both")
    # Everything the command line says is checked before anything connects.
    protocol.validate_name(group, "group")
    scope = reset.merge_topic_specs(topic_specs)
    timestamp = reset.parse_datetime(to_datetime) if to_datetime is not None else None
    if by_duration is not None:
        timestamp = max(0, reset.now_ms() - reset.parse_duration(by_duration))
    plan = reset.parse_plan(plan_file, getattr(plan_file, "name", "the plan")) if plan_file is not None else None
    value = {"to-offset": to_offset, "shift-by": shift_by, "from-file": plan}.get(kind)

    zk = cli.zk
    live = read.children(zk, protocol.ids_path(group))
    if live and execute:
        raise ZkGroupsError(f"group {group!r} has {len(live)} live members; stop them before resetting offsets")
    tps = _reset_scope(cli, group, scope, all_topics, plan)
    progress = sys.stderr.isatty() and len(tps) >= RESET_PROGRESS_MIN_PARTITIONS
    found = reset.plane_offsets(cli.data_plane, tps, timestamp, progress)
    current = reset.read_offsets(zk, group, tps)
    targets, clamped = reset.plan_targets(reset.Target(kind, value), tps, current, found.earliest, found.latest,
                                          found.found)
    for line in reset.clamp_warnings(clamped):
        click.echo(line, err=True)
    note = functools.partial(click.echo, err=export)  # with --export, stdout holds only the CSV
    if export:
        click.echo(reset.export_plan(targets), nl=False)
    else:
        print_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                    [(tp.topic, tp.partition, current[tp].shown, targets[tp]) for tp in tps])
    if not execute:
        problem = reset.too_large(reset.offsets_transaction(zk, group, targets, current)[0])
        if problem:
            click.echo(f"warning: {problem}", err=True)
        note("dry run: nothing changed (add --execute to apply)")
        return
    if progress:
        click.echo(f"writing {len(targets):,} offsets in one transaction", err=True)
    reset.write_offsets(zk, group, targets, current)
    topics = sorted({tp.topic for tp in tps})
    note(f"reset {len(targets)} partitions of {', '.join(topics)}")


#: reset-offsets shows a progress bar (stderr a terminal) from this many partitions on.
RESET_PROGRESS_MIN_PARTITIONS = 1000


def _reset_scope(cli: CliContext, group: str, scope: Dict[str, Optional[List[int]]], all_topics: bool,
                 plan: Optional[Dict[TopicPartition, int]]) -> List[TopicPartition]:
    """The partitions a reset moves, sorted; each checked to exist on the data plane."""
    if plan is not None:
        scope = {}
        for tp in plan:
            scope.setdefault(tp.topic, []).append(tp.partition)
    elif all_topics:
        snapshot = describe.read_group(cli.zk, group)
        counts = cli.data_plane.partition_counts()
        scope = {}
        for topic in sorted(describe.group_partitions(cli.zk, snapshot, counts)):
            if topic in counts:
                scope[topic] = None  # every partition
            else:
                click.echo(f"warning: topic {topic} is not on {cli.data_plane.describe()}; its offsets are left as "
                           "they are", err=True)
        if not scope:
            raise ZkGroupsError(f"group {group!r} has no topics to reset (no committed offsets, assignment or "
                                "subscriptions)")
    tps = []
    for topic, partitions in sorted(scope.items()):
        count = cli.partition_count(topic)
        missing = [p for p in partitions or () if p >= count]
        if missing:
            raise ZkGroupsError(f"topic {topic!r} has {count} partitions; there is no partition "
                                f"{', '.join(map(str, missing))}")
        cli.warn_if_no_data(topic, range(count) if partitions is None else partitions)
        tps.extend(TopicPartition(topic, p) for p in (range(count) if partitions is None else sorted(partitions)))
    return tps


@groups.command("delete")
@click.argument("group")
@pass_cli
def groups_delete(cli: CliContext, group: str) -> None:
    """Delete GROUP: committed offsets, state and channels (refused while it has live members)."""
    zk = _existing_group(cli, group)
    live = read.children(zk, protocol.ids_path(group))
    if live:
        raise ZkGroupsError(f"group {group!r} has {len(live)} live members; stop them before deleting it")
    delete_tree(zk, protocol.group_path(group), f"group {group!r}")
    click.echo(f"deleted group {group}")


def delete_tree(zk, path: str, what: str) -> None:
    """Delete ``path`` and everything under it in one transaction, children before parents: a
    member registering meanwhile makes the delete of its parent fail, and then nothing is deleted."""
    t = zk.transaction()
    for node in read.subtree(zk, path):
        t.delete(node)
    try:
        commit(t)
    except TransactionFailed:
        raise ZkGroupsError(f"{what} changed while deleting it; nothing was deleted") from None

