"""groupctl commands about the coordinator and consumer groups.

    groupctl coordinator
    groupctl groups list
    groupctl groups describe GROUP
    groupctl groups reset-offsets GROUP --topic T (--to-earliest|--to-latest|--to-offset N|--to-datetime ISO) [--execute]
    groupctl consume GROUP TOPIC... [--pattern REGEX] [--max-records N] [--idle-exit SECONDS]
                     [--kafka-commit-offsets]

On Kafka (``--bootstrap-servers``) committed offsets stay in ZooKeeper (``describe`` and
``reset-offsets`` read and write them there, compare-and-set as always); end offsets, lag and
reset targets come from Kafka's offsets. ``consume`` reads Kafka; with
``--kafka-commit-offsets`` it also copies each commit to Kafka for Kafka's own tools, which
changes nothing else.

``reset-offsets`` writes by compare-and-set: every offsets znode is read with its version and
written in one transaction that requires the same version (or creates a missing one), so a
concurrent change (a member's claim or commit, another reset) makes it fail and change nothing.

``consume`` is a model consumer: it prints a batch, then commits exactly what it printed. A
refused commit (the partition moved to another member) is one warning and consumption goes on;
the new owner starts from the last commit that succeeded, so those records are delivered again
(at-least-once). While ZooKeeper is unreachable (a server failing over) it waits: ``poll()``
hands out nothing, and offsets not yet committed are committed once ZooKeeper is back. Any other
error of ``poll()`` (e.g. a damaged log) ends it with one line and exit status 1, after it left
the group cleanly.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import click
from kazoo.exceptions import KazooException, NoNodeError

from coordinator import config as _config
from coordinator import protocol, read
from coordinator.assignors import STRATEGIES
from consumer.cli.context import CliContext, kafka_properties, pass_cli
from consumer.records import TopicPartition
from coordinator.cli.common import MAX_MS, CliError, CliUsageError, Limited, Seconds, print_table, take_connect
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import (CommitFailedError, CorruptZnode, InvalidConfig, UnknownTopic, ZkGroupsError,
                                ZooKeeperUnavailable)
from coordinator.kafka import check_bootstrap_servers
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
    main.add_command(consume)


# ---------------------------------------------------------------- coordinator

@click.command()
@pass_cli
def coordinator(cli: CliContext) -> None:
    """Show the leader, its epoch and the contenders."""
    zk = cli.zk
    info = read.leader(zk)
    if info is None:
        click.echo("leader: none")
    else:
        since = dt.datetime.fromtimestamp(info.since / 1000).isoformat(timespec="seconds")
        click.echo(f"leader: {info.node_id} (host {info.host}, pid {info.pid})")
        click.echo(f"epoch: {info.epoch}")
        click.echo(f"since: {since}")
        click.echo(f"verified all groups: {'yes' if read.all_verified(zk) else 'not yet'}")
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
    for group in read.groups(cli.zk):
        try:
            s = read.group_state(cli.zk, group)
            rows.append((group, s.state, s.generation, len(read.children(cli.zk, protocol.ids_path(group)))))
        except CorruptZnode as e:
            rows.append((group, f"unreadable ({e.problem})", "-", "-"))
    print_table(["GROUP", "STATE", "GENERATION", "MEMBERS"], rows)


@groups.command("describe")
@click.argument("group")
@pass_cli
def groups_describe(cli: CliContext, group: str) -> None:
    """State, members with streams, assignment, committed offset, end offset and lag."""
    zk = _existing_group(cli, group)
    s = read.group_state(zk, group)
    click.echo(f"group: {group}\nstate: {s.state}\ngeneration: {s.generation}\nstrategy: {s.strategy or '-'}")
    if s.error:
        click.echo(f"error: {s.error}")
    unreadable: Dict[str, str] = {}
    members = read.members(zk, group, unreadable)
    click.echo(f"members ({len(members) + len(unreadable)}):")
    for cid in sorted({**members, **unreadable}):
        if cid in unreadable:
            click.echo(f"  {cid}  (unreadable: {protocol.ids_path(group, cid)}: {unreadable[cid]})")
        else:
            reg = members[cid]
            click.echo(f"  {cid}  {reg.pattern} {json.dumps(reg.subscription)}  strategies={','.join(reg.strategies)}")
    assigned = [(topic, p) for topic in sorted(s.assignment) for p in sorted(s.assignment[topic])]
    problems: Dict[object, str] = {}
    committed = read.committed_offsets(zk, group, assigned, problems)
    ends: Dict[Tuple[str, int], int] = {}
    for topic in sorted(s.assignment):
        cli.warn_if_no_data(topic, s.assignment[topic])
        ends.update(_end_offsets(cli, topic, s.assignment[topic]))
    rows = []
    for topic, p in assigned:
        end = ends.get((topic, p), "-")
        stream, offset = s.assignment[topic][p], committed[(topic, p)]
        if (topic, p) in problems:
            rows.append((topic, p, stream, f"unreadable ({problems[(topic, p)]})", end, "-"))
        else:
            lag = "-" if offset is None or end == "-" else end - offset
            rows.append((topic, p, stream, "-" if offset is None else offset, end, lag))
    if rows:
        print_table(["TOPIC", "PARTITION", "STREAM", "COMMITTED", "END", "LAG"], rows)


def _end_offsets(cli: CliContext, topic: str, partitions) -> Dict[Tuple[str, int], int]:
    """The log end of each partition; a topic the data plane does not have is one warning (its
    ends show as "-")."""
    try:
        latest = cli.data_plane.latest_offsets([TopicPartition(topic, p) for p in partitions])
    except UnknownTopic:
        click.echo(f"warning: topic {topic} is not on {cli.data_plane.describe()}", err=True)
        return {}
    return {(tp.topic, tp.partition): offset for tp, offset in latest.items()}


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
    if to_datetime:
        try:
            when = dt.datetime.fromisoformat(to_datetime)
        except ValueError:
            raise CliUsageError(f"--to-datetime {to_datetime!r} is not ISO 8601") from None
        try:
            ts = int(when.timestamp() * 1000)
        except (ValueError, OverflowError, OSError):
            raise CliUsageError(f"--to-datetime {to_datetime!r} is out of range") from None
    protocol.validate_name(group, "group")
    protocol.validate_name(topic)
    zk = cli.zk
    partitions = cli.partition_count(topic)
    live = read.children(zk, protocol.ids_path(group))
    if live and execute:
        raise ZkGroupsError(f"group {group!r} has {len(live)} live members; stop them before resetting offsets")
    cli.warn_if_no_data(topic, range(partitions))
    plane = cli.data_plane
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    earliest, latest = plane.earliest_offsets(tps), plane.latest_offsets(tps)
    found = plane.offsets_for_times({tp: ts for tp in tps}) if to_datetime else {}
    targets: Dict[int, int] = {}
    for tp in tps:
        if to_earliest:
            target = earliest[tp]
        elif to_latest:
            target = latest[tp]
        elif to_offset is not None:
            target = max(earliest[tp], min(to_offset, latest[tp]))
        else:
            target = latest[tp] if found.get(tp) is None else found[tp]
        targets[tp.partition] = target
    current = read_offsets(zk, group, topic, range(partitions))
    print_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                [(topic, p, current[p].shown, targets[p]) for p in range(partitions)])
    if not execute:
        click.echo("dry run: nothing changed (add --execute to apply)")
        return
    write_offsets(zk, group, topic, targets, current)
    click.echo(f"reset {len(targets)} partitions of {topic}")


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


def read_offsets(zk, group: str, topic: str, partitions) -> Dict[int, StoredOffset]:
    """Every partition's offsets znode with its version (reads pipelined)."""
    reads = [(p, protocol.offsets_path(group, topic, p)) for p in partitions]
    pending = [(p, path, zk.get_async(path)) for p, path in reads]
    out = {}
    for p, path, result in pending:
        try:
            raw, stat = result.get()
        except NoNodeError:
            out[p] = StoredOffset(None, None)
            continue
        try:
            out[p] = StoredOffset(protocol.decode_offset(raw, path), stat.version)
        except CorruptZnode as e:
            out[p] = StoredOffset(None, stat.version, e.problem)  # a reset is how it gets repaired
    return out


def write_offsets(zk, group: str, topic: str, targets: Dict[int, int], stored: Dict[int, StoredOffset]) -> None:
    """Write ``targets`` in one transaction, each znode only if it is still as ``stored`` (same
    version, or still absent); otherwise nothing is written and ZkGroupsError says so."""
    zk.ensure_path(protocol.offsets_path(group, topic))
    t = zk.transaction()
    order = sorted(targets)
    for p in order:
        path, data = protocol.offsets_path(group, topic, p), protocol.encode_offset(targets[p])
        if stored[p].version is None:
            t.create(path, data)
        else:
            t.set_data(path, data, version=stored[p].version)
    try:
        commit(t)
    except TransactionFailed as e:
        raise ZkGroupsError(f"the committed offset of {topic}-{order[e.index]} in group {group!r} changed "
                            "while resetting; nothing was written (run the command again)") from None


@groups.command("delete")
@click.argument("group")
@pass_cli
def groups_delete(cli: CliContext, group: str) -> None:
    """Delete GROUP: committed offsets, state and channels (refused while it has live members)."""
    zk = _existing_group(cli, group)
    live = read.children(zk, protocol.ids_path(group))
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
    for child in read.children(zk, path):
        out.extend(_subtree(zk, f"{path}/{child}"))
    out.append(path)
    return out


# ---------------------------------------------------------------- consume

@click.command()
@click.argument("group")
@click.argument("topics", nargs=-1)
@click.option("--pattern", help="Follow every topic matching this regex (instead of TOPICS).")
@click.option("--max-records", type=click.IntRange(min=1), help="Exit after this many records.")
@click.option("--idle-exit", type=Seconds(max=None), metavar="SECONDS",
              help="Exit after this long without a record (counted from the start, and again from each new "
                   "assignment).")
@click.option("--from-beginning/--from-end", default=True, show_default=True,
              help="Where to start when the group has no committed offset.")
@click.option("--session-timeout-ms", type=Limited(100, MAX_MS, "ZooKeeper's largest session timeout"),
              default=DEFAULT_SESSION_TIMEOUT_MS,
              show_default=True)
@click.option("--config", "config_file", type=click.Path(),
              help="TOML file of consumer settings ([consumer] table or top level; may set zk and data_dir).")
@click.option("--consumer-id", help="This member's id (default: <group>_<host>-<ms>-<8 hex>).")
@click.option("--strategy", "strategies", multiple=True, type=click.Choice(sorted(STRATEGIES)),
              help="Assignment strategy this member supports; repeat in order of preference (default: range).")
@click.option("--with-metadata", is_flag=True,
              help="Add to each line this member's id, its generation and when poll() returned the record "
                   "(wall clock, seconds).")
@click.option("--kafka-commit-offsets", is_flag=True,
              help="Kafka only: also copy each commit to Kafka (after ZooKeeper's), for Kafka's own tools.")
@pass_cli
def consume(cli: CliContext, group: str, topics, pattern: Optional[str], max_records: Optional[int],
            idle_exit: Optional[float], from_beginning: bool, session_timeout_ms: int,
            config_file: Optional[str], consumer_id: Optional[str], strategies, with_metadata: bool,
            kafka_commit_offsets: bool) -> None:
    """Consume as a member of GROUP; print records as JSON lines and commit as it goes.

    A refused commit is a warning and consumption goes on (records may be delivered again); an
    unreachable ZooKeeper is waited for; any other error ends it (exit 1) after leaving the group.
    """
    from consumer.consumer import Consumer, ConsumerConfig
    started = time.monotonic()
    if bool(topics) == bool(pattern):
        raise CliUsageError("give TOPICS or --pattern (one of them)")
    protocol.validate_name(group, "group")
    for topic in topics:
        protocol.validate_name(topic)
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise CliUsageError(f"--pattern {pattern!r} is not a regular expression: {e}") from None
    if consumer_id:
        protocol.validate_name(consumer_id, "consumer id")
    zk_connect, data_dir, settings = _consumer_settings(cli, config_file)
    if kafka_commit_offsets:
        settings["kafka_commit_offsets"] = True
    if settings.get("kafka_commit_offsets") and not cli.on_kafka:
        raise CliUsageError("--kafka-commit-offsets needs Kafka (--bootstrap-servers)")
    if cli.on_kafka:
        settings["bootstrap_servers"] = cli.bootstrap_servers
        # Kafka reachable and the topics there: one line now rather than a silent wait.
        known = cli.data_plane.partition_counts(topics or None)
        for topic in topics:
            if topic not in known:
                raise UnknownTopic(topic)
    settings.setdefault("auto_offset_reset", "earliest" if from_beginning else "latest")
    settings.setdefault("session_timeout_ms", session_timeout_ms)
    settings.setdefault("enable_auto_commit", False)
    settings.setdefault("connect_timeout_s", cli.zk_timeout)
    if strategies:
        settings["assignment_strategy"] = strategies
    checked = _config.build(ConsumerConfig, settings, config_file or "options")  # names the file; before connecting
    if checked.session_timeout_ms > MAX_MS:
        raise InvalidConfig(f"{config_file or 'options'}: session_timeout_ms must be at most {MAX_MS}")
    count = 0
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # leave the group cleanly: commit, release, deregister
        signal.signal(sig, lambda *_: stopping.set())
    committer = _Committer()
    # Its own ZooKeeper session, so that --session-timeout-ms applies to this member.
    with Consumer(group, list(topics) or None, pattern, zk=zk_connect, data_dir=data_dir, listener=committer,
                  consumer_id=consumer_id, kafka=cli.kafka, **settings) as c:
        committer.consumer = c
        last, generation = started, c.group_metadata().generation
        try:
            while (max_records is None or count < max_records) and not stopping.is_set():
                batch = _poll(c, None if max_records is None else max_records - count)
                if c.group_metadata().generation != generation:  # a new assignment: idle time starts over
                    generation, last = c.group_metadata().generation, time.monotonic()
                if not batch:
                    committer.commit()  # one that waited for ZooKeeper goes through once it answers
                    if idle_exit and time.monotonic() - last > idle_exit:
                        break
                    continue
                meta = {"member": c.consumer_id, "generation": generation, "at": time.time()} \
                    if with_metadata else {}
                lines = []
                for tp, records in batch.items():
                    for r in records:
                        lines.append(json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                                 "key": _text(r.key), "value": _text(r.value), **meta}))
                _print("\n".join(lines) + "\n")
                count += len(lines)
                last = time.monotonic()
                committer.commit()  # after printing: at-least-once
        finally:
            committer.commit()
    click.echo(f"consumed {count} records", err=True)


def _print(text: str) -> None:
    """Write all of ``text`` to stdout. An unbuffered stdout (``python -u``) is a raw file whose
    write may take only part of the data (a signal arrives while the pipe is full), and the
    text layer would drop the rest: write the bytes until every one is out."""
    stream = getattr(sys.stdout, "buffer", None)
    if stream is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    sys.stdout.flush()
    data = memoryview(text.encode("utf-8"))
    while data:
        data = data[stream.write(data):]
    stream.flush()


def _poll(c, max_records: Optional[int]):
    """One poll; an error it raises (for a partition, e.g. a damaged log) ends ``consume``."""
    try:
        return c.poll(timeout_ms=200, max_records=max_records)
    except ZkGroupsError:
        raise
    except Exception as e:
        raise CliError(f"consuming failed: {type(e).__name__}: {e}") from None


def _positions(c) -> Dict[object, int]:
    out = {}
    for tp in c.assignment():
        try:
            out[tp] = c.position(tp)
        except (KeyError, ZkGroupsError):  # not fetched yet
            continue
    return out


def _consumer_settings(cli: CliContext, config_file: Optional[str]) -> Tuple[str, str, dict]:
    """(zk, data_dir, consumer settings): ``zk``, ``data_dir`` and ``bootstrap_servers`` from
    the file unless given on the command line or in the environment. The file's ``[kafka]``
    properties (a table in ``[consumer]``) go to ``cli.kafka``; ``--kafka-config``'s win."""
    if not config_file:
        return cli.zk_connect, cli.data_dir, {}
    settings = dict(_config.load_toml(config_file, "consumer"))
    zk = take_connect(settings, config_file)
    data_dir = _config.take(settings, "data_dir", str, config_file)
    servers = _config.take(settings, "bootstrap_servers", str, config_file)
    kafka = _config.take(settings, "kafka", dict, config_file)
    if zk is None or "zk" in cli.given:
        zk = cli.zk_connect
    if data_dir is None or "data_dir" in cli.given:
        data_dir = cli.data_dir
    if servers and not cli.on_kafka:
        try:
            cli.bootstrap_servers = check_bootstrap_servers(servers)
        except InvalidConfig as e:
            raise InvalidConfig(f"{config_file}: {e}") from None
    cli.kafka = {**kafka_properties(kafka or {}, config_file), **cli.kafka}
    return zk, data_dir, settings


class _Committer:
    """Commits the positions of what ``consume`` printed (the consumer's own positions: they
    belong to the partitions it owns now, and its commits are fenced, so nothing it commits can
    overwrite a newer owner's offset). A refused commit or an unreachable ZooKeeper is one
    warning and consuming goes on; repeats of the same warning are not printed. It is also the
    rebalance listener: revoked partitions are committed before they are released. Every call
    comes from the consuming thread."""

    def __init__(self):
        self.consumer = None
        self.last_warning = ""

    def commit(self, offsets=None) -> None:
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as e:
            self._warn(f"{e}; consuming goes on (records since the last commit of those partitions will be "
                       "delivered again)")
            return
        except ZooKeeperUnavailable as e:
            self._warn(f"{e}; the commit waits for ZooKeeper, consuming goes on")
            return
        if self.last_warning:
            self.last_warning = ""
            log.warning("offsets committed again")

    # ---- the consumer's rebalance listener (called inside poll() and close())

    def on_partitions_revoked(self, revoked) -> None:
        positions = _positions(self.consumer)
        self.commit({tp: positions[tp] for tp in revoked if tp in positions})

    def on_partitions_assigned(self, assigned) -> None:
        pass

    def on_partitions_lost(self, lost) -> None:
        self._warn(f"partitions {', '.join(sorted(map(str, lost)))} were lost (the ZooKeeper session ended); "
                   "consuming goes on (records printed since their last commit will be delivered again)")

    def _warn(self, message: str) -> None:
        if message != self.last_warning:  # the same again (until a commit succeeds) is not news
            log.warning("%s", message)
        self.last_warning = message



def _text(data: Optional[bytes]):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()

