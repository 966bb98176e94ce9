"""ZooKeeper's own transaction logs (``<dataDir>/version-2/log.<zxid>``), read in Python.

The chaos run's referee trusts nothing the clients say about ownership: it replays what the
ZooKeeper servers wrote to disk. This module turns those files into :class:`Txn` records.

Why a Python reader rather than ZooKeeper's ``TxnLogToolkit`` / ``LogFormatter``:

* the format is small and stable: jute's big-endian ints and longs, length-prefixed byte
  buffers and strings; since 3.0 only an optional trailing digest (3.6) and the path list of
  ``CloseSessionTxn`` (3.6) were added, and both are handled here;
* every entry carries an Adler-32 checksum that is verified, so a misread shows up as an
  error instead of a quietly wrong history;
* it yields typed values (paths, data bytes, the ephemeral flag, session ids) where the Java
  tools print Java ``toString()`` text (data in hex, a multi's sub-operations nested in one
  line) whose layout changes between releases and would have to be parsed again;
* no JVM start per file on a small shared machine.

File format (``FileTxnLog``)::

    header   int magic "ZKLG", int version (2), long dbid
    entries  long Adler-32 of the txn bytes, int length, <length> txn bytes, byte 'B' (end of record)

The log is preallocated with zeros, so a length of 0 (or the end of the file) ends it; a
last entry without its 'B' or cut short is a torn write and is ignored, as ZooKeeper does.
Txn bytes are a ``TxnHeader`` (long clientId = the session, int cxid, long zxid, long time =
the ZooKeeper leader's wall clock in ms when it prepared the request, int type), the record
of that type, and optionally a ``TxnDigest`` (ignored). A multi is a vector of (type, bytes)
sub-records; a refused multi is logged as a multi with at least one error sub-record (the
others may be logged as errors too, or as what was asked: servers differ, see
:func:`_same_refusal`), a refused single request as an error txn: :attr:`Txn.failed` is true
for both, and they changed nothing.

Guarantees: every entry returned passed its checksum; :func:`read_logs` returns each zxid
once, in zxid order, and reports entries that two servers logged differently under one zxid;
given the ensemble's quorum, it sets aside what fewer servers logged (never committed).
Not provided: snapshots (``snapshot.*``) are not read, so history before the oldest log
entry is unknown; logs purged by ``autopurge`` are missing.
"""
from __future__ import annotations

import glob
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

MAGIC = 0x5A4B4C47  # "ZKLG"
END_OF_RECORD = 0x42  # "B"
DIGEST_BYTES = 12  # TxnDigest: int version, long tree digest

# ZooDefs.OpCode values that appear in transaction logs.
ERROR = -1
CREATE = 1
DELETE = 2
SET_DATA = 5
SET_ACL = 7
CHECK = 13
MULTI = 14
CREATE2 = 15
RECONFIG = 16
CREATE_CONTAINER = 19
DELETE_CONTAINER = 20
CREATE_TTL = 21
CREATE_SESSION = -10
CLOSE_SESSION = -11

CREATES = (CREATE, CREATE2, CREATE_CONTAINER, CREATE_TTL)
DELETES = (DELETE, DELETE_CONTAINER)

TYPE_NAMES = {ERROR: "error", CREATE: "create", DELETE: "delete", SET_DATA: "setData", SET_ACL: "setACL",
              CHECK: "check", MULTI: "multi", CREATE2: "create2", RECONFIG: "reconfig",
              CREATE_CONTAINER: "createContainer", DELETE_CONTAINER: "deleteContainer",
              CREATE_TTL: "createTTL", CREATE_SESSION: "createSession", CLOSE_SESSION: "closeSession"}


class TxnLogError(Exception):
    """A log file that is not a ZooKeeper transaction log, or an entry that does not decode."""


@dataclass(frozen=True)
class Op:
    """One change: the whole of a simple txn, or one sub-operation of a multi."""
    type: int
    path: str = ""
    data: Optional[bytes] = None
    ephemeral: bool = False
    version: int = -1         # setData/check/setACL: the expected version
    error: int = 0            # error: ZooKeeper's error code
    timeout_ms: int = 0       # createSession: the negotiated session timeout
    paths: Tuple[str, ...] = ()  # closeSession (3.6+): the ephemeral nodes it deletes

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))


@dataclass(frozen=True)
class Txn:
    zxid: int
    session: int      # TxnHeader.clientId: the session that made the request (or was closed)
    cxid: int
    time_ms: int      # the ZooKeeper leader's wall clock when it prepared the request
    type: int
    ops: Tuple[Op, ...] = field(default=())

    @property
    def failed(self) -> bool:
        """An error txn, or a multi that was refused (it changed nothing)."""
        return self.type == ERROR or any(op.type == ERROR for op in self.ops)

    def describe(self) -> str:
        ops = ", ".join(f"{op.name} {op.path}".rstrip() for op in self.ops)
        return f"zxid {self.zxid:#x} session {self.session:#x} {TYPE_NAMES.get(self.type, self.type)}: {ops}"


class _Reader:
    """jute's BinaryInputArchive over one byte string."""

    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TxnLogError(f"{self.what}: record ends early (wanted {n} bytes at {self.pos} of {len(self.data)})")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def long(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def bool(self) -> bool:
        return self._take(1) != b"\x00"

    def buffer(self) -> Optional[bytes]:
        n = self.int()
        return None if n == -1 else self._take(n)

    def ustring(self) -> str:
        raw = self.buffer()
        return "" if raw is None else raw.decode("utf-8")

    def vector(self, read_one) -> list:
        n = self.int()
        return [] if n == -1 else [read_one() for _ in range(n)]

    def acl(self) -> None:
        self.vector(lambda: (self.int(), self.ustring(), self.ustring()))  # perms, scheme, id

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos


def _record(kind: int, r: _Reader) -> Op:
    """The record of one (sub-)operation of type ``kind``."""
    if kind in (CREATE, CREATE2):
        path, data = r.ustring(), r.buffer()
        r.acl()
        ephemeral = r.bool()
        if r.remaining >= 4:
            r.int()  # parentCVersion (absent in pre-3.3 CreateTxnV0)
        return Op(kind, path, data, ephemeral=ephemeral)
    if kind in (CREATE_CONTAINER, CREATE_TTL):
        path, data = r.ustring(), r.buffer()
        r.acl()
        r.int()  # parentCVersion
        if kind == CREATE_TTL:
            r.long()  # ttl
        return Op(kind, path, data)
    if kind in DELETES:
        return Op(kind, r.ustring())
    if kind in (SET_DATA, RECONFIG):
        path, data = r.ustring(), r.buffer()
        return Op(kind, path, data, version=r.int())
    if kind == SET_ACL:
        path = r.ustring()
        r.acl()
        return Op(kind, path, version=r.int())
    if kind == CHECK:
        return Op(kind, r.ustring(), version=r.int())
    if kind == ERROR:
        return Op(kind, error=r.int())
    if kind == CREATE_SESSION:
        return Op(kind, timeout_ms=r.int())
    if kind == CLOSE_SESSION:
        # 3.6+ logs the ephemeral paths it deletes; older servers (or closeSessionTxn disabled)
        # log nothing, and then at most a digest (int version, long digest: 12 bytes) follows.
        start = r.pos
        try:
            paths = tuple(r.vector(r.ustring))
            if r.remaining in (0, DIGEST_BYTES):
                return Op(kind, paths=paths)
        except (TxnLogError, UnicodeDecodeError):
            pass
        r.pos = start
        return Op(kind)
    raise TxnLogError(f"{r.what}: unsupported txn type {kind}")


def decode_txn(raw: bytes, what: str = "txn") -> Txn:
    """One entry's txn bytes (header, record, optional digest) as a :class:`Txn`."""
    r = _Reader(raw, what)
    session, cxid, zxid, time_ms, kind = r.long(), r.int(), r.long(), r.long(), r.int()
    r.what = f"{what} (zxid {zxid:#x})"
    if kind == MULTI:
        subs = r.vector(lambda: (r.int(), r.buffer() or b""))
        ops = tuple(_record(sub_kind, _Reader(data, f"{r.what} sub-op {i}")) for i, (sub_kind, data) in enumerate(subs))
    else:
        ops = (_record(kind, r),)
    return Txn(zxid, session, cxid, time_ms, kind, ops)


@dataclass
class LogFile:
    path: str
    txns: List[Txn]
    torn_tail: bool = False  # the last entry was cut short (a server killed mid-write)


def read_log(path: str) -> LogFile:
    """Every complete entry of one log file, checksums verified."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 16:
        raise TxnLogError(f"{path}: too short for a transaction log header")
    magic, version, _dbid = struct.unpack_from(">iiq", data, 0)
    if magic != MAGIC:
        raise TxnLogError(f"{path}: not a ZooKeeper transaction log (magic {magic:#x})")
    if version != 2:
        raise TxnLogError(f"{path}: unsupported transaction log version {version}")
    pos, txns, torn = 16, [], False
    while pos + 12 <= len(data):
        checksum, length = struct.unpack_from(">qi", data, pos)
        if length == 0:  # preallocated zeros: the end of what was written
            break
        end = pos + 12 + length
        if length < 0 or end + 1 > len(data) or data[end] != END_OF_RECORD:
            torn = True
            break
        raw = data[pos + 12:end]
        if zlib.adler32(raw) != checksum & 0xFFFFFFFF:
            # A bad checksum on the very last entry is a torn write; anywhere else, damage.
            if _nothing_after(data, end + 1):
                torn = True
                break
            raise TxnLogError(f"{path}: checksum mismatch in the entry at byte {pos}")
        txns.append(decode_txn(raw, f"{path} at byte {pos}"))
        pos = end + 1
    return LogFile(path, txns, torn)


def _nothing_after(data: bytes, pos: int) -> bool:
    return pos + 12 > len(data) or struct.unpack_from(">i", data, pos + 8)[0] == 0


def log_files(data_dir: str) -> List[str]:
    """The transaction log files of one server's dataDir (``version-2/log.*``), oldest first."""
    files = glob.glob(os.path.join(data_dir, "version-2", "log.*"))
    return sorted(files, key=lambda p: int(p.rsplit(".", 1)[1], 16))


@dataclass
class History:
    """Every server's logs merged: each zxid once, in order."""
    txns: List[Txn]
    files: List[str]
    torn_tails: List[str]                       # files whose last entry was cut short
    conflicts: List[Tuple[Txn, Txn]]            # one zxid logged differently by two servers
    never_committed: List[Txn] = field(default_factory=list)  # logged by fewer servers than a quorum


def merge(servers: Sequence[Iterable[LogFile]], quorum: int = 1) -> History:
    """Merge the log files of each server (one iterable per server). A txn that fewer than
    ``quorum`` servers logged goes to :attr:`History.never_committed`: ZooKeeper's leader
    commits a proposal only once a quorum has logged it, and logs are never rewritten but to
    cut such a proposal off, so a proposal that only a minority ever logged was dropped (the
    leader lost its quorum before committing it; a server that synced from a snapshot since
    keeps it in its old log file)."""
    by_zxid: Dict[int, Txn] = {}
    logged_by: Dict[int, int] = {}
    conflicts, files, torn = [], [], []
    for logs in servers:
        zxids = set()
        for log in logs:
            files.append(log.path)
            if log.torn_tail:
                torn.append(log.path)
            for txn in log.txns:
                zxids.add(txn.zxid)
                seen = by_zxid.setdefault(txn.zxid, txn)
                if seen != txn and not _same_refusal(seen, txn):
                    conflicts.append((seen, txn))
        for zxid in zxids:
            logged_by[zxid] = logged_by.get(zxid, 0) + 1
    committed = [z for z in sorted(by_zxid) if logged_by[z] >= quorum]
    never = [by_zxid[z] for z in sorted(by_zxid) if logged_by[z] < quorum]
    return History([by_zxid[z] for z in committed], files, torn, conflicts, never)


def _same_refusal(a: Txn, b: Txn) -> bool:
    """One refused multi, logged in two forms: the server marks every sub-operation of a
    refused multi as an error when it applies it, in the same objects it may not have
    serialized yet, so a log can hold the original operations next to the failing one."""
    return a.failed and b.failed and (a.session, a.cxid, a.time_ms, a.type, len(a.ops)) == \
        (b.session, b.cxid, b.time_ms, b.type, len(b.ops))


def read_logs(data_dirs: Sequence[str], quorum: int = 1) -> History:
    """Merge the transaction logs of every server's dataDir; see :func:`merge` for ``quorum``."""
    return merge([[read_log(path) for path in log_files(d)] for d in data_dirs], quorum)
