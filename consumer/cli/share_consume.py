"""``groupctl share-consume``: a model worker of a share group (:class:`consumer.share.ShareConsumer`
in explicit mode)::

    groupctl share-consume GROUP TOPIC... [--process-ms N] [--reject-when FIELD=TEXT]...
                           [--release-when FIELD=TEXT]... [--release-delay-ms N]
                           [--idle-exit SECONDS] [--max-records N] [--max-poll-records N]

It prints each record it was given as one JSON line — ``topic``, ``partition``, ``offset``,
``key``, ``value`` (UTF-8 text, else ``base64:...``), ``delivery_count`` and the
``acknowledgement`` it then gives the record — after "processing" it for ``--process-ms``.
A record is ACCEPTed unless a rule matches it: ``--reject-when FIELD=TEXT`` (FIELD is ``key``
or ``value``) REJECTs a record whose key or value text equals TEXT exactly (it is archived, and
written to the group's dead-letter topic if it has one); ``--release-when FIELD=TEXT`` RELEASEs
it (delivered again, after ``--release-delay-ms`` or the group's backoff, up to the group's
delivery limit, then archived). Both options repeat; a reject rule wins over a release rule.
Acknowledgements go with the next poll; one that arrives after the record's lock ended is
refused: one warning line, and the record is delivered again (to this worker or another).

``--idle-exit S`` ends it (exit 0) after S seconds without a record, ``--max-records N`` after
N records. SIGTERM or SIGINT ends it cleanly: the acknowledgements given are sent, the records
of the last poll not yet printed are released (delivered again, to any member; this delivery
counts toward the group's delivery limit), and it leaves the group; exit 0. While ZooKeeper cannot be reached at the start it waits, as
``groupctl consume`` does (:mod:`consumer.cli.consume`).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import List, Optional, Sequence, Tuple

import click

from consumer.cli.consume import join_waiting, print_text, stop_on_signals, text_of
from consumer.cli.context import CliContext, pass_cli
from coordinator import protocol
from coordinator.cli.common import MAX_MS, CliError, CliUsageError, Limited, Seconds, report
from coordinator.config import DEFAULT_SESSION_TIMEOUT_MS
from coordinator.errors import ZkGroupsError, ZooKeeperUnavailable
from coordinator.share_partition import AcknowledgeType

log = logging.getLogger("zkgroups.groupctl")

#: The fields a rule may look at.
RULE_FIELDS = ("key", "value")
#: How the summary line names what became of the records.
PAST = {AcknowledgeType.ACCEPT: "accepted", AcknowledgeType.REJECT: "rejected", AcknowledgeType.RELEASE: "released"}
#: (field, text): a rule of --reject-when / --release-when.
Rule = Tuple[str, str]


def parse_rules(specs: Sequence[str], option: str) -> List[Rule]:
    """``FIELD=TEXT`` options as rules; a malformed one is a usage error."""
    rules = []
    for spec in specs:
        field, eq, text = spec.partition("=")
        if not eq or field not in RULE_FIELDS:
            raise CliUsageError(f"{option} takes key=TEXT or value=TEXT, not {spec[:60]!r}")
        rules.append((field, text))
    return rules


def matches(record, rules: Sequence[Rule]) -> bool:
    """Whether the key or value text of ``record`` equals the text of one of ``rules``."""
    return any(text_of(getattr(record, field)) == text for field, text in rules)


def acknowledgement(record, reject: Sequence[Rule], release: Sequence[Rule]) -> AcknowledgeType:
    if matches(record, reject):
        return AcknowledgeType.REJECT
    if matches(record, release):
        return AcknowledgeType.RELEASE
    return AcknowledgeType.ACCEPT


@click.command("share-consume")
@click.argument("group")
@click.argument("topics", nargs=-1, required=True)
@click.option("--process-ms", type=Limited(0, 3_600_000, "an hour"), default=0, show_default=True,
              help="Work this long on each record (a sleep) before acknowledging it.")
@click.option("--reject-when", "reject_specs", multiple=True, metavar="FIELD=TEXT",
              help="REJECT records whose key or value (FIELD) text equals TEXT; repeatable.")
@click.option("--release-when", "release_specs", multiple=True, metavar="FIELD=TEXT",
              help="RELEASE records whose key or value (FIELD) text equals TEXT (delivered again); repeatable.")
@click.option("--release-delay-ms", type=Limited(0, 3_600_000, "an hour"), default=0, show_default=True,
              help="With --release-when: not delivered again before this (0: the group's backoff).")
@click.option("--idle-exit", type=Seconds(max=None), metavar="SECONDS",
              help="Exit after this long without a record (counted from joining, and from each record).")
@click.option("--max-records", type=click.IntRange(min=1), help="Exit after this many records.")
@click.option("--max-poll-records", type=Limited(1, 100_000, "the most a poll may return"), default=500,
              show_default=True, help="Records one poll acquires at most (their locks start together).")
@click.option("--session-timeout-ms", type=Limited(100, MAX_MS, "ZooKeeper's largest session timeout"),
              default=DEFAULT_SESSION_TIMEOUT_MS, show_default=True)
@pass_cli
def share_consume(cli: CliContext, group: str, topics: Tuple[str, ...], process_ms: int,
                  reject_specs: Tuple[str, ...], release_specs: Tuple[str, ...], release_delay_ms: int,
                  idle_exit: Optional[float], max_records: Optional[int], max_poll_records: int,
                  session_timeout_ms: int) -> None:
    """Work as a member of share group GROUP on TOPICS: print each record as a JSON line (with its
    delivery count and the acknowledgement it gets), then acknowledge it.

    Records are accepted, or rejected / released by --reject-when / --release-when (FIELD=TEXT:
    the record's key or value text equals TEXT). SIGTERM or SIGINT: send what was acknowledged,
    release the rest, leave the group, exit 0.
    """
    from consumer.share import ShareConsumer
    protocol.validate_name(group, "group")
    for topic in topics:
        protocol.validate_name(topic)
    reject, release = parse_rules(reject_specs, "--reject-when"), parse_rules(release_specs, "--release-when")
    if release_delay_ms and not release:
        raise CliUsageError("--release-delay-ms needs --release-when")
    stopping, joining = stop_on_signals()
    c = join_waiting(lambda: ShareConsumer(
        group, list(topics), zk=cli.zk_connect, data_dir=None if cli.on_kafka else cli.data_dir,
        bootstrap_servers=cli.bootstrap_servers, kafka=cli.kafka, share_acknowledgement_mode="explicit",
        max_poll_records=max_poll_records, acknowledgement_commit_callback=_warn_refused,
        client_id="groupctl-share-consume", session_timeout_ms=session_timeout_ms,
        connect_timeout_s=cli.zk_timeout, zk_auth=cli.zk_auth, zk_tls=cli.zk_tls, zk_sasl=cli.zk_sasl),
        cli.zk_connect, cli.zk_timeout, joining)
    if c is None:
        report(f"stopped while waiting for ZooKeeper at {cli.zk_connect}; consumed 0 records", "zkgroups.groupctl",
               group=group, records=0)
        return
    worker = _Worker(c, reject, release, release_delay_ms, process_ms / 1000, stopping)
    with c:
        worker.run(max_records, idle_exit)
    counts = ", ".join(f"{n} {PAST[kind]}" for kind, n in worker.counts.items() if n)
    report(f"consumed {worker.count} records" + (f" ({counts})" if counts else ""), "zkgroups.groupctl",
           group=group, records=worker.count)


def _warn_refused(partitions, error) -> None:
    """The acknowledgement commit callback: a refusal is one warning (the records come again)."""
    if error is not None:
        log.warning("%s", error)


class _Worker:
    """The poll, print, acknowledge loop (one thread: the command's; a signal only sets ``stopping``)."""

    def __init__(self, consumer, reject: Sequence[Rule], release: Sequence[Rule], release_delay_ms: int,
                 process_s: float, stopping: threading.Event):
        self.consumer, self.reject, self.release = consumer, reject, release
        self.release_delay_ms, self.process_s, self.stopping = release_delay_ms, process_s, stopping
        self.count = 0
        self.counts = {kind: 0 for kind in PAST}

    def run(self, max_records: Optional[int], idle_exit: Optional[float]) -> None:
        last = time.monotonic()
        while (max_records is None or self.count < max_records) and not self.stopping.is_set():
            records = self._poll(None if max_records is None else max_records - self.count)
            if not records:
                if idle_exit and time.monotonic() - last > idle_exit:
                    break
                continue
            for record in records:
                if self.process_s and self.stopping.wait(self.process_s):
                    return   # stopped while working on it: released by the close, not printed
                if self.stopping.is_set():
                    return
                self._handle(record)
            last = time.monotonic()

    def _handle(self, record) -> None:
        kind = acknowledgement(record, self.reject, self.release)
        print_text(json.dumps({"topic": record.topic, "partition": record.partition, "offset": record.offset,
                               "key": text_of(record.key), "value": text_of(record.value),
                               "delivery_count": record.delivery_count, "acknowledgement": kind.value}) + "\n")
        delay = self.release_delay_ms if kind is AcknowledgeType.RELEASE else 0
        self.consumer.acknowledge(record, kind, delay_ms=delay)
        self.count += 1
        self.counts[kind] += 1

    def _poll(self, max_records: Optional[int]):
        """One poll; ZooKeeper away is a warning (it is tried again), any other error ends the command."""
        try:
            return self.consumer.poll(timeout_ms=200, max_records=max_records)
        except ZooKeeperUnavailable as e:
            log.warning("%s; waiting for ZooKeeper", e)
            return []
        except ZkGroupsError:
            raise
        except Exception as e:
            raise CliError(f"consuming failed: {type(e).__name__}: {e}") from None
