"""The clock of a node's share groups: locks that end, delays that end, members that left.

Time in a share group is judged by one decider, by its own monotonic clock — never by comparing
the clocks of two hosts. That decider is the node leading the group's shard (the same node that
would rebalance a consumer group of that name). For each share-partition of the groups it leads,
it starts a lock's clock the first time it sees the lock's token (and again whenever the holder
renews it), and when ``share.record.lock.duration.ms`` has passed on it, releases the records
(:func:`~coordinator.share_partition.expire`: delivered again, delayed by the group's backoff,
or archived at the delivery limit). A delayed range is promoted once its delay has passed on the
same clock. A token whose holder's member znode is gone (closed, or its session expired) is
released at once. Every write is one transaction that checks the shard's epoch and the
share-partition's version (:func:`~coordinator.fencing.fenced`): a deposed decider writes
nothing, and a member's write in between makes the decider look again.

A node that takes a shard over starts every clock afresh: a lock may last up to one lock
duration longer across a failover, never shorter (the member that holds it is never cut short).

How it looks: every ``tick_s`` (100 ms) it reads the states of the share groups it leads, a
pipelined read per partition — so an acquisition is timed within a tick of its write, and a
lock ends within a tick of its duration.

States (:class:`DeciderState`): NEW --start()--> RUNNING --stop()--> STOPPED (NEW --stop()--> STOPPED).

Threads: its own thread does everything (reads, clocks, writes); ``start``/``stop``/``report``
from any thread (``report`` reads one dict reference replaced whole).
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

from kazoo.exceptions import KazooException, NoNodeError

from coordinator import read
from coordinator import share_partition as rules
from coordinator.errors import CorruptZnode, InvalidName
from coordinator.fencing import Deposed, fenced, fenced_commit
from coordinator.lifecycle import Lifecycle
from coordinator.protocol import validate_name
from coordinator.protocol.share import (SHARE_GROUPS, ShareGroupConfig, SharePartitionState, share_group_path,
                                        share_members_path, share_partitions_path)
from coordinator.zkclient import TransactionFailed

log = logging.getLogger("zkgroups.coordinator")

TICK_S = 0.1
#: A tick that failed (ZooKeeper away) is tried again after this.
ERROR_WAIT_S = 1.0


def _is_name(group: str) -> bool:
    try:
        validate_name(group, "group")
        return True
    except InvalidName:
        return False


class DeciderState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class ShareDecider(Lifecycle[DeciderState]):
    """Decides time for the share groups of the shards ``terms`` holds (see the module docstring)."""

    TRANSITIONS = {DeciderState.NEW: {DeciderState.RUNNING, DeciderState.STOPPED},
                   DeciderState.RUNNING: {DeciderState.STOPPED}, DeciderState.STOPPED: set()}

    def __init__(self, client, terms, metrics=None, tick_s: float = TICK_S):
        super().__init__(DeciderState.NEW)
        self.client, self.terms, self.metrics, self.tick_s = client, terms, metrics, tick_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._locks: Dict[Tuple[str, str, int], Dict[int, Tuple[int, float]]] = {}  # token -> (renewals, deadline)
        self._delays: Dict[Tuple[str, str, int], Dict[Tuple[int, int], float]] = {}  # (first, token) -> deadline
        self._report: Dict[str, Dict[str, int]] = {}
        self._said: Dict[str, str] = {}   # what was said of a bad znode (said again only if it changes)

    def start(self) -> "ShareDecider":
        if self._start_once(DeciderState.RUNNING):
            self._thread = threading.Thread(target=self._run, name="zkgroups-share-decider", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if not self._set_state(DeciderState.STOPPED):
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def report(self) -> Dict[str, Dict[str, int]]:
        """{share group: {range state: records}} of the groups it decided for at its last tick."""
        return self._report

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
                wait = self.tick_s
            except (KazooException, TransactionFailed) as e:
                log.warning("share groups: a tick failed (%s); looking again in %.0f s", repr(e), ERROR_WAIT_S)
                wait = ERROR_WAIT_S
            except Exception:  # a bug must not stop the clocks of every group
                log.exception("share groups: a tick failed")
                wait = ERROR_WAIT_S
            self._stop.wait(wait)

    def _tick(self) -> None:
        try:
            groups = self.client.get_children(SHARE_GROUPS)
        except NoNodeError:
            groups = []
        report = {}
        for group in groups:
            if not _is_name(group):
                self._say_once(group, f"share group {group[:60]!r} has a name zkgroups does not accept; it is left alone")
                continue
            term = self.terms.of(group)
            if term is None or not term.active:
                self._forget(group)
                continue
            try:
                report[group] = self._decide(group, term)
            except Deposed:
                self._forget(group)
            except CorruptZnode as e:
                self._say_once(e.path, f"share group {group}: {e}; it waits until the znode is repaired")
        for gone in set(k[0] for k in self._locks) - set(report):
            self._forget(gone)
        self._report = report

    def _say_once(self, key: str, line: str) -> None:
        """An error line, once per thing and problem (the loop looks every tick)."""
        if self._said.get(key) != line:
            self._said[key] = line
            log.error("%s", line)

    def _forget(self, group: str) -> None:
        for clocks in (self._locks, self._delays):
            for key in [k for k in clocks if k[0] == group]:
                del clocks[key]

    # ------------------------------------------------------------ one group

    def _decide(self, group: str, term) -> Dict[str, int]:
        """Read the group's share-partitions (then its members: a holder was registered before it
        acquired), and write each one whose clocks say so."""
        config = self._config(group)
        partitions = self._partitions(group)
        reads = [(tp, self.client.get_async(share_partitions_path(group, *tp))) for tp in partitions]
        states = []
        for tp, answer in reads:
            try:
                raw, stat = answer.get()
            except NoNodeError:
                continue
            try:
                states.append((tp, SharePartitionState.decode(raw, share_partitions_path(group, *tp)), stat.version))
            except CorruptZnode as e:
                self._say_once(e.path, f"share group {group}: {e}; that partition waits until it is repaired")
        members = set(read.children(self.client, share_members_path(group)))
        totals: Dict[str, int] = {}
        for tp, state, version in states:
            if self._judge(group, tp, state, members, config):
                self._write(group, tp, state, version, term)
            for s, n in rules.counts(state).items():
                totals[s] = totals.get(s, 0) + n
        return totals

    def _config(self, group: str) -> ShareGroupConfig:
        path = share_group_path(group)
        try:
            return ShareGroupConfig.decode(self.client.get(path)[0], path)
        except NoNodeError:
            return ShareGroupConfig()

    def _partitions(self, group: str) -> List[Tuple[str, int]]:
        base = share_partitions_path(group)
        try:
            topics = self.client.get_children(base)
        except NoNodeError:
            return []
        answers = [(t, self.client.get_children_async(f"{base}/{t}")) for t in topics]
        out = []
        for topic, answer in answers:
            try:
                out += [(topic, int(p)) for p in answer.get() if p.isdigit()]
            except NoNodeError:
                pass
        return out

    def _judge(self, group: str, tp, state: SharePartitionState, members, config: ShareGroupConfig) -> bool:
        """Apply what the clocks say to ``state``; True if it changed."""
        now = time.monotonic()
        key = (group, *tp)
        locks = self._locks.setdefault(key, {})
        held_before = set(state.held)   # clocks of tokens expired now live on until the write is made
        changed = False
        for token, (holder, renewals) in list(state.held.items()):
            seen = locks.get(token)
            if holder not in members:
                self._count(group, "released_member_gone", rules.expire(state, token, config))
                changed = True
            elif seen is None or seen[0] != renewals:
                locks[token] = (renewals, now + config.lock_duration_ms / 1000)
            elif now >= seen[1]:
                self._count(group, "lock_expired", rules.expire(state, token, config))
                changed = True
        for token in [t for t in locks if t not in held_before]:
            del locks[token]
        delays = self._delays.setdefault(key, {})
        current = {(first, token): ms for first, token, ms in rules.delayed(state)}
        for (first, token), ms in current.items():
            due = delays.setdefault((first, token), now + ms / 1000)
            if now >= due and rules.promote(state, first, token):
                self._count(group, "delay_ended", 1)
                changed = True
        for k in [k for k in delays if k not in current]:
            del delays[k]
        return changed

    def _write(self, group: str, tp, state: SharePartitionState, version: int, term) -> None:
        t = fenced(self.client, term.fence)
        t.set_data(share_partitions_path(group, *tp), state.encode(), version=version)
        try:
            fenced_commit(t, term.fence)
        except TransactionFailed:
            pass  # a member wrote it meanwhile: the next tick reads what it wrote and judges again

    def _count(self, group: str, event: str, records: int) -> None:
        if self.metrics is not None and records:
            self.metrics.share_records.labels(group, event).inc(records)
