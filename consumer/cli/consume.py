"""``groupctl consume``: a model consumer of a group::

    groupctl consume GROUP TOPIC... [--pattern REGEX] [--max-records N] [--idle-exit SECONDS] [--group-instance-id ID [--static-grace-ms MS]]
                     [--kafka-commit-offsets] [--log-format json]

``consume`` is a model consumer: it prints a batch, then commits exactly what it printed. A
refused commit (the partition moved to another member) is one warning and consumption goes on;
the new owner starts from the last commit that succeeded, so those records are delivered again
(at-least-once). While ZooKeeper is unreachable (a server failing over) it waits: ``poll()``
hands out nothing, and offsets not yet committed are committed once ZooKeeper is back. So it
does at its start: while it cannot connect it says so once per ``--zk-timeout`` and tries again
(SIGTERM or SIGINT then ends it, exit 0), and a connection lost while it joins is waited out
by the consumer itself. Any other
error of ``poll()`` (e.g. a damaged log) ends it with one line and exit status 1, after it left
the group cleanly. With ``--max-records`` and stderr a terminal (stdout not), it shows the
records so far on stderr.

On Kafka (``--bootstrap-servers``) it reads Kafka; with ``--kafka-commit-offsets`` it also copies
each commit to Kafka for Kafka's own tools, which changes nothing else.
"""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

import click

from coordinator import config as _config
from coordinator import protocol
from coordinator.assignors import STRATEGIES
from consumer.cli.context import CliContext, kafka_properties, pass_cli
from coordinator.cli.common import (LOG_FORMATS, MAX_MS, CliError, CliUsageError, Limited, Seconds,
                                    report, setup_logging, take_connect)
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import (CommitFailedError, InvalidConfig, UnknownTopic, ZkGroupsError,
                                ZooKeeperUnavailable)
from coordinator.kafka import check_bootstrap_servers
from coordinator.signals import on_stop_signals

log = logging.getLogger("zkgroups.groupctl")


@click.command()
@click.argument("group")
@click.argument("topics", nargs=-1)
@click.option("--pattern", help="Follow every topic matching this regex (instead of TOPICS).")
@click.option("--max-records", type=click.IntRange(min=1), help="Exit after this many records.")
@click.option("--idle-exit", type=Seconds(max=None), metavar="SECONDS",
              help="Exit after this long without a record (counted from joining the group, and again from "
                   "each new assignment).")
@click.option("--from-beginning/--from-end", default=True, show_default=True,
              help="Where to start when the group has no committed offset.")
@click.option("--session-timeout-ms", type=Limited(100, MAX_MS, "ZooKeeper's largest session timeout"),
              default=DEFAULT_SESSION_TIMEOUT_MS,
              show_default=True)
@click.option("--config", "config_file", type=click.Path(),
              help="TOML file of consumer settings ([consumer] table or top level; may set zk and data_dir).")
@click.option("--consumer-id", help="This member's id (default: <group>_<host>-<ms>-<8 hex>).")
@click.option("--group-instance-id",
              help="Be a static member with this instance id: restarted within the session timeout, it gets "
                   "its partitions back without a rebalance (consumer id <group>_static-<id>).")
@click.option("--static-grace-ms", type=click.IntRange(min=1),
              help="With --group-instance-id: how long its partitions wait for it once it is gone "
                   "(default: the session timeout).")
@click.option("--strategy", "strategies", multiple=True, type=click.Choice(sorted(STRATEGIES)),
              help="Assignment strategy this member supports; repeat in order of preference (default: sticky, then range).")
@click.option("--with-metadata", is_flag=True,
              help="Add to each line this member's id, its generation and when poll() handed the record out "
                   "(wall clock, seconds; the member owned the partition then).")
@click.option("--kafka-commit-offsets", is_flag=True,
              help="Kafka only: also copy each commit to Kafka (after ZooKeeper's), for Kafka's own tools.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS),
              help="Log lines as text or JSON objects (the same as groupctl's global --log-format).")
@click.option("--metrics-port", type=int, metavar="PORT",
              help="Serve this consumer's Prometheus metrics at http://HOST:PORT/metrics (0: any free port).")
@pass_cli
def consume(cli: CliContext, group: str, topics, pattern: Optional[str], max_records: Optional[int],
            idle_exit: Optional[float], from_beginning: bool, session_timeout_ms: int,
            config_file: Optional[str], consumer_id: Optional[str], group_instance_id: Optional[str],
            static_grace_ms: Optional[int], strategies, with_metadata: bool,
            kafka_commit_offsets: bool, log_format: Optional[str], metrics_port: Optional[int]) -> None:
    """Consume as a member of GROUP; print records as JSON lines and commit as it goes.

    A refused commit is a warning and consumption goes on (records may be delivered again); an
    unreachable ZooKeeper is waited for, at the start too; any other error ends it (exit 1)
    after leaving the group.
    """
    from consumer.consumer import Consumer
    if log_format is not None and log_format != cli.log_format:
        setup_logging(cli.verbose, log_format)
        cli.log_format = log_format
    _check_consume_names(group, topics, pattern, consumer_id, group_instance_id)
    zk_connect, data_dir, settings = _consumer_settings(cli, config_file)
    _add_kafka_settings(cli, settings, topics, kafka_commit_offsets)
    _add_member_settings(cli, settings, from_beginning=from_beginning, session_timeout_ms=session_timeout_ms,
                         group_instance_id=group_instance_id, static_grace_ms=static_grace_ms,
                         strategies=strategies, metrics_port=metrics_port)
    checked = _checked_consumer_config(settings, config_file)
    stopping, joining = stop_on_signals()
    committer = _Committer(group)
    # Its own ZooKeeper session, so that --session-timeout-ms applies to this member.
    c = join_waiting(lambda: Consumer(group, list(topics) or None, pattern, zk=zk_connect, data_dir=data_dir,
                                      listener=committer, consumer_id=consumer_id, kafka=cli.kafka, **settings),
                     zk_connect, checked.connect_timeout_s, joining)
    if c is None:
        report(f"stopped while waiting for ZooKeeper at {zk_connect}; consumed 0 records", "zkgroups.groupctl",
               group=group, records=0)
        return
    count = _consume_records(c, committer, group, max_records, idle_exit, with_metadata, stopping)
    report(f"consumed {count} records", "zkgroups.groupctl", group=group, records=count)


def _check_consume_names(group: str, topics, pattern: Optional[str], consumer_id: Optional[str],
                         group_instance_id: Optional[str]) -> None:
    """The names and the pattern ``consume`` was given are valid and not contradictory."""
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
    if group_instance_id:
        if consumer_id:
            raise CliUsageError("give --consumer-id or --group-instance-id, not both")
        protocol.static_consumer_id(group, group_instance_id)  # a valid name, before connecting


def _add_kafka_settings(cli: CliContext, settings: dict, topics, kafka_commit_offsets: bool) -> None:
    """Kafka's part of ``settings``: its brokers, and whether commits are copied there; Kafka
    reachable and the topics there, checked now."""
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


def _add_member_settings(cli: CliContext, settings: dict, *, from_beginning: bool, session_timeout_ms: int,
                         group_instance_id: Optional[str], static_grace_ms: Optional[int], strategies,
                         metrics_port: Optional[int]) -> None:
    """The member's part of ``settings`` from the options (the file's values win where the
    option has a default; a given option wins otherwise)."""
    settings.setdefault("auto_offset_reset", "earliest" if from_beginning else "latest")
    settings.setdefault("session_timeout_ms", session_timeout_ms)
    settings.setdefault("enable_auto_commit", False)
    settings.setdefault("connect_timeout_s", cli.zk_timeout)
    if group_instance_id:
        settings["group_instance_id"] = group_instance_id
    if static_grace_ms:
        if not settings.get("group_instance_id"):
            raise CliUsageError("--static-grace-ms needs --group-instance-id")
        settings["static_grace_ms"] = static_grace_ms
    if cli.zk_auth is not None:
        settings["zk_auth"] = cli.zk_auth
    if cli.zk_tls is not None:
        settings["zk_tls"] = cli.zk_tls
    if cli.zk_sasl is not None:
        settings["zk_sasl"] = cli.zk_sasl
    if strategies:
        settings["assignment_strategy"] = strategies
    if metrics_port is not None:
        settings["metrics_port"] = metrics_port


def _checked_consumer_config(settings: dict, config_file: Optional[str]):
    """``settings`` as a checked ConsumerConfig, before connecting (errors name the file)."""
    from consumer.consumer import ConsumerConfig
    checked = _config.build(ConsumerConfig, settings, config_file or "options")
    if checked.session_timeout_ms > MAX_MS:
        raise InvalidConfig(f"{config_file or 'options'}: session_timeout_ms must be at most {MAX_MS}")
    return checked


def stop_on_signals() -> Tuple[threading.Event, threading.Event]:
    """(stopping, joining): SIGTERM and SIGINT set ``stopping`` (the loop then leaves the group
    cleanly: commit, release, deregister) and, while ``joining`` is set, end the wait to join."""
    stopping, joining = threading.Event(), threading.Event()
    joining.set()

    def while_joining() -> None:
        if joining.is_set():   # no lock taken: is_set reads a flag
            raise StoppedWhileJoining()
    on_stop_signals(stopping.set, in_handler=while_joining)
    return stopping, joining


def _consume_records(c, committer: "_Committer", group: str, max_records: Optional[int],
                     idle_exit: Optional[float], with_metadata: bool, stopping: threading.Event) -> int:
    """Print and commit batches until ``max_records``, ``idle_exit`` or a stop, then leave the
    group (closing ``c``); how many records it printed."""
    count = 0
    progress = None
    if max_records and sys.stderr.isatty() and not sys.stdout.isatty():  # records so far, where a person looks
        progress = click.progressbar(length=max_records, label=f"consuming from group {group}", file=sys.stderr,
                                     show_pos=True)
    with c, (progress or contextlib.nullcontext()):
        committer.consumer = c
        if c.metrics_server is not None:
            report(f"metrics served at {c.metrics_server.url}", "zkgroups.groupctl", port=c.metrics_server.port)
        last, generation = time.monotonic(), c.group_metadata().generation
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
                meta = {"member": c.consumer_id, "generation": generation, "at": c.handed_out_at} \
                    if with_metadata else {}
                lines = _record_lines(batch, meta)
                print_text("\n".join(lines) + "\n")
                count += len(lines)
                if progress is not None:
                    progress.update(len(lines))
                last = time.monotonic()
                committer.commit()  # after printing: at-least-once
        finally:
            committer.commit()
    return count


def _record_lines(batch, meta: dict) -> List[str]:
    """A polled batch as ``consume``'s JSON lines, each with ``meta``'s fields."""
    return [json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                        "key": text_of(r.key), "value": text_of(r.value), **meta})
            for records in batch.values() for r in records]


class StoppedWhileJoining(KeyboardInterrupt):
    """SIGTERM or SIGINT while ``consume`` waits for ZooKeeper to join its group (raised by the
    signal handler, as SIGINT's KeyboardInterrupt is, since nothing else would end the wait)."""


def join_waiting(make, connect: str, interval: float, joining: threading.Event):
    """``make()``, the consumer, waiting out a ZooKeeper it cannot connect to: each attempt is
    bounded by its connect timeout (``interval``; a lost connection once connected the consumer
    waits out itself), one warning each. None if stopped by a signal meanwhile."""
    started, consumer = time.monotonic(), None
    try:
        while True:
            attempt = time.monotonic()
            try:
                consumer = make()
                joining.clear()
                return consumer
            except ZooKeeperUnavailable as e:
                log.warning("ZooKeeper at %s not reachable yet (%s; %.0f s so far); waiting", connect, e,
                            time.monotonic() - started, extra={"zk": connect, "reason": "ZooKeeper unreachable"})
            time.sleep(max(0.0, interval - (time.monotonic() - attempt)))
    except StoppedWhileJoining:
        if consumer is not None:  # the signal came just as it joined
            consumer.close()
        return None


def print_text(text: str) -> None:
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

    def __init__(self, group: str):
        self.group = group
        self.consumer = None
        self.last_warning = ""

    def commit(self, offsets=None) -> None:
        try:
            self.consumer.commit(offsets)
        except CommitFailedError as e:
            self._warn(f"{e}; consuming goes on (records since the last commit of those partitions will be "
                       "delivered again)", reason="commit refused")
            return
        except ZooKeeperUnavailable as e:
            self._warn(f"{e}; the commit waits for ZooKeeper, consuming goes on", reason="ZooKeeper unreachable")
            return
        if self.last_warning:
            self.last_warning = ""
            log.warning("offsets committed again", extra=self._fields())

    # ---- the consumer's rebalance listener (called inside poll() and close())

    def on_partitions_revoked(self, revoked) -> None:
        positions = _positions(self.consumer)
        self.commit({tp: positions[tp] for tp in revoked if tp in positions})

    def on_partitions_assigned(self, assigned) -> None:
        pass

    def on_partitions_lost(self, lost) -> None:
        self._warn(f"partitions {', '.join(sorted(map(str, lost)))} were lost (the ZooKeeper session ended); "
                   "consuming goes on (records printed since their last commit will be delivered again)",
                   partitions=sorted(f"{tp.topic}-{tp.partition}" for tp in lost), reason="session lost")

    def _warn(self, message: str, **fields) -> None:
        if message != self.last_warning:  # the same again (until a commit succeeds) is not news
            log.warning("%s", message, extra={**self._fields(), **fields})
        self.last_warning = message

    def _fields(self) -> dict:
        """The fields of this member's log lines (``--log-format json``)."""
        return {"group": self.group, "member": self.consumer.consumer_id if self.consumer else None}



def text_of(data: Optional[bytes]):
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()

