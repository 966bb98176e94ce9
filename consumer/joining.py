"""How a member joins its group: the directories it writes under, made where missing, and a join
that waits out a lost connection.

:class:`GroupDirectories` makes the group's directories a member needs (``ids/``, ``channel/``,
``owners/``, ``offsets/``, and for each topic it claims from ``owners/<topic>`` and
``offsets/<topic>``) when they are missing, looking at all of them in one round trip; they
usually exist, so a join or a first claim of a topic costs one round trip, not one per
directory. The offsets directory of a topic about to be claimed is listed rather than looked
at, so the first claim of its partitions knows which have an offsets znode to read
(``Claims.offsets_listed``). A topic's directories are made once per member.

:func:`join_waiting_out_lost_connections` repeats a join until it is done: a lost connection
(or none yet) is waited out, saying so once every ``report_every`` seconds; ZooKeeper refusing
this identity raises :class:`~coordinator.errors.AuthFailed`, any other answer of ZooKeeper's
:class:`~coordinator.errors.ZooKeeperUnavailable`.

Threads: the thread that starts the member, then the member thread; one at a time.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, Iterable, List, Set

from kazoo.exceptions import KazooException, NoAuthError, NoNodeError

from coordinator import protocol
from coordinator.errors import AuthFailed, ZooKeeperUnavailable
from coordinator.zkclient import LOST_CONNECTION, wait_in_order
from consumer.ownership import partition_numbers

log = logging.getLogger("zkgroups.member")

#: How long a join waits between attempts while the connection is lost.
RETRY_S = 0.1


class GroupDirectories:
    """The directories of ``group`` a member writes under; ``offsets_listed`` gets what the
    listings of offsets directories show (the member's ``Claims.offsets_listed``)."""

    def __init__(self, client, group: str, offsets_listed: Dict[str, Set[int]]):
        self.client, self.group = client, group
        self._offsets_listed = offsets_listed
        self._topics_made: Set[str] = set()

    def make_for_join(self, topics: Iterable[str]) -> None:
        """The group's directories, and those of ``topics`` (a static subscription's)."""
        g, topics = self.group, list(topics)
        self.make([protocol.ids_path(g), protocol.channel_path(g), protocol.owners_path(g), protocol.offsets_path(g)]
                  + [d for t in topics for d in self._topic_dirs(t)], listed=topics)
        self._topics_made.update(topics)

    def make_for_claim(self, topic: str) -> None:
        """``topic``'s directories, before the member first claims one of its partitions."""
        if topic not in self._topics_made:
            self.make(self._topic_dirs(topic), listed=[topic])
            self._topics_made.add(topic)

    def make(self, paths: List[str], listed: Iterable[str] = ()) -> None:
        """Create those of ``paths`` that are missing, looking at all of them in one round trip.
        The offsets directories of the topics ``listed`` are listed rather than looked at."""
        listings = {protocol.offsets_path(self.group, t): t for t in listed}
        looks = [(path, self.client.get_children_async(path) if path in listings else self.client.exists_async(path))
                 for path in paths]
        wait_in_order([a for _, a in looks])
        for path, a in looks:
            try:
                answer = a.get()
            except NoNodeError:
                answer = None
            if answer is None:
                self.client.ensure_path(path)
            elif path in listings:
                self._offsets_listed[listings[path]] = partition_numbers(answer)

    def _topic_dirs(self, topic: str) -> List[str]:
        return [protocol.owners_path(self.group, topic), protocol.offsets_path(self.group, topic)]


def join_waiting_out_lost_connections(client, group: str, member: str, join_once: Callable[[], None],
                                      report_every: float) -> None:
    """``join_once()`` until it is done; a lost connection is waited out (one line per
    ``report_every`` seconds), anything else ZooKeeper answers ends it (see the module docstring)."""
    waiting_since, next_report = None, 0.0
    while True:
        if client.connected:
            try:
                join_once()
                return
            except NoAuthError:
                raise AuthFailed(f"cannot join group {group}: ZooKeeper refused this identity (the group is bound "
                                 "to another one, or none was given)") from None
            except LOST_CONNECTION as e:
                cause = type(e).__name__
            except KazooException as e:
                raise ZooKeeperUnavailable(f"cannot join group {group}: {type(e).__name__}") from None
        else:
            cause = "not connected"
        now = time.monotonic()
        waiting_since = waiting_since or now
        if now >= next_report:
            log.warning("member %s: cannot join group %s yet: ZooKeeper connection lost (%s); waiting for it "
                        "(%.0f s so far)", member, group, cause, now - waiting_since)
            next_report = now + report_every
        time.sleep(RETRY_S)
