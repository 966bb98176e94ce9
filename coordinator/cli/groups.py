"""groupctl commands about the coordinator and consumer groups.

    groupctl coordinator
    groupctl groups list
    groupctl groups describe GROUP
    groupctl groups reset-offsets GROUP --topic T (--to-earliest|--to-latest|--to-offset N|--to-datetime ISO) [--execute]
    groupctl consume GROUP TOPIC... [--pattern REGEX] [--max-records N] [--idle-exit SECONDS]
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import signal
import sys
import threading
import time
from typing import Dict, List, Optional

import click
from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.assignors import STRATEGIES
from coordinator.cli.common import CliContext, CliUsageError, pass_cli, print_table
from coordinator.errors import CorruptZnode, ZkGroupsError
from coordinator.zkclient import TransactionFailed, commit


def _children(zk, path: str) -> List[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def _existing_group(cli: CliContext, group: str):
    """The ZooKeeper client, once ``group`` is known to be a valid name that exists."""
    protocol.validate_name(group, "group")
    if not cli.zk.exists(protocol.group_path(group)):
        raise ZkGroupsError(f"group {group!r} does not exist")
    return cli.zk


def _state(zk, group: str) -> protocol.GroupState:
    try:
        return protocol.GroupState.decode(zk.get(protocol.state_path(group))[0], protocol.state_path(group))
    except NoNodeError:
        return protocol.GroupState()


def _committed(zk, group: str, topic: str, partition: int) -> Optional[int]:
    path = protocol.offsets_path(group, topic, partition)
    try:
        return protocol.decode_offset(zk.get(path)[0], path)
    except NoNodeError:
        return None


def register(main: click.Group) -> None:
    """Add these commands to groupctl's ``main`` group."""
    main.add_command(coordinator)
    main.add_command(groups)
    main.add_command(consume)


# ---------------------------------------------------------------- coordinator

@click.command()
@pass_cli
def coordinator(cli: CliContext) -> None:
    """Show the leader, its epoch and the contenders."""
    zk = cli.zk
    try:
        info = protocol.LeaderInfo.decode(zk.get(protocol.LEADER)[0])
        since = dt.datetime.fromtimestamp(info.since / 1000).isoformat(timespec="seconds")
        click.echo(f"leader: {info.node_id} (host {info.host}, pid {info.pid})")
        click.echo(f"epoch: {info.epoch}")
        click.echo(f"since: {since}")
        click.echo(f"verified all groups: {'yes' if info.loaded else 'not yet'}")
    except NoNodeError:
        click.echo("leader: none")
    contenders = zk.Election(protocol.ELECTION).contenders() if zk.exists(protocol.ELECTION) else []
    click.echo(f"contenders: {', '.join(contenders) or 'none'}")


# ---------------------------------------------------------------- groups

@click.group()
def groups() -> None:
    """List, describe and reset consumer groups."""


@groups.command("list")
@pass_cli
def groups_list(cli: CliContext) -> None:
    """Every group with its state, generation and member count."""
    rows = []
    for group in _children(cli.zk, protocol.GROUPS):
        try:
            s = _state(cli.zk, group)
            rows.append((group, s.state, s.generation, len(_children(cli.zk, protocol.ids_path(group)))))
        except CorruptZnode as e:
            rows.append((group, f"unreadable ({e.problem})", "-", "-"))
    print_table(["GROUP", "STATE", "GENERATION", "MEMBERS"], rows)


@groups.command("describe")
@click.argument("group")
@pass_cli
def groups_describe(cli: CliContext, group: str) -> None:
    """State, members with streams, assignment, committed offset, end offset and lag."""
    zk = _existing_group(cli, group)
    s = _state(zk, group)
    click.echo(f"group: {group}\nstate: {s.state}\ngeneration: {s.generation}\nstrategy: {s.strategy or '-'}")
    if s.error:
        click.echo(f"error: {s.error}")
    members = _children(zk, protocol.ids_path(group))
    click.echo(f"members ({len(members)}):")
    for cid in members:
        path = protocol.ids_path(group, cid)
        try:
            reg = protocol.Registration.decode(zk.get(path)[0], path)
            click.echo(f"  {cid}  {reg.pattern} {json.dumps(reg.subscription)}  strategies={','.join(reg.strategies)}")
        except (NoNodeError, CorruptZnode) as e:
            click.echo(f"  {cid}  (unreadable: {e})")
    log = cli.log()
    rows = []
    for topic in sorted(s.assignment):
        for p in sorted(s.assignment[topic]):
            end = log.latest_offset(topic, p)
            try:
                committed = _committed(zk, group, topic, p)
            except CorruptZnode as e:
                rows.append((topic, p, s.assignment[topic][p], f"unreadable ({e.problem})", end, "-"))
                continue
            lag = end - committed if committed is not None else "-"
            rows.append((topic, p, s.assignment[topic][p], committed if committed is not None else "-", end, lag))
    if rows:
        print_table(["TOPIC", "PARTITION", "STREAM", "COMMITTED", "END", "LAG"], rows)


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", required=True, help="Topic whose offsets to reset.")
@click.option("--to-earliest", is_flag=True)
@click.option("--to-latest", is_flag=True)
@click.option("--to-offset", type=click.IntRange(min=0))
@click.option("--to-datetime", help="ISO 8601, e.g. 2026-11-22T08:00:00 (local time unless it has an offset).")
@click.option("--execute", is_flag=True, help="Apply; without it, only show what would change.")
@pass_cli
def groups_reset_offsets(cli: CliContext, group: str, topic: str, to_earliest: bool, to_latest: bool,
                         to_offset: Optional[int], to_datetime: Optional[str], execute: bool) -> None:
    """Move GROUP's committed offsets of TOPIC (dry run unless --execute)."""
    chosen = [x for x in (to_earliest, to_latest, to_offset is not None, to_datetime) if x]
    if len(chosen) != 1:
        raise CliUsageError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime")
    zk = cli.zk
    protocol.validate_name(group, "group")
    partitions = cli.topics.partitions(topic)
    live = _children(zk, protocol.ids_path(group))
    if live and execute:
        raise ZkGroupsError(f"group {group!r} has {len(live)} live members; stop them before resetting offsets")
    log = cli.log()
    if to_datetime:
        try:
            when = dt.datetime.fromisoformat(to_datetime)
        except ValueError:
            raise CliUsageError(f"--to-datetime {to_datetime!r} is not ISO 8601") from None
        ts = int(when.timestamp() * 1000)
    targets: Dict[int, int] = {}
    for p in range(partitions):
        earliest, latest = log.earliest_offset(topic, p), log.latest_offset(topic, p)
        if to_earliest:
            targets[p] = earliest
        elif to_latest:
            targets[p] = latest
        elif to_offset is not None:
            targets[p] = max(earliest, min(to_offset, latest))
        else:
            found = log.offset_for_time(topic, p, ts)
            targets[p] = latest if found is None else found
    current = {p: _committed(zk, group, topic, p) for p in range(partitions)}
    print_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                [(topic, p, "-" if current[p] is None else current[p], targets[p]) for p in range(partitions)])
    if not execute:
        click.echo("dry run: nothing changed (add --execute to apply)")
        return
    zk.ensure_path(protocol.offsets_path(group, topic))
    t = zk.transaction()
    for p, offset in targets.items():
        path = protocol.offsets_path(group, topic, p)
        if current[p] is None:
            t.create(path, protocol.encode_offset(offset))
        else:
            t.set_data(path, protocol.encode_offset(offset))
    try:
        commit(t)
    except TransactionFailed:
        raise ZkGroupsError(f"offsets of group {group!r} changed while resetting; nothing was written") from None
    click.echo(f"reset {len(targets)} partitions of {topic}")


@groups.command("delete")
@click.argument("group")
@pass_cli
def groups_delete(cli: CliContext, group: str) -> None:
    """Delete GROUP: committed offsets, state and channels (refused while it has live members)."""
    zk = _existing_group(cli, group)
    live = _children(zk, protocol.ids_path(group))
    if live:
        raise ZkGroupsError(f"group {group!r} has {len(live)} live members; stop them before deleting it")
    # One transaction, children before parents: a member registering meanwhile makes the delete
    # of ids (or of any other parent) fail, and then nothing is deleted.
    t = zk.transaction()
    for path in _subtree(zk, protocol.group_path(group)):
        t.delete(path)
    try:
        commit(t)
    except TransactionFailed:
        raise ZkGroupsError(f"group {group!r} changed while deleting it; nothing was deleted") from None
    click.echo(f"deleted group {group}")


def _subtree(zk, path: str) -> List[str]:
    """``path`` and everything under it, each node after its children."""
    out = []
    for child in _children(zk, path):
        out.extend(_subtree(zk, f"{path}/{child}"))
    out.append(path)
    return out


# ---------------------------------------------------------------- consume

@click.command()
@click.argument("group")
@click.argument("topics", nargs=-1)
@click.option("--pattern", help="Follow every topic matching this regex (instead of TOPICS).")
@click.option("--max-records", type=click.IntRange(min=1), help="Exit after this many records.")
@click.option("--idle-exit", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Exit after this long without a record.")
@click.option("--from-beginning/--from-end", default=True, show_default=True,
              help="Where to start when the group has no committed offset.")
@click.option("--session-timeout-ms", type=click.IntRange(min=100), default=6000, show_default=True)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file of consumer settings.")
@click.option("--consumer-id", help="This member's id (default: <group>_<host>-<ms>-<8 hex>).")
@click.option("--strategy", "strategies", multiple=True, type=click.Choice(sorted(STRATEGIES)),
              help="Assignment strategy this member supports; repeat in order of preference (default: range).")
@click.option("--with-metadata", is_flag=True,
              help="Add to each line this member's id, its generation and when poll() returned the record "
                   "(wall clock, seconds).")
@pass_cli
def consume(cli: CliContext, group: str, topics, pattern: Optional[str], max_records: Optional[int],
            idle_exit: Optional[float], from_beginning: bool, session_timeout_ms: int,
            config_file: Optional[str], consumer_id: Optional[str], strategies, with_metadata: bool) -> None:
    """Consume as a member of GROUP; print records as JSON lines and commit as it goes."""
    from consumer.consumer import Consumer
    from coordinator.config import load_toml
    if bool(topics) == bool(pattern):
        raise CliUsageError("give TOPICS or --pattern (one of them)")
    for topic in topics:
        protocol.validate_name(topic)
    settings = dict(load_toml(config_file, "consumer")) if config_file else {}
    settings.setdefault("auto_offset_reset", "earliest" if from_beginning else "latest")
    settings.setdefault("session_timeout_ms", session_timeout_ms)
    settings.setdefault("enable_auto_commit", False)
    if strategies:
        settings["assignment_strategy"] = strategies
    count, out = 0, sys.stdout
    settings.setdefault("connect_timeout_s", cli.zk_timeout)
    # Its own ZooKeeper session, so that --session-timeout-ms applies to this member.
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # leave the group cleanly: commit, release, deregister
        signal.signal(sig, lambda *_: stopping.set())
    if consumer_id:
        protocol.validate_name(consumer_id, "consumer id")
    with Consumer(group, list(topics) or None, pattern, zk=cli.zk_connect, data_dir=cli.data_dir,
                  consumer_id=consumer_id, **settings) as c:
        last = time.monotonic()
        while (max_records is None or count < max_records) and not stopping.is_set():
            batch = c.poll(timeout_ms=200, max_records=None if max_records is None else max_records - count)
            if not batch:
                if c.group_metadata().generation < 0:
                    last = time.monotonic()  # idle time counts from the first assignment
                elif idle_exit and time.monotonic() - last > idle_exit:
                    break
                continue
            meta = {"member": c.consumer_id, "generation": c.group_metadata().generation, "at": time.time()} \
                if with_metadata else {}
            lines = []
            for tp, records in batch.items():
                for r in records:
                    lines.append(json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                             "key": _text(r.key), "value": _text(r.value), **meta}))
            out.write("\n".join(lines) + "\n")
            out.flush()
            count += len(lines)
            last = time.monotonic()
            c.commit()  # after printing: at-least-once
    click.echo(f"consumed {count} records", err=True)


def _text(data: Optional[bytes]):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()

