"""Who may write what in ZooKeeper: identities, the ACL policy, and the ACL of every znode.

Identities are ZooKeeper digest credentials (``user:password``) or, over TLS, client
certificates (the policy names them ``x509:CN=...,O=...``, as ZooKeeper's
X509AuthenticationProvider derives them; :func:`coordinator.zktls.certificate_identity`): one
shared by the coordinator nodes, one per group (shared by the group's members), and the
admins' (``groupctl``). A tool
is given its own credential (``--zk-auth``, ``ZK_AUTH``, ``zk_auth``; ``@/path`` reads it from a
file). The others' *ids* (``user:base64(sha1(user:password))``, not secrets) come from the
installation's policy znode (:data:`coordinator.protocol.paths.ACL_POLICY`), written by an admin
with ``groupctl acl apply``. Without a credential nothing changes: znodes are created open.

:func:`acl_for` is the whole rule table (pure): the ACL a znode gets when it is created, and the
one ``groupctl acl apply`` sets on an installation made before. ZooKeeper checks CREATE and
DELETE on the *parent*, so a role's right to make or remove a znode is a permission on its
parent; children inherit nothing. Every create through a client made by
:func:`coordinator.zkclient.start_client` with a credential goes through :func:`acl_for`,
intermediate nodes of ``ensure_path`` included (kazoo would give them the leaf's ACL).

Guaranteed, with a policy in place: no coordinator, group member or stranger can write a
znode outside its role (the table in docs/operations/security.md); one group's identity cannot
touch another group's znodes. Not provided: separating two members of one group (they share an
identity; see the residual risks in docs/operations/security.md), the chroot's own ACL, and
secrets kept from anyone who can read the process's memory or the secret file.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Dict, List, Optional, Tuple

from kazoo.security import ACL, Id, Permissions

from coordinator import protocol, zktls
from coordinator.config import read_small_file
from coordinator.errors import InvalidConfig

#: Environment variable every tool reads its credential from when no option gives one.
ENV_ZK_AUTH = "ZK_AUTH"
MAX_SECRET_FILE_BYTES = 4096

R, W, C, D, A = (Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE,
                 Permissions.ADMIN)
ALL = Permissions.ALL
RWCD = R | W | C | D


# ---------------------------------------------------------------- credentials

class Credential:
    """A digest credential. The password is never shown: not in repr, str or errors."""
    __slots__ = ("user", "_password")

    def __init__(self, user: str, password: str):
        self.user = user
        self._password = password

    @property
    def digest_id(self) -> str:
        return digest_id(self.user, self._password)

    def auth_data(self) -> List[Tuple[str, str]]:
        """kazoo's ``auth_data`` for this credential."""
        return [("digest", f"{self.user}:{self._password}")]

    def sasl_options(self) -> Dict[str, str]:
        """kazoo's ``sasl_options`` for this credential as a SASL (DIGEST-MD5) user."""
        return {"mechanism": "DIGEST-MD5", "username": self.user, "password": self._password}

    def __repr__(self) -> str:
        return f"Credential(user={self.user!r}, password=***)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Credential) and (self.user, self._password) == (other.user, other._password)

    def __hash__(self) -> int:
        return hash(self.user)


def digest_id(user: str, password: str) -> str:
    """ZooKeeper's digest id: ``user:base64(sha1(user:password))``."""
    sha = hashlib.sha1(f"{user}:{password}".encode("utf-8")).digest()
    return f"{user}:{base64.b64encode(sha).decode()}"


def parse_auth(value, source: str = "--zk-auth") -> Optional[Credential]:
    """``user:password``, or ``@/path/to/file`` holding it (one line); "" or None: none.

    Errors are one line and never contain the value (it may be a secret)."""
    if value is None or isinstance(value, Credential):
        return value
    if not isinstance(value, str):
        raise InvalidConfig(f"{source} must be text (user:password or @file), got {type(value).__name__}")
    if not value:
        return None
    if value.startswith("@"):
        path = value[1:]
        value = _read_secret_file(path, source)
        source = f"{source} file {path}"
    user, colon, password = value.partition(":")
    if not colon or not user or not password:
        raise InvalidConfig(f"{source} is malformed: expected user:password (the value is not shown)")
    if any(ch in user for ch in "\n\r\x00") or any(ch in password for ch in "\n\r\x00"):
        raise InvalidConfig(f"{source} is malformed: a line break or NUL in it (the value is not shown)")
    return Credential(user, password)


def _read_secret_file(path: str, source: str) -> str:
    if not path:
        raise InvalidConfig(f"{source}: '@' must be followed by a file name")
    raw = read_small_file(path, f"{source} file", MAX_SECRET_FILE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidConfig(f"{source} file {path} is not UTF-8 text") from None
    return text.rstrip("\r\n")


def identity_id(spec: str, source: str) -> str:
    """An identity as ``groupctl acl apply`` takes it: ``digest:user:HASH`` (an id, no secret),
    ``x509:SUBJECT`` (a certificate's, as ZooKeeper derives it: ``x509:CN=billing,O=zkgroups``),
    ``cert:FILE`` (the x509 identity of the PEM certificate in FILE), ``sasl:USER`` (a SASL
    user, as ZooKeeper's SASLAuthenticationProvider names it), or a credential
    (``user:password`` / ``@file``) whose id is computed."""
    if spec.startswith(X509_PREFIX):
        if not spec[len(X509_PREFIX):].strip() or any(ord(ch) < 32 for ch in spec):
            raise InvalidConfig(f"{source}: expected x509:SUBJECT (e.g. x509:CN=billing,O=zkgroups)")
        return spec
    if spec.startswith(SASL_PREFIX):
        if not spec[len(SASL_PREFIX):] or any(ch.isspace() or ch == ":" for ch in spec[len(SASL_PREFIX):]):
            raise InvalidConfig(f"{source}: expected sasl:USER")
        return spec
    if spec.startswith("cert:"):
        return zktls.certificate_identity(spec[len("cert:"):], source)
    if spec.startswith("digest:"):
        ident = spec[len("digest:"):]
        user, colon, sha = ident.partition(":")
        if not (user and colon and sha):
            raise InvalidConfig(f"{source}: expected digest:user:HASH")
        return ident
    return parse_auth(spec, source).digest_id


# ---------------------------------------------------------------- the policy

#: How x509 and SASL identities are written in the policy (a digest id has no scheme prefix).
X509_PREFIX, SASL_PREFIX = "x509:", "sasl:"


def _digest(ident: str) -> Id:
    """The ZooKeeper id of a policy's identity: a certificate's (x509) or a digest."""
    if ident.startswith(X509_PREFIX):
        return Id("x509", ident[len(X509_PREFIX):])
    if ident.startswith(SASL_PREFIX):
        return Id("sasl", ident[len(SASL_PREFIX):])
    return Id("digest", ident)


def _merge(entries: List[Tuple[Id, int]]) -> List[ACL]:
    perms: Dict[Id, int] = {}
    for ident, p in entries:
        if p:
            perms[ident] = perms.get(ident, 0) | p
    return [ACL(p, ident) for ident, p in sorted(perms.items(), key=lambda kv: (kv[0].scheme, kv[0].id))]


def _below(path: str, base: str) -> Optional[List[str]]:
    """The components of ``path`` below ``base`` ([] for ``base`` itself), or None when
    ``path`` is not ``base`` or under it."""
    if path == base:
        return []
    if path.startswith(base + "/"):
        return path[len(base) + 1:].split("/")
    return None


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def writers(policy: protocol.AclPolicy, path: str) -> Dict[str, int]:
    """The pure table: digest id -> permissions beyond READ for the znode at ``path`` (the
    admins, who have every permission everywhere, are not listed). Paths zkgroups does not
    create get nothing: only admins write them (the policy znode among them)."""
    coord = policy.coordinator
    group_ids = set(policy.groups.values())
    if path in (_parent(protocol.BROKER_TOPICS), _parent(protocol.GROUPS)):     # /brokers, /consumers
        return {coord: C}
    rest = _below(path, protocol.BROKER_TOPICS)
    if rest is not None:                           # topics: admins; the coordinators' mirror creates, grows, removes
        return {coord: C | D} if not rest else ({coord: W} if len(rest) == 1 else {})
    if _below(path, protocol.COORDINATOR) is not None:   # election, leader, epoch, nodes, shards
        return {coord: RWCD}
    for spark in (protocol.SPARK_STOP, protocol.SPARK_RUNS):   # a Spark job's driver and workers run as a group
        rest = _below(path, spark)
        if rest is not None or path == _parent(spark):
            return {ident: (RWCD if rest else C | D) for ident in group_ids}
    rest = _below(path, protocol.SHARE_GROUPS)
    if rest is not None or path == protocol.SHARE_GROUPS:
        return _share_writers(coord, group_ids, policy.groups.get(rest[0]) if rest else None, rest or [])
    rest = _below(path, protocol.GROUPS)
    if rest is None:
        return {}
    if not rest:                                   # a group's node is made by its first member
        return {coord: C, **{ident: C for ident in group_ids}}
    return _group_writers(coord, policy.groups.get(rest[0]), rest[0], path)


def _group_writers(coord: str, member: Optional[str], group: str, path: str) -> Dict[str, int]:
    """Within /consumers/groups/<group>; ``member``: the group's identity (None: unbound)."""
    if path == protocol.group_path(group):         # state by coordinators, the rest by members
        return _union({coord: C}, {member: C} if member else {})
    if path in (protocol.state_path(group), protocol.timeline_path(group)):
        return {coord: RWCD}
    channel = _below(path, protocol.channel_path(group))
    if member is None:                             # unbound: no member writes; coordinators keep state and channels
        return {coord: RWCD} if channel is not None else {}
    if channel is not None:
        if not channel:
            return {member: C}                     # each member makes its own channel
        if len(channel) == 1:                      # commands: created and removed by coordinators, acked by members
            return _union({coord: C | D}, {member: D})
        return {coord: RWCD}                       # a command
    rest = _below(path, protocol.ids_path(group))
    if rest is not None:                           # registrations: made, replaced and removed by members
        return {member: C | D} if not rest else {member: RWCD}
    for base in (protocol.owners_path(group), protocol.offsets_path(group)):
        rest = _below(path, base)                  # <base>/<topic>/<partition>
        if rest is not None:
            return {member: C | D} if len(rest) < 2 else {member: RWCD}
    return {}


def _share_writers(coord: str, group_ids, member: Optional[str], rest: List[str]) -> Dict[str, int]:
    """Within /consumers/share-groups (``rest``: the path below it): members make their group
    and its znodes and write the share-partitions by compare-and-set; the group's coordinator
    writes the share-partitions too (locks and delays that end) and may set the settings."""
    if not rest:                                   # the share groups' root: made by any first member
        return {coord: C, **{ident: C for ident in group_ids}}
    mine = {member: RWCD} if member else {}
    if len(rest) == 1:                             # the group's node: its settings
        return _union({coord: C | W}, {member: C | W} if member else {})
    if rest[1] == "members":
        return _union({member: C | D} if member else {}) if len(rest) == 2 else mine
    if rest[1] == "partitions":
        if len(rest) < 4:                          # partitions/, partitions/<topic>
            return {member: C | D} if member else {}
        return _union({coord: W}, mine)            # a share-partition's state
    return {}


def _union(*tables: Dict[str, int]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for t in tables:
        for k, v in t.items():
            out[k] = out.get(k, 0) | v
    return out


def acl_for(policy: protocol.AclPolicy, path: str) -> List[ACL]:
    """The ACL the znode at ``path`` (a path as the client sees it, under its chroot) must have."""
    entries = [(_digest(policy.admin), ALL)]
    entries += [(_digest(ident), p | R) for ident, p in writers(policy, path).items()]
    if policy.world_read:
        entries.append((Id("world", "anyone"), R))
    else:
        for ident in {policy.coordinator, *policy.groups.values()}:
            entries.append((_digest(ident), R))
    return _merge(entries)


def _key(ident: Id, redacted: bool) -> Tuple[str, str]:
    """How an ACL entry is matched. ZooKeeper shows a digest's hash only to a client with ADMIN
    on the znode (others see ``user:x``); those are matched by user name."""
    if redacted and ident.scheme == "digest":
        return ident.scheme, ident.id.split(":", 1)[0]
    return ident.scheme, ident.id


def _is_redacted(acls: List[ACL]) -> bool:
    return any(a.id.scheme == "digest" and a.id.id.endswith(":x") for a in acls)


def weaker(actual: List[ACL], expected: List[ACL]) -> List[str]:
    """What ``actual`` grants beyond ``expected``, as ``scheme:id may PERMS`` (empty: ``actual``
    is at least as strict). Digest ids ZooKeeper redacted are compared by user name."""
    redacted = _is_redacted(actual)
    allowed: Dict[Tuple[str, str], int] = {}
    for e in expected:
        allowed[_key(e.id, redacted)] = allowed.get(_key(e.id, redacted), 0) | e.perms
    out = []
    for a in actual:
        extra = a.perms & ~allowed.get(_key(a.id, redacted), 0)
        if extra:
            out.append(f"{a.id.scheme}:{a.id.id.split(':', 1)[0] if a.id.scheme == 'digest' else a.id.id} "
                       f"may {perms_text(extra)}")
    return out


def missing(actual: List[ACL], expected: List[ACL]) -> bool:
    """Whether ``actual`` lacks a permission ``expected`` grants (a role would be refused)."""
    redacted = _is_redacted(actual)
    have: Dict[Tuple[str, str], int] = {}
    for a in actual:
        have[_key(a.id, redacted)] = have.get(_key(a.id, redacted), 0) | a.perms
    return any(e.perms & ~have.get(_key(e.id, redacted), 0) for e in expected)


_PERM_NAMES = ((R, "read"), (W, "write"), (C, "create"), (D, "delete"), (A, "admin"))


def perms_text(perms: int) -> str:
    return ",".join(name for bit, name in _PERM_NAMES if perms & bit)


def same_acl(actual: List[ACL], expected: List[ACL]) -> bool:
    return sorted((a.id.scheme, a.id.id, a.perms) for a in actual) == \
        sorted((e.id.scheme, e.id.id, e.perms) for e in expected)


# ---------------------------------------------------------------- the installation's znodes

#: The znodes zkgroups creates, as trees: (root, how deep to go below it; None: all the way).
#: Below a topic znode is Kafka's (a Kafka in ZooKeeper mode), not ours.
ZKGROUPS_TREES = (("/brokers", 0), (protocol.BROKER_TOPICS, 1), ("/consumers", None), ("/zkgroups-spark", None))


def znodes(client) -> List[str]:
    """Every existing znode zkgroups creates, parents before children (synchronous reads)."""
    from kazoo.exceptions import NoNodeError
    out: List[str] = []

    def walk(path: str, depth: Optional[int]) -> None:
        if path in out:
            return
        try:
            children = client.get_children(path)
        except NoNodeError:
            return
        out.append(path)
        if depth is None or depth > 0:
            for child in sorted(children):
                walk(f"{path}/{child}", None if depth is None else depth - 1)
    for root, depth in ZKGROUPS_TREES:
        walk(root, depth)
    return out


def open_acl() -> List[ACL]:
    """What zkgroups gave every znode before it had a policy (kazoo's default)."""
    return [ACL(ALL, Id("world", "anyone"))]
