"""What ZooKeeper's transaction log says happened to one consumer group.

:func:`group_history` replays merged transactions (:mod:`tests.chaos.txnlog`) and derives,
for group ``g`` under an optional chroot:

* **sessions of each consumer id**: every session that created ``ids/<consumer-id>`` (a
  member whose session expired registers again under the same id with a new session);
* **ownership intervals**: ``owners/<topic>/<partition>`` created by a session, until it is
  deleted (``released``) or that session is closed (``session closed``: ZooKeeper deletes a
  session's ephemeral nodes with the ``closeSession`` txn, without delete txns; that is how
  both an expiry and a client's own close appear);
* **offset commits**: every create or setData of ``offsets/<topic>/<partition>``, with the
  session and time, in zxid order; and each partition's last committed offset.

Only transactions that applied count: a refused multi or an error txn changed nothing.
Times are the ZooKeeper leader's wall clock (ms) when it prepared the request, so a change is
stamped before any client could have seen it: an owner node's creation precedes the first
record its member can hand out, and its deletion (or the session's close) follows the last
record a correct member hands out. Order between ZooKeeper events is by zxid, which is exact.

Oddities (an owner node whose stream belongs to another consumer than the session's
registration, a create of an owner node that is already held) go to :attr:`GroupHistory.problems`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from coordinator import protocol
from tests.chaos.txnlog import CLOSE_SESSION, CREATES, DELETES, SET_DATA, Txn

Partition = Tuple[str, int]

RELEASED, SESSION_CLOSED = "released", "session closed"


@dataclass
class Ownership:
    """One session's hold on one partition: [start, end] in zxids and in ZooKeeper time."""
    topic: str
    partition: int
    session: int
    stream: str
    start_zxid: int
    start_ms: int
    end_zxid: Optional[int] = None  # None: still held when the log ends
    end_ms: Optional[int] = None
    end_reason: Optional[str] = None

    def holds_at(self, at_ms: float, slack_ms: float = 0.0) -> bool:
        """Whether ``at_ms`` lies in [start, end + slack_ms]."""
        return self.start_ms <= at_ms and (self.end_ms is None or at_ms <= self.end_ms + slack_ms)

    def describe(self) -> str:
        end = "open" if self.end_zxid is None else f"zxid {self.end_zxid:#x} t={self.end_ms} ({self.end_reason})"
        return (f"{self.topic}/{self.partition} session {self.session:#x} stream {self.stream}: "
                f"zxid {self.start_zxid:#x} t={self.start_ms} .. {end}")


@dataclass(frozen=True)
class Commit:
    topic: str
    partition: int
    session: int
    zxid: int
    time_ms: int
    offset: Optional[int]  # None: the znode was created empty (a claim's fencing token)


@dataclass
class GroupHistory:
    sessions_of: Dict[str, List[int]] = field(default_factory=lambda: defaultdict(list))
    member_of_session: Dict[int, str] = field(default_factory=dict)
    ownerships: Dict[Partition, List[Ownership]] = field(default_factory=lambda: defaultdict(list))
    commits: Dict[Partition, List[Commit]] = field(default_factory=lambda: defaultdict(list))
    session_closed: Dict[int, Tuple[int, int]] = field(default_factory=dict)  # session -> (zxid, ms)
    problems: List[str] = field(default_factory=list)

    def committed(self) -> Dict[Partition, Optional[int]]:
        """Each partition's last committed offset."""
        return {tp: commits[-1].offset for tp, commits in self.commits.items() if commits}

    def intervals(self, member: str, tp: Partition) -> List[Ownership]:
        sessions = set(self.sessions_of.get(member, ()))
        return [o for o in self.ownerships.get(tp, ()) if o.session in sessions]


class _Paths:
    """Recognises the group's znodes under the chroot."""

    def __init__(self, group: str, chroot: str):
        root = chroot.rstrip("/")
        self.ids = root + protocol.ids_path(group) + "/"
        self.owners = root + protocol.owners_path(group) + "/"
        self.offsets = root + protocol.offsets_path(group) + "/"

    @staticmethod
    def _partition(path: str, prefix: str) -> Optional[Partition]:
        if not path.startswith(prefix):
            return None
        parts = path[len(prefix):].split("/")
        if len(parts) != 2 or not parts[1].isdigit():
            return None
        return parts[0], int(parts[1])

    def member(self, path: str) -> Optional[str]:
        if path.startswith(self.ids) and "/" not in path[len(self.ids):]:
            return path[len(self.ids):]
        return None

    def owner(self, path: str) -> Optional[Partition]:
        return self._partition(path, self.owners)

    def offset(self, path: str) -> Optional[Partition]:
        return self._partition(path, self.offsets)


def group_history(txns: Iterable[Txn], group: str, chroot: str = "") -> GroupHistory:
    """Replay ``txns`` (zxid order) for ``group``; see the module docstring."""
    paths = _Paths(group, chroot)
    h = GroupHistory()
    held: Dict[str, Ownership] = {}  # owner path -> open interval

    def release(path: str, txn: Txn, reason: str) -> None:
        o = held.pop(path)
        o.end_zxid, o.end_ms, o.end_reason = txn.zxid, txn.time_ms, reason

    for txn in txns:
        if txn.failed:
            continue
        if txn.type == CLOSE_SESSION:
            h.session_closed[txn.session] = (txn.zxid, txn.time_ms)
            for path in [p for p, o in held.items() if o.session == txn.session]:
                release(path, txn, SESSION_CLOSED)
            continue
        for op in txn.ops:
            if op.type in CREATES:
                member = paths.member(op.path)
                if member is not None:
                    if txn.session not in h.sessions_of[member]:
                        h.sessions_of[member].append(txn.session)
                    h.member_of_session[txn.session] = member
                    continue
                tp = paths.owner(op.path)
                if tp is not None:
                    _claimed(h, held, op.path, tp, txn, (op.data or b"").decode("utf-8", "replace"))
                    continue
            if op.type in DELETES and op.path in held:
                release(op.path, txn, RELEASED)
            elif op.type in CREATES + (SET_DATA,):
                tp = paths.offset(op.path)
                if tp is not None:
                    h.commits[tp].append(Commit(tp[0], tp[1], txn.session, txn.zxid, txn.time_ms,
                                                _offset(op.data, op.path, h)))
    return h


def _claimed(h: GroupHistory, held: Dict[str, Ownership], path: str, tp: Partition, txn: Txn, stream: str) -> None:
    if path in held:
        h.problems.append(f"zxid {txn.zxid:#x}: {path} created while held by session {held[path].session:#x}")
    member = h.member_of_session.get(txn.session)
    if member is not None and protocol.consumer_of_stream(stream) != member:
        h.problems.append(f"zxid {txn.zxid:#x}: session {txn.session:#x} of {member} claimed {path} "
                          f"for stream {stream!r}")
    held[path] = o = Ownership(tp[0], tp[1], txn.session, stream, txn.zxid, txn.time_ms)
    h.ownerships[tp].append(o)


def _offset(data: Optional[bytes], path: str, h: GroupHistory) -> Optional[int]:
    try:
        return protocol.decode_offset(data or b"", path)
    except Exception as e:  # CorruptZnode: say so, count it as no offset
        h.problems.append(f"{path}: {e}")
        return None
