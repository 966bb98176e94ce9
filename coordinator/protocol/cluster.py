"""What the coordinators and the topics are: topic znodes (Kafka's format, and the topic
mirror's mark), the shards, the nodes and the controller, and the installation's ACL policy."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from coordinator.errors import CorruptZnode
from coordinator.protocol.codec import check_version, dump, is_int, load, now_ms, require
from coordinator.protocol.paths import LEADER, SHARDS, validate_name

#: The most shards an installation may have (one znode, one epoch znode and one watch each per node).
MAX_SHARD_COUNT = 1024

#: Most partitions a topic may have. The topic znode lists every partition, and a group's
#: state znode every partition's owner (a stream id, ~50 bytes each): at this count they stay
#: well under ZooKeeper's 1 MB znode limit (jute.maxbuffer). A group's state grows with every
#: partition it consumes, so a group should consume at most about this many in total.
MAX_PARTITIONS = 10_000


# ---------------------------------------------------------------- topics (Kafka's format)

#: The key that marks a topic znode written by the topic mirror (coordinator/mirror.py):
#: ``{"cluster_id": <the Kafka cluster's id>}``. Kafka's own decoder reads only the keys it
#: knows (``partitions``, ``adding_replicas``, ``removing_replicas``, ``topic_id``), so the
#: mark does not disturb it; anyone who rewrites the znode drops the mark, and the mirror then
#: leaves that znode alone.
MIRROR_MARK = "zkgroups_mirror"


@dataclass(frozen=True)
class TopicZnode:
    """What a /brokers/topics/<topic> znode says: its partition count, and the Kafka cluster
    it was mirrored from (None: not written by the topic mirror)."""
    partitions: int
    mirrored_from: Optional[str] = None


def encode_topic(partitions: int, broker_id: int = 0) -> bytes:
    return dump({"version": 1, "partitions": {str(p): [broker_id] for p in range(partitions)}})


def encode_mirrored_topic(replicas: Dict[int, List[int]], cluster_id: str) -> bytes:
    """A topic mirrored from a Kafka cluster: Kafka's version 1 format with the partitions'
    replica lists as Kafka reported them, and the mirror's mark."""
    return dump({"version": 1, "partitions": {str(p): list(r) for p, r in sorted(replicas.items())},
                  MIRROR_MARK: {"cluster_id": cluster_id}})


def _is_replica_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(r, list) and all(is_int(b) for b in r)
                                           for r in value.values())


def decode_topic_znode(raw: bytes, path: str) -> TopicZnode:
    """A /brokers/topics/<topic> znode in any format Kafka in ZooKeeper mode writes: version 1
    (``partitions`` only), 2 (with ``adding_replicas`` / ``removing_replicas``, Kafka 2.4+) and
    3 (with an optional ``topic_id``, Kafka 2.8+). As Kafka's own decoder, it reads the keys it
    knows and ignores the others. Partitions must be numbered 0..n-1, each with a list of
    broker ids."""
    obj = load(raw, path, "topic registration")
    require("version" not in obj or (is_int(obj["version"]) and obj["version"] >= 1), path,
             f"topic registration has a bad version {obj.get('version')!r}")
    parts = obj.get("partitions")
    require(isinstance(parts, dict) and parts, path, "topic registration has no 'partitions' map")
    require(all(p.isascii() and p.isdecimal() for p in parts), path,
             "topic registration has a non-numeric partition id")
    ids = sorted(int(p) for p in parts)
    require(ids == list(range(len(ids))), path, "topic partitions are not numbered 0..n-1")
    require(_is_replica_map(parts), path, "topic partitions must each list their replicas' broker ids")
    for key in ("adding_replicas", "removing_replicas"):
        require(key not in obj or _is_replica_map(obj[key]), path,
                 f"topic registration's {key!r} must map partitions to broker ids")
    require(isinstance(obj.get("topic_id", ""), str), path, "topic registration's 'topic_id' must be a string")
    mark = obj.get(MIRROR_MARK)
    cluster = mark.get("cluster_id") if isinstance(mark, dict) else None
    return TopicZnode(len(ids), cluster if isinstance(cluster, str) else None)


def decode_topic(raw: bytes, path: str) -> int:
    """Partition count of a /brokers/topics/<topic> znode (see :func:`decode_topic_znode`)."""
    return decode_topic_znode(raw, path).partitions


# ---------------------------------------------------------------- shards and nodes

@dataclass
class ShardsInfo:
    """shards: how many shards groups are spread over (written once, by the first controller)."""
    count: int

    def encode(self) -> bytes:
        return dump({"version": 1, "count": self.count})

    @classmethod
    def decode(cls, raw: bytes, path: str = SHARDS) -> "ShardsInfo":
        obj = load(raw, path, "shards info")
        check_version(obj, path, "shards info")
        count = obj.get("count")
        require(isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= MAX_SHARD_COUNT, path,
                 f"shard count must be a whole number in 1..{MAX_SHARD_COUNT}")
        return cls(count)


@dataclass
class ShardAssignment:
    """shards/<shard>: the node leading the shard and the shard epoch it leads at (written by
    the controller, in the transaction that bumps the epoch). ``node_id`` "" = nobody."""
    node_id: str
    epoch: int
    since: int = 0

    def encode(self) -> bytes:
        return dump({"version": 1, "node_id": self.node_id, "epoch": self.epoch, "since": self.since or now_ms()})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "ShardAssignment":
        if not raw:
            return cls("", 0)
        obj = load(raw, path, "shard assignment")
        check_version(obj, path, "shard assignment")
        try:
            return cls(str(obj["node_id"]), int(obj["epoch"]), int(obj.get("since", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptZnode(path, f"shard assignment is malformed ({e})") from None


@dataclass
class NodeInfo:
    """nodes/<node id>: a live coordinator node and the shards it leads ({shard: {epoch,
    verified}}; verified: every group of the shard checked since the node took it)."""
    node_id: str
    host: str
    pid: int
    since: int
    shards: Dict[int, Dict[str, object]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return dump({"version": 1, "node_id": self.node_id, "host": self.host, "pid": self.pid,
                      "since": self.since, "shards": {str(s): v for s, v in sorted(self.shards.items())}})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "NodeInfo":
        obj = load(raw, path, "node info")
        check_version(obj, path, "node info")
        try:
            shards = {int(s): {"epoch": int(v["epoch"]), "verified": bool(v.get("verified", False))}
                      for s, v in obj.get("shards", {}).items()}
            return cls(str(obj["node_id"]), str(obj["host"]), int(obj["pid"]), int(obj["since"]), shards)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptZnode(path, f"node info is malformed ({e})") from None


# ---------------------------------------------------------------- leader

@dataclass
class LeaderInfo:
    node_id: str
    host: str
    pid: int
    epoch: int
    since: int
    loaded: bool = False  # True once the leader has verified every group after taking over

    def encode(self) -> bytes:
        return dump({"version": 1, "node_id": self.node_id, "host": self.host, "pid": self.pid,
                      "epoch": self.epoch, "since": self.since, "loaded": self.loaded})

    @classmethod
    def decode(cls, raw: bytes, path: str = LEADER) -> "LeaderInfo":
        obj = load(raw, path, "leader info")
        check_version(obj, path, "leader info")
        try:
            return cls(str(obj["node_id"]), str(obj["host"]), int(obj["pid"]),
                       int(obj["epoch"]), int(obj["since"]), bool(obj.get("loaded", False)))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptZnode(path, f"leader info is malformed ({e})") from None


# ---------------------------------------------------------------- the ACL policy

_DIGEST_ID = re.compile(r"^[^:\s]+:[A-Za-z0-9+/=]{28}$")
#: A certificate's identity: ``x509:`` and the subject ZooKeeper's X509AuthenticationProvider derives (RFC 2253).
_X509_ID = re.compile(r"^x509:[^\x00-\x1f\x7f]{1,1024}$")
#: A SASL user's identity: ``sasl:`` and the user name.
_SASL_ID = re.compile(r"^sasl:[^:\s]{1,256}$")


@dataclass(frozen=True)
class AclPolicy:
    """acl: the ids of the coordinators' and the admins' identities and of each group's, and
    whether anyone else may read. An id is a digest id (``user:base64(sha1(user:password))``, no
    secret), a certificate's (``x509:CN=billing,O=zkgroups``, the subject ZooKeeper derives) or a
    SASL user's (``sasl:billing``)."""
    coordinator: str
    admin: str
    groups: Dict[str, str] = field(default_factory=dict)
    world_read: bool = True

    def role_of(self, ident: str) -> Optional[str]:
        """"admin", "coordinator", "group" or None, for a digest id."""
        if ident == self.admin:
            return "admin"
        if ident == self.coordinator:
            return "coordinator"
        return "group" if ident in self.groups.values() else None

    def user_known(self, user: str) -> bool:
        return any(i.split(":", 1)[0] == user for i in (self.coordinator, self.admin, *self.groups.values()))

    def encode(self) -> bytes:
        return dump({"version": 1, "coordinator": self.coordinator, "admin": self.admin,
                      "groups": dict(sorted(self.groups.items())), "world_read": self.world_read})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "AclPolicy":
        obj = load(raw, path, "ACL policy")
        check_version(obj, path, "ACL policy")
        groups = obj.get("groups", {})
        require(isinstance(groups, dict), path, "ACL policy groups must map group -> identity id")
        for ident in (obj.get("coordinator"), obj.get("admin"), *groups.values()):
            require(isinstance(ident, str) and any(p.match(ident) for p in (_DIGEST_ID, _X509_ID, _SASL_ID)), path,
                     f"ACL policy names {str(ident)[:60]!r}, which is not a digest id (user:base64 sha1), "
                     "an x509 one (x509:SUBJECT) or a SASL one (sasl:USER)")
        for group in groups:
            validate_name(group, "group")
        require(isinstance(obj.get("world_read", True), bool), path, "ACL policy world_read must be true or false")
        return cls(obj["coordinator"], obj["admin"], dict(groups), obj.get("world_read", True))
