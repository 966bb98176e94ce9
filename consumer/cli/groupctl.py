"""``groupctl``: administer zkgroups from the shell.

    groupctl topics create NAME [--partitions N] [--replication-factor N] [--if-not-exists]
    groupctl topics list [--output json]
    groupctl topics describe NAME [--output json]
    groupctl topics add-partitions NAME --to N
    groupctl produce TOPIC [-f FILE] [--key K | --key-separator SEP] [--partition P]
    groupctl produce TOPIC --generate N [--size B]
    groupctl acl apply [--coordinator IDENTITY] [--group GROUP=IDENTITY ...] [--world-read/--no-world-read]
    groupctl acl check
    groupctl share-groups list | describe | configure | reset-offsets | delete   (consumer.cli.share)
    groupctl share-consume GROUP TOPIC...

Global options (``--zk``, ``--zk-auth``, ``--data-dir``, ``--bootstrap-servers``, ``--kafka-config``,
``--zk-timeout``, ``-v``, ``--log-format``) come from :mod:`consumer.cli.context`; the error handling from
:mod:`coordinator.cli.common`: every failure is one line on stderr, ``error: ...``, exit status
1 (2 for usage errors, 75 for one that may go away by itself: ZooKeeper or Kafka unreachable).
Numbers are range-checked before anything is allocated: at most :data:`~coordinator.protocol.cluster.MAX_PARTITIONS`
partitions per topic, values of at most :data:`MAX_VALUE_BYTES`. Names are checked before any
path is built.

With ``--bootstrap-servers`` (or ``KAFKA_BOOTSTRAP_SERVERS``) the topic commands and ``produce``
work on Kafka: topics, partitions, offsets and leaders come from Kafka's metadata, ``create``
and ``add-partitions`` are Kafka's CreateTopics and CreatePartitions (bounded by
``--zk-timeout``), ``produce`` is the Kafka producer. The groups commands keep offsets in
ZooKeeper either way and read end offsets from the data plane.

Read commands take ``--output json`` (:data:`coordinator.cli.common.OUTPUT_OPTION`): one JSON
document on stdout with the field names of the docs' output reference, the same rows as the table.

Adding commands: decorate a function with ``@main.command()`` (or ``@main.group()`` for a
family like ``topics``) and take the shared context with ``@pass_cli``.
"""
from __future__ import annotations

import sys
import time
from itertools import islice
from typing import BinaryIO, Iterator, List, Optional, Tuple

import click
from click.core import ParameterSource

from consumer.log import FSYNC_POLICIES
from consumer.producer import Producer
from consumer.cli import acls, groups, share
from consumer.cli.context import CliContext, global_options, pass_cli
from consumer.records import TopicPartition
from coordinator import documents, protocol
from coordinator.cli.common import (OUTPUT_OPTION, CliError, CliGroup, CliUsageError, Limited, print_json, print_table,
                                    version_option)
from coordinator.errors import CorruptZnode, InvalidPartitions, TopicExists

#: --generate shows a progress bar when stderr is a terminal, or for at least this many records.
PROGRESS_MIN_RECORDS = 1_000_000
#: Largest value ``produce`` writes (a line of input, or --size): Kafka's default maximum
#: message size (message.max.bytes, ~1 MiB).
MAX_VALUE_BYTES = 1 << 20
PARTITION_COUNT = Limited(1, protocol.MAX_PARTITIONS, "the most partitions a topic may have")  # option type
_CHUNK = 10_000  # records between progress updates


@click.group(cls=CliGroup)
@global_options
@version_option
def main() -> None:
    """Administer zkgroups: topics and their data."""


# ---------------------------------------------------------------- topics

@main.group()
def topics() -> None:
    """Create, list, describe and grow topics."""


@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=PARTITION_COUNT, default=1, show_default=True,
              help=f"Number of partitions (at most {protocol.MAX_PARTITIONS:,}).")
@click.option("--replication-factor", type=click.IntRange(min=1), metavar="N",
              help="Kafka only: copies of each partition (default: the brokers' default.replication.factor).")
@click.option("--if-not-exists", is_flag=True, help="Succeed if the topic already exists.")
@pass_cli
def topics_create(cli: CliContext, name: str, partitions: int, replication_factor: Optional[int],
                  if_not_exists: bool) -> None:
    """Create topic NAME (on Kafka: through Kafka's CreateTopics)."""
    protocol.validate_name(name)
    if replication_factor is not None and not cli.on_kafka:
        raise CliUsageError("--replication-factor is for Kafka (the embedded log keeps one copy)")
    try:
        if cli.on_kafka:
            cli.data_plane.create_topic(name, partitions, replication_factor or -1)
        else:
            cli.topics.create(name, partitions)
    except TopicExists:
        if not if_not_exists:
            raise
        click.echo(f"topic {name} already exists with {cli.partition_count(name)} partitions")
        return
    if not cli.on_kafka:
        cli.make_partition_dirs(name, range(partitions))
    click.echo(f"created topic {name} with {partitions} partition{'s' * (partitions != 1)}")


@topics.command("list")
@OUTPUT_OPTION
@pass_cli
def topics_list(cli: CliContext, output: str) -> None:
    """List topics and their partition counts (on Kafka: from Kafka's metadata)."""
    if cli.on_kafka:
        found = [documents.topic_row(name, count) for name, count in sorted(cli.data_plane.partition_counts().items())]
    else:
        found = _registered_topics(cli.topics)
    if output == "json":
        print_json({"topics": found})
    elif found:
        print_table(("TOPIC", "PARTITIONS"), [(t["topic"], "?" if t["partitions"] is None else t["partitions"])
                                              for t in found])
    else:
        click.echo("no topics", err=True)


def _registered_topics(registry) -> List[dict]:
    """Every topic of the registry: {topic, partitions, error}; an unreadable one is a warning
    (its partitions None, the problem in error) and the others are still listed."""
    names = registry.list()
    counts = registry.all_partitions()
    found = []
    for name in names:
        problem = None
        if name not in counts:  # unreadable: say why, keep listing the others
            try:
                registry.partitions(name)
            except CorruptZnode as e:
                click.echo(f"warning: {e}", err=True)
                problem = e.problem
        found.append(documents.topic_row(name, counts.get(name), problem))
    return found


@topics.command("describe")
@click.argument("name")
@OUTPUT_OPTION
@pass_cli
def topics_describe(cli: CliContext, name: str, output: str) -> None:
    """Show each partition of NAME: offsets and record count; bytes on disk (embedded log) or
    leader broker (Kafka)."""
    protocol.validate_name(name)
    partitions = cli.partition_count(name)
    cli.warn_if_no_data(name, range(partitions))
    plane = cli.data_plane
    tps = [TopicPartition(name, p) for p in range(partitions)]
    earliest, latest = plane.earliest_offsets(tps), plane.latest_offsets(tps)
    leaders = plane.partition_leaders(name) if cli.on_kafka else {}
    log = None if cli.on_kafka else cli.log()
    rows = [documents.topic_partition_row(tp.partition, earliest[tp], latest[tp],
                                          None if log is None else log.size_bytes(name, tp.partition),
                                          leaders.get(tp.partition, -1) if cli.on_kafka else None) for tp in tps]
    if output == "json":
        print_json({"topic": name, "data_plane": plane.name, "partitions": rows})
        return
    plural = "s" * (partitions != 1)
    if cli.on_kafka:
        click.echo(f"topic {name}: {partitions} partition{plural} ({plane.describe()})")
        columns = ("PARTITION", "LEADER", "EARLIEST", "LATEST", "RECORDS")
    else:
        click.echo(f"topic {name}: {partitions} partition{plural} (data in {cli.data_dir})")
        columns = ("PARTITION", "EARLIEST", "LATEST", "RECORDS", "BYTES")
    print_table(columns, [[row[c.lower()] for c in columns] for row in rows])


@topics.command("add-partitions")
@click.argument("name")
@click.option("--to", "total", type=PARTITION_COUNT, required=True, metavar="N",
              help=f"The new total number of partitions (at most {protocol.MAX_PARTITIONS:,}).")
@pass_cli
def topics_add_partitions(cli: CliContext, name: str, total: int) -> None:
    """Grow topic NAME to N partitions (partitions are never removed; on Kafka: CreatePartitions)."""
    protocol.validate_name(name)
    before = cli.partition_count(name)
    if cli.on_kafka:
        if total < before:
            raise InvalidPartitions(f"topic {name!r} has {before} partitions; partitions are never removed")
        if total > before:
            cli.data_plane.create_partitions(name, total)
    else:
        cli.topics.add_partitions(name, total)
        cli.make_partition_dirs(name, range(before, total))
    if total == before:
        click.echo(f"topic {name} already has {total} partitions")
    else:
        click.echo(f"topic {name} now has {total} partitions (was {before})")


# ---------------------------------------------------------------- produce

@main.command()
@click.argument("topic")
@click.option("-f", "--file", "source", type=click.File("rb"),
              help="Read values from FILE, one per line (default: standard input).")
@click.option("--key", help="Key of every record (UTF-8).")
@click.option("--key-separator", metavar="SEP", help="Lines are KEY<SEP>VALUE.")
@click.option("--partition", type=Limited(0, protocol.MAX_PARTITIONS - 1, "the highest partition there can be"),
              help="Write to this partition (default: by key, else round robin).")
@click.option("--generate", type=click.IntRange(min=1), metavar="N",
              help="Produce N generated records instead of reading lines.")
@click.option("--size", type=Limited(1, MAX_VALUE_BYTES, "the largest record value"), default=100, show_default=True,
              metavar="B",
              help=f"Bytes per generated value (zero-padded sequence numbers; at most {MAX_VALUE_BYTES:,}).")
@click.option("--fsync", type=click.Choice(FSYNC_POLICIES), default="interval", show_default=True,
              help="When the embedded log syncs to disk (on Kafka the brokers' acks decide).")
@pass_cli
def produce(cli: CliContext, topic: str, source: Optional[BinaryIO], key: Optional[str],
            key_separator: Optional[str], partition: Optional[int], generate: Optional[int],
            size: int, fsync: str) -> None:
    """Append records to TOPIC: lines of FILE or stdin, or --generate N of them.

    Prints how many records were written and how fast. A line may hold at most 1 MiB.
    """
    if generate is not None and (source is not None or key_separator is not None):
        raise CliUsageError("--generate cannot be combined with --file or --key-separator")
    if key is not None and key_separator is not None:
        raise CliUsageError("--key and --key-separator are mutually exclusive")
    if cli.on_kafka and click.get_current_context().get_parameter_source("fsync") != ParameterSource.DEFAULT:
        raise CliUsageError("--fsync is for the embedded log; on Kafka durability is the brokers' "
                            "(acks, min.insync.replicas: set acks in --kafka-config)")
    protocol.validate_name(topic)
    cli.partition_count(topic)  # fail fast on an unknown or unreadable topic, before reading input
    fixed_key = key.encode() if key is not None else None
    if generate is not None:
        records = ((fixed_key, b"%0*d" % (size, i)) for i in range(generate))
    else:
        lines = _lines(source or sys.stdin.buffer)
        records = _split_keys(lines, key_separator.encode()) if key_separator else \
            ((fixed_key, line) for line in lines)

    started = time.perf_counter()
    # No result per record: a failed write is raised once, by a later send or the close.
    if cli.on_kafka:
        producer = Producer(bootstrap_servers=cli.bootstrap_servers, kafka=cli.kafka,
                            request_timeout_ms=int(cli.zk_timeout * 1000), futures=False)
    else:
        producer = Producer(cli.zk, log=cli.log(fsync=fsync), futures=False)
    with producer:
        if generate is not None and (sys.stderr.isatty() or generate >= PROGRESS_MIN_RECORDS):
            count = _send_with_progress(producer, topic, partition, records, generate)
        else:
            count = _send(producer, topic, partition, records)
    seconds = time.perf_counter() - started
    rate = count / seconds if seconds > 0 else 0.0
    click.echo(f"produced {count:,} records to {topic} in {seconds:.2f} s ({rate:,.0f} records/s)")


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of ``stream`` without their line ends; a line longer than MAX_VALUE_BYTES is
    an error once that much is read (input without newlines never fills memory)."""
    number = 0
    while True:
        line = stream.readline(MAX_VALUE_BYTES + 2)  # room for "\r\n"
        if not line:
            return
        number += 1
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if len(line) > MAX_VALUE_BYTES:
            raise CliError(f"line {number} is longer than {MAX_VALUE_BYTES:,} bytes (the largest record value)")
        yield line


def _split_keys(lines: Iterator[bytes], separator: bytes) -> Iterator[Tuple[bytes, bytes]]:
    for number, line in enumerate(lines, 1):
        key, found, value = line.partition(separator)
        if not found:
            raise click.ClickException(f"line {number} has no key separator {separator.decode()!r}")
        yield key, value


def _send(producer: Producer, topic: str, partition: Optional[int], records) -> int:
    count = 0
    send = producer.send
    for key, value in records:
        send(topic, value, key=key, partition=partition)
        count += 1
    return count


def _send_with_progress(producer: Producer, topic: str, partition: Optional[int], records, total: int) -> int:
    count = 0
    with click.progressbar(length=total, label=f"producing to {topic}", file=sys.stderr) as bar:
        while count < total:
            sent = _send(producer, topic, partition, islice(records, _CHUNK))
            if not sent:
                break
            count += sent
            bar.update(sent)
    return count


groups.register(main)  # coordinator, groups ..., consume
acls.register(main)    # acl apply, acl check
share.register(main)   # share-groups ..., share-consume

if __name__ == "__main__":
    main(prog_name="groupctl")
