"""The ZooKeeper contract of zkgroups: every path and every JSON schema, in one place.

Both sides import this module: the coordinator (election, rebalancing, topic registry) and
the consumer library (registration, command handling, owners, offsets). Nothing else builds
a path or parses a znode. Decoders raise :class:`CorruptZnode` with the path and what was
wrong, so a znode written by someone else never takes down more than the thing it describes.

Layout (documented in docs/concepts/zookeeper-layout.md)::

    /brokers/topics/<topic>                         {"version":1,"partitions":{"0":[0],...}} (Kafka's format;
                                                    versions 2 and 3 read too; mirrored ones marked)
    /brokers/ids/<broker id>                        only read: a Kafka in ZooKeeper mode is here
    /consumers/coordinator/election/<contenders>    kazoo Election of the controller (each watches its predecessor)
    /consumers/coordinator/leader                   ephemeral LeaderInfo of the controller
    /consumers/coordinator/epoch                    persistent; its znode version is the controller's epoch
    /consumers/coordinator/nodes/<node id>          ephemeral NodeInfo: a live coordinator node, its shards
    /consumers/coordinator/shards                   ShardsInfo: how many shards groups are spread over
    /consumers/coordinator/shards/<shard>           ShardAssignment: the node leading the shard, at which epoch
    /consumers/coordinator/shards/<shard>/epoch     its znode version is the shard's epoch (every write
                                                    of the shard's groups checks it)
    /consumers/coordinator/mirror-refresh           written to ask the controller's topic mirror to look now
    /consumers/groups/<group>/ids/<consumer-id>     ephemeral Registration (version 2: a static member,
                                                    consumer id <group>_static-<group instance id>)
    /consumers/groups/<group>/channel/<consumer-id>/cmd-<seq>   persistent sequential Command
    /consumers/groups/<group>/owners/<topic>/<partition>        ephemeral, data: stream id
    /consumers/groups/<group>/offsets/<topic>/<partition>       next offset, decimal (empty: none yet);
                                                    its znode version is the fencing token of claims
    /consumers/groups/<group>/state                 GroupState, written by the leader (its optional
                                                    ``static`` record keeps static members while away)
    /consumers/groups/<group>/timeline              Timeline: the group's last rebalances (a ring of at most
                                                    TIMELINE_ENTRIES), written by the leader after each one
    /zkgroups-spark/stop/<run id>                   created to stop a streaming Spark job
    /consumers/acl                                  AclPolicy: the identities ACLs name (absent: open installation)
    /zkgroups-spark/runs/<run id>/workers/<consumer-id>   ephemeral: a Spark worker of the run is up
    /zkgroups-spark/runs/<run id>/flushed/<consumer-id>   ephemeral: it stopped, processed and committed
                                                    what it had (the stop barrier: members leave
                                                    once every live worker has flushed)
    /zkgroups-spark/runs/<run id>/progress/<consumer-id>  SparkProgress: what a worker attempt processed
                                                    (persistent: a killed attempt's stays until the run ends)
    /zkgroups-spark/runs/<run id>/errors/<consumer-id>    the Python error a worker attempt failed with,
                                                    one line of UTF-8 (the driver names it when the
                                                    attempt's death ends the job)
"""
from __future__ import annotations

import json
import re
import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, NamedTuple, Optional

import re2

from coordinator.config import MAX_SHARD_COUNT
from coordinator.errors import CorruptZnode, InvalidName

BROKER_TOPICS = "/brokers/topics"
BROKER_IDS = "/brokers/ids"   # a Kafka in ZooKeeper mode registers its live brokers here (never zkgroups)
COORDINATOR = "/consumers/coordinator"
ELECTION = COORDINATOR + "/election"
LEADER = COORDINATOR + "/leader"      # the controller
EPOCH = COORDINATOR + "/epoch"        # the controller's epoch
NODES = COORDINATOR + "/nodes"
SHARDS = COORDINATOR + "/shards"
MIRROR_REFRESH = COORDINATOR + "/mirror-refresh"   # any node writes it to ask the controller's topic mirror to look now
GROUPS = "/consumers/groups"
#: Who is who for ZooKeeper ACLs (:mod:`coordinator.acl`); written by admins.
ACL_POLICY = "/consumers/acl"
SPARK_STOP = "/zkgroups-spark/stop"   # <run id>: created to stop a streaming Spark group job
SPARK_RUNS = "/zkgroups-spark/runs"   # <run id>/{workers,flushed}/<consumer id>: the stop barrier; progress, errors

COMMAND_PREFIX = "cmd-"
STOP_FETCHER = "stop-fetcher"
START_FETCHER = "start-fetcher"

PATTERN_STATIC = "static"
PATTERN_WHITE_LIST = "white_list"
PATTERN_BLACK_LIST = "black_list"
PATTERNS = (PATTERN_STATIC, PATTERN_WHITE_LIST, PATTERN_BLACK_LIST)

EMPTY, REBALANCING, STABLE, FAILED = "Empty", "Rebalancing", "Stable", "Failed"
#: The group states the leader may write after each one (``state`` znode), and when:
#: commands written → Rebalancing; every member acked → Stable (Empty with no members);
#: ownership already right → Stable/Empty without commands (also to update ``error``);
#: out of retries → Failed (tried again later).
GROUP_STATE_TRANSITIONS = {
    EMPTY: {REBALANCING, STABLE, EMPTY, FAILED},
    REBALANCING: {REBALANCING, STABLE, EMPTY, FAILED},
    STABLE: {REBALANCING, STABLE, EMPTY, FAILED},
    FAILED: {REBALANCING, STABLE, EMPTY, FAILED},
}

MAX_NAME_LENGTH = 249

#: Most partitions a topic may have. The topic znode lists every partition, and a group's
#: state znode every partition's owner (a stream id, ~50 bytes each): at this count they stay
#: well under ZooKeeper's 1 MB znode limit (jute.maxbuffer). A group's state grows with every
#: partition it consumes, so a group should consume at most about this many in total.
MAX_PARTITIONS = 10_000
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


# ---------------------------------------------------------------- names

def validate_name(name: str, kind: str = "topic") -> str:
    """Kafka's rules for topic (and here group) names: [a-zA-Z0-9._-], 1-249, not . or .."""
    if not isinstance(name, str) or not name:
        raise InvalidName(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"{kind} name {name[:40]!r}... is longer than {MAX_NAME_LENGTH} characters")
    if name in (".", ".."):
        raise InvalidName(f"{kind} name cannot be {name!r}")
    if not _LEGAL_NAME.match(name):
        raise InvalidName(f"{kind} name {name!r} is illegal: use only ASCII letters, digits, '.', '_' and '-'")
    return name


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@lru_cache(maxsize=1024)
def topic_matcher(regex: str):
    """A compiled topic regex that matches in linear time (RE2): a subscription written by
    anyone can never stall the coordinator (``(a+)+`` against ``aaa...b`` backtracks for ever
    in Python's ``re``). Raises ValueError for what RE2 cannot evaluate (backreferences,
    lookaround) or for invalid syntax."""
    try:
        return re2.compile(regex, _RE2_OPTIONS)
    except re2.error as e:
        message = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"regex {regex!r} cannot be evaluated safely: {message}") from None


def static_consumer_id(group: str, instance_id: str) -> str:
    """The consumer id of the static member ``instance_id`` of ``group``: the same in every
    process that carries that instance id, so its stream ids, command channel and share of
    the group's assignment outlive a restart."""
    validate_name(instance_id, "group instance id")
    return validate_name(f"{group}_static-{instance_id}", "consumer id")


def stream_id(consumer_id: str, n: int) -> str:
    return f"{consumer_id}-{n}"


def consumer_of_stream(stream: str) -> str:
    return stream.rsplit("-", 1)[0]


# ---------------------------------------------------------------- paths

def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def group_path(group: str) -> str:
    return f"{GROUPS}/{group}"


def ids_path(group: str, consumer_id: Optional[str] = None) -> str:
    base = f"{GROUPS}/{group}/ids"
    return base if consumer_id is None else f"{base}/{consumer_id}"


def channel_path(group: str, consumer_id: Optional[str] = None) -> str:
    base = f"{GROUPS}/{group}/channel"
    return base if consumer_id is None else f"{base}/{consumer_id}"


def command_prefix(group: str, consumer_id: str) -> str:
    return f"{channel_path(group, consumer_id)}/{COMMAND_PREFIX}"


def command_path(group: str, consumer_id: str, sequence: int) -> str:
    """The path of the channel's command numbered ``sequence``. ZooKeeper numbers a sequential
    node with a counter its parent keeps (one more for every child created under it, whatever
    was deleted since), and only coordinators create children in a channel, so a member that
    saw the channel's last command knows the names of the next ones."""
    return f"{command_prefix(group, consumer_id)}{sequence:010d}"


def command_sequence(path: str) -> int:
    """The number of a command (the inverse of :func:`command_path`)."""
    return int(path[-10:])


def owners_path(group: str, topic: Optional[str] = None, partition: Optional[int] = None) -> str:
    base = f"{GROUPS}/{group}/owners"
    if topic is None:
        return base
    return f"{base}/{topic}" if partition is None else f"{base}/{topic}/{partition}"


def offsets_path(group: str, topic: Optional[str] = None, partition: Optional[int] = None) -> str:
    base = f"{GROUPS}/{group}/offsets"
    if topic is None:
        return base
    return f"{base}/{topic}" if partition is None else f"{base}/{topic}/{partition}"


def state_path(group: str) -> str:
    return f"{GROUPS}/{group}/state"


def timeline_path(group: str) -> str:
    return f"{GROUPS}/{group}/timeline"


def node_path(node_id: str) -> str:
    return f"{NODES}/{node_id}"


def shard_path(shard: int) -> str:
    return f"{SHARDS}/{shard}"


def shard_epoch_path(shard: int) -> str:
    return f"{SHARDS}/{shard}/epoch"


def shard_of(group: str, count: int) -> int:
    """The shard a group belongs to: a stable hash of its name (the same in every process)."""
    return zlib.crc32(group.encode("utf-8")) % count


def spark_stop_path(run_id: str) -> str:
    return f"{SPARK_STOP}/{run_id}"


def spark_run_path(run_id: str) -> str:
    return f"{SPARK_RUNS}/{run_id}"


def spark_workers_path(run_id: str) -> str:
    return spark_run_path(run_id) + "/workers"


def spark_flushed_path(run_id: str) -> str:
    return spark_run_path(run_id) + "/flushed"


def spark_progress_path(run_id: str) -> str:
    return spark_run_path(run_id) + "/progress"


def spark_errors_path(run_id: str) -> str:
    return spark_run_path(run_id) + "/errors"


#: A worker attempt's recorded error is cut to this many characters.
MAX_SPARK_ERROR_CHARS = 500


def encode_spark_error(line: str) -> bytes:
    return _spark_error_line(line).encode("utf-8")


def decode_spark_error(raw: bytes) -> str:
    """The recorded error line ("" if none): any bytes give one line of bounded length."""
    return _spark_error_line(raw.decode("utf-8", "replace"))


def _spark_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:MAX_SPARK_ERROR_CHARS] if lines else ""


class SparkProgress(NamedTuple):
    """A Spark worker attempt's progress: records and batches it processed (and committed or
    handed on), its partitions' lag (records behind their end offsets) and when it wrote this."""
    records: int
    batches: int
    lag: Optional[int]
    at: float


def encode_spark_progress(progress: SparkProgress) -> bytes:
    return _dump(progress._asdict())


def decode_spark_progress(raw: bytes, path: str) -> SparkProgress:
    obj = _load(raw, path, "Spark worker progress")
    try:
        records, batches, lag, at = int(obj["records"]), int(obj["batches"]), obj.get("lag"), float(obj["at"])
        return SparkProgress(records, batches, None if lag is None else int(lag), at)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptZnode(path, f"Spark worker progress is malformed ({e!r})") from None


# ---------------------------------------------------------------- JSON helpers

def _dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes, path: str, what: str) -> dict:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptZnode(path, f"{what} is not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorruptZnode(path, f"{what} is not a JSON object")
    return obj


def _require(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise CorruptZnode(path, message)


def _check_version(obj: dict, path: str, what: str, supported=(1,)) -> None:
    _require(obj.get("version") in supported, path,
             f"{what} has unsupported version {obj.get('version')!r} (supported: {list(supported)})")


def now_ms() -> int:
    return int(time.time() * 1000)


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
    return _dump({"version": 1, "partitions": {str(p): [broker_id] for p in range(partitions)}})


def encode_mirrored_topic(replicas: Dict[int, List[int]], cluster_id: str) -> bytes:
    """A topic mirrored from a Kafka cluster: Kafka's version 1 format with the partitions'
    replica lists as Kafka reported them, and the mirror's mark."""
    return _dump({"version": 1, "partitions": {str(p): list(r) for p, r in sorted(replicas.items())},
                  MIRROR_MARK: {"cluster_id": cluster_id}})


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_replica_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(r, list) and all(_is_int(b) for b in r)
                                           for r in value.values())


def decode_topic_znode(raw: bytes, path: str) -> TopicZnode:
    """A /brokers/topics/<topic> znode in any format Kafka in ZooKeeper mode writes: version 1
    (``partitions`` only), 2 (with ``adding_replicas`` / ``removing_replicas``, Kafka 2.4+) and
    3 (with an optional ``topic_id``, Kafka 2.8+). As Kafka's own decoder, it reads the keys it
    knows and ignores the others. Partitions must be numbered 0..n-1, each with a list of
    broker ids."""
    obj = _load(raw, path, "topic registration")
    _require("version" not in obj or (_is_int(obj["version"]) and obj["version"] >= 1), path,
             f"topic registration has a bad version {obj.get('version')!r}")
    parts = obj.get("partitions")
    _require(isinstance(parts, dict) and parts, path, "topic registration has no 'partitions' map")
    _require(all(p.isascii() and p.isdecimal() for p in parts), path,
             "topic registration has a non-numeric partition id")
    ids = sorted(int(p) for p in parts)
    _require(ids == list(range(len(ids))), path, "topic partitions are not numbered 0..n-1")
    _require(_is_replica_map(parts), path, "topic partitions must each list their replicas' broker ids")
    for key in ("adding_replicas", "removing_replicas"):
        _require(key not in obj or _is_replica_map(obj[key]), path,
                 f"topic registration's {key!r} must map partitions to broker ids")
    _require(isinstance(obj.get("topic_id", ""), str), path, "topic registration's 'topic_id' must be a string")
    mark = obj.get(MIRROR_MARK)
    cluster = mark.get("cluster_id") if isinstance(mark, dict) else None
    return TopicZnode(len(ids), cluster if isinstance(cluster, str) else None)


def decode_topic(raw: bytes, path: str) -> int:
    """Partition count of a /brokers/topics/<topic> znode (see :func:`decode_topic_znode`)."""
    return decode_topic_znode(raw, path).partitions


# ---------------------------------------------------------------- member registration

@dataclass
class Registration:
    """ids/<consumer-id>: what a member subscribes to and which strategies it supports.

    Version 1 is a dynamic member. Version 2 (written only when ``group_instance_id`` is set)
    is a static member: it adds ``group_instance_id``, the member's ``session_timeout_ms`` (how
    long a newcomer with the same instance id waits for a crashed holder's session to expire)
    and ``static_grace_ms`` (how long the coordinator holds its partitions once this
    registration is gone). A reader that knows only version 1 refuses version 2 (the member is
    left out with one error line) rather than treating a static member as a dynamic one."""
    subscription: Dict[str, int]
    pattern: str = PATTERN_STATIC
    strategies: List[str] = field(default_factory=lambda: ["range"])
    host: str = ""
    client_id: str = ""
    timestamp: int = 0
    group_instance_id: str = ""      # "" = a dynamic member
    session_timeout_ms: int = 0
    static_grace_ms: int = 0

    def encode(self) -> bytes:
        obj = {"version": 1, "subscription": self.subscription, "pattern": self.pattern,
               "strategies": self.strategies, "host": self.host,
               "client_id": self.client_id, "timestamp": self.timestamp or now_ms()}
        if self.group_instance_id:
            obj.update(version=2, group_instance_id=self.group_instance_id,
                       session_timeout_ms=self.session_timeout_ms, static_grace_ms=self.static_grace_ms)
        return _dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Registration":
        obj = _load(raw, path, "registration")
        _check_version(obj, path, "registration", supported=(1, 2))
        sub, pattern, strategies = obj.get("subscription"), obj.get("pattern"), obj.get("strategies")
        _require(isinstance(sub, dict) and sub, path, "registration has no subscription")
        _require(all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                     for k, v in sub.items()), path, "subscription must map topic-or-regex to streams >= 1")
        _require(pattern in PATTERNS, path, f"pattern must be one of {list(PATTERNS)}")
        if pattern != PATTERN_STATIC:
            _require(len(sub) == 1, path, "a wildcard subscription has exactly one regex")
            try:
                topic_matcher(next(iter(sub)))
            except ValueError as e:
                raise CorruptZnode(path, f"subscription {e}") from None
        else:
            for topic in sub:
                try:
                    validate_name(topic)
                except InvalidName as e:
                    raise CorruptZnode(path, str(e)) from None
        _require(isinstance(strategies, list) and strategies and all(isinstance(s, str) for s in strategies),
                 path, "registration must list at least one assignment strategy")
        static = {}
        if obj["version"] == 2:
            instance = obj.get("group_instance_id")
            _require(isinstance(instance, str) and bool(_LEGAL_NAME.match(instance)), path,
                     "a version 2 registration needs a valid group_instance_id")
            for key in ("session_timeout_ms", "static_grace_ms"):
                _require(_is_int(obj.get(key)) and obj[key] > 0, path, f"registration's {key} must be positive")
            static = {"group_instance_id": instance, "session_timeout_ms": obj["session_timeout_ms"],
                      "static_grace_ms": obj["static_grace_ms"]}
        return cls(subscription=dict(sub), pattern=pattern, strategies=list(strategies),
                   host=str(obj.get("host", "")), client_id=str(obj.get("client_id", "")),
                   timestamp=int(obj.get("timestamp", 0)), **static)

    def topics(self, all_topics) -> Dict[str, int]:
        """Resolve the subscription against existing topics: {topic: streams}."""
        if self.pattern == PATTERN_STATIC:
            return {t: n for t, n in self.subscription.items() if t in all_topics}
        regex, streams = next(iter(self.subscription.items()))
        matcher = topic_matcher(regex)
        want = self.pattern == PATTERN_WHITE_LIST
        return {t: streams for t in all_topics if bool(matcher.fullmatch(t)) == want}


# ---------------------------------------------------------------- commands

#: An assignment: topic -> partition -> stream id.
Ownership = Dict[str, Dict[int, str]]


@dataclass
class Command:
    """channel/<consumer-id>/cmd-<seq>: one instruction from the leader to one member."""
    option: str
    generation: int
    epoch: int
    ownership: Ownership = field(default_factory=dict)
    consumer_id: str = ""

    def encode(self) -> bytes:
        obj = {"version": 1, "option": self.option, "generation": self.generation,
               "epoch": self.epoch, "consumer_id": self.consumer_id}
        if self.option == START_FETCHER:
            obj["ownership"] = {t: {str(p): s for p, s in parts.items()}
                                for t, parts in self.ownership.items()}
        return _dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Command":
        obj = _load(raw, path, "command")
        _check_version(obj, path, "command")
        option = obj.get("option")
        _require(option in (STOP_FETCHER, START_FETCHER), path, f"unknown command option {option!r}")
        gen, epoch = obj.get("generation"), obj.get("epoch")
        _require(isinstance(gen, int) and isinstance(epoch, int), path, "command needs integer generation and epoch")
        ownership: Ownership = {}
        raw_own = obj.get("ownership", {})
        _require(isinstance(raw_own, dict), path, "command ownership must be a map")
        try:
            for topic, parts in raw_own.items():
                ownership[topic] = {int(p): str(s) for p, s in parts.items()}
        except (AttributeError, ValueError):
            raise CorruptZnode(path, "command ownership must map topic -> partition -> stream id") from None
        return cls(option, gen, epoch, ownership, str(obj.get("consumer_id", "")))


# ---------------------------------------------------------------- group state

@dataclass
class StaticMember:
    """A static member as the group state records it (``state.static[consumer id]``): its
    instance id, its grace, since when its registration is gone (None: registered), and what
    it registered with, so that while it is away the assignment is computed as if it were there."""
    instance_id: str
    grace_ms: int
    subscription: Dict[str, int]
    pattern: str = PATTERN_STATIC
    strategies: List[str] = field(default_factory=lambda: ["range"])
    away_since: Optional[int] = None   # wall-clock ms when the leader found its registration gone

    @classmethod
    def of(cls, registration: Registration) -> "StaticMember":
        r = registration
        return cls(r.group_instance_id, r.static_grace_ms, dict(r.subscription), r.pattern, list(r.strategies))

    def registration(self) -> Registration:
        return Registration(dict(self.subscription), self.pattern, list(self.strategies),
                            group_instance_id=self.instance_id, static_grace_ms=self.grace_ms)

    def encode(self) -> dict:
        obj = {"instance_id": self.instance_id, "grace_ms": self.grace_ms, "subscription": self.subscription,
               "pattern": self.pattern, "strategies": self.strategies}
        if self.away_since is not None:
            obj["away_since"] = self.away_since
        return obj

    @classmethod
    def decode(cls, obj: dict) -> "StaticMember":
        away = obj.get("away_since")
        return cls(str(obj["instance_id"]), int(obj["grace_ms"]),
                   {str(t): int(n) for t, n in obj["subscription"].items()}, str(obj["pattern"]),
                   [str(x) for x in obj["strategies"]], None if away is None else int(away))


@dataclass
class GroupState:
    """state: the leader's last decision for a group. ``static`` (an optional key of version 1:
    a reader that predates it ignores it and treats every member as dynamic) records the
    static members among ``members``, present or held while away."""
    generation: int = 0
    state: str = EMPTY
    members: List[str] = field(default_factory=list)
    assignment: Ownership = field(default_factory=dict)
    strategy: str = ""
    error: str = ""
    epoch: int = 0
    updated: int = 0
    # Set when the coordinator verified the owner nodes against this state: the pzxid (zxid of
    # the last child change) of ids/, channel/ and each owners/<topic> it saw then, and the
    # partition counts of the topics assigned, {"ids": z, "channel": z, "owners": {topic: z},
    # "topics": {topic: n}}. While they are unchanged, so is what was verified (a coordinator
    # taking the group over need neither compute the assignment nor read the owner nodes again).
    verified: Dict[str, Any] = field(default_factory=dict)
    static: Dict[str, StaticMember] = field(default_factory=dict)

    def encode(self) -> bytes:
        obj = {"version": 1, "generation": self.generation, "state": self.state,
               "members": sorted(self.members), "strategy": self.strategy,
               "assignment": {t: {str(p): s for p, s in parts.items()} for t, parts in self.assignment.items()},
               "error": self.error, "epoch": self.epoch, "updated": self.updated or now_ms()}
        if self.verified:
            obj["verified"] = self.verified
        if self.static:
            obj["static"] = {cid: m.encode() for cid, m in sorted(self.static.items())}
        return _dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "GroupState":
        if not raw:
            return cls()
        obj = _load(raw, path, "group state")
        _check_version(obj, path, "group state")
        _require(obj.get("state") in (EMPTY, REBALANCING, STABLE, FAILED), path,
                 f"unknown group state {obj.get('state')!r}")
        try:
            assignment = {t: {int(p): str(s) for p, s in parts.items()}
                          for t, parts in obj.get("assignment", {}).items()}
            static = {str(cid): StaticMember.decode(m) for cid, m in obj.get("static", {}).items()}
            return cls(generation=int(obj.get("generation", 0)), state=obj["state"],
                       members=list(obj.get("members", [])), assignment=assignment,
                       strategy=str(obj.get("strategy", "")), error=str(obj.get("error", "")),
                       epoch=int(obj.get("epoch", 0)), updated=int(obj.get("updated", 0)),
                       verified=_verified(obj.get("verified")), static=static)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CorruptZnode(path, f"group state is malformed ({e})") from None


def _verified(obj) -> Dict[str, Any]:
    """A state's ``verified`` record, or {} (nothing trusted) if it is absent or not well formed."""
    def topic_ints(value) -> bool:
        return isinstance(value, dict) and all(isinstance(t, str) and type(n) is int for t, n in value.items())

    try:
        if all(type(obj[k]) is int for k in ("ids", "channel")) and topic_ints(obj["owners"]):
            out = {"ids": obj["ids"], "channel": obj["channel"], "owners": dict(obj["owners"])}
            if topic_ints(obj.get("topics")):
                out["topics"] = dict(obj["topics"])
            return out
    except (KeyError, TypeError):
        pass
    return {}


# ---------------------------------------------------------------- the rebalance timeline

#: Rebalances a group's timeline keeps (the oldest is dropped first).
TIMELINE_ENTRIES = 32
#: Consumer ids an entry names per list (joined, left, members left out); the counts are exact.
TIMELINE_IDS = 20
#: The newest entry also keeps the members after it (for the next entry's joined and left), up to this many.
TIMELINE_MEMBERS = 1000
TIMELINE_OUTCOMES = (STABLE, EMPTY, FAILED, "Superseded", "Held")


@dataclass
class RebalanceRecord:
    """One rebalance as the timeline keeps it: the generation it wrote and when it ended
    (``at``, wall-clock ms), the node and shard epoch that ran it, what caused it
    (``reasons``: join, leave, topic grew, static member away/back, ...; ``detail``: the
    coordinator's own words), the members before and after (counts; ``joined``/``left`` name
    at most :data:`TIMELINE_IDS` each), the partition counts of the topics assigned after,
    partitions moved, duration, ``outcome`` (Stable, Empty, Failed, Superseded: computed
    again because the group changed meanwhile; Held: a static member is away and its
    partitions wait for it) with ``error``, the members left out for not acking
    (``excluded``) and the static members held away (consumer id -> when their hold ends)."""
    generation: int
    at: int
    outcome: str
    node: str = ""
    epoch: int = 0
    reasons: List[str] = field(default_factory=list)
    detail: List[str] = field(default_factory=list)
    members_before: Optional[int] = None
    members_after: int = 0
    joined: List[str] = field(default_factory=list)
    left: List[str] = field(default_factory=list)
    topics: Dict[str, int] = field(default_factory=dict)
    moved: Optional[int] = None
    duration_ms: Optional[float] = None
    error: str = ""
    excluded: List[str] = field(default_factory=list)
    held: Dict[str, int] = field(default_factory=dict)
    members: Optional[List[str]] = None   # the members after it: kept in the newest entry only

    def encode(self, newest: bool = False) -> dict:
        obj = {"generation": self.generation, "at": self.at, "outcome": self.outcome, "node": self.node,
               "epoch": self.epoch, "reasons": list(self.reasons), "detail": list(self.detail),
               "members_before": self.members_before, "members_after": self.members_after,
               "joined": self.joined[:TIMELINE_IDS], "left": self.left[:TIMELINE_IDS],
               "topics": dict(sorted(self.topics.items())), "moved": self.moved,
               "duration_ms": None if self.duration_ms is None else round(self.duration_ms, 1),
               "error": self.error, "excluded": self.excluded[:TIMELINE_IDS], "held": dict(sorted(self.held.items()))}
        if newest and self.members is not None and len(self.members) <= TIMELINE_MEMBERS:
            obj["members"] = sorted(self.members)
        return obj

    @classmethod
    def decode(cls, obj, path: str) -> "RebalanceRecord":
        _require(isinstance(obj, dict), path, "timeline entry is not a JSON object")
        try:
            before, moved, took = obj.get("members_before"), obj.get("moved"), obj.get("duration_ms")
            return cls(generation=int(obj["generation"]), at=int(obj["at"]), outcome=str(obj["outcome"]),
                       node=str(obj.get("node", "")), epoch=int(obj.get("epoch", 0)),
                       reasons=[str(r) for r in obj.get("reasons", [])], detail=[str(d) for d in obj.get("detail", [])],
                       members_before=None if before is None else int(before),
                       members_after=int(obj.get("members_after", 0)),
                       joined=[str(c) for c in obj.get("joined", [])], left=[str(c) for c in obj.get("left", [])],
                       topics={str(t): int(n) for t, n in obj.get("topics", {}).items()},
                       moved=None if moved is None else int(moved), duration_ms=None if took is None else float(took),
                       error=str(obj.get("error", "")), excluded=[str(c) for c in obj.get("excluded", [])],
                       held={str(c): int(t) for c, t in obj.get("held", {}).items()},
                       members=None if obj.get("members") is None else [str(c) for c in obj["members"]])
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CorruptZnode(path, f"timeline entry is malformed ({e!r})") from None


def encode_timeline(entries: List[RebalanceRecord]) -> bytes:
    """The ring: the newest :data:`TIMELINE_ENTRIES` entries, oldest first."""
    kept = entries[-TIMELINE_ENTRIES:]
    return _dump({"version": 1, "entries": [e.encode(newest=i == len(kept) - 1) for i, e in enumerate(kept)]})


def decode_timeline(raw: bytes, path: str) -> List[RebalanceRecord]:
    if not raw:
        return []
    obj = _load(raw, path, "timeline")
    _check_version(obj, path, "timeline")
    entries = obj.get("entries")
    _require(isinstance(entries, list), path, "timeline has no 'entries' list")
    return [RebalanceRecord.decode(e, path) for e in entries]


# ---------------------------------------------------------------- shards and nodes

@dataclass
class ShardsInfo:
    """shards: how many shards groups are spread over (written once, by the first controller)."""
    count: int

    def encode(self) -> bytes:
        return _dump({"version": 1, "count": self.count})

    @classmethod
    def decode(cls, raw: bytes, path: str = SHARDS) -> "ShardsInfo":
        obj = _load(raw, path, "shards info")
        _check_version(obj, path, "shards info")
        count = obj.get("count")
        _require(isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= MAX_SHARD_COUNT, path,
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
        return _dump({"version": 1, "node_id": self.node_id, "epoch": self.epoch, "since": self.since or now_ms()})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "ShardAssignment":
        if not raw:
            return cls("", 0)
        obj = _load(raw, path, "shard assignment")
        _check_version(obj, path, "shard assignment")
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
        return _dump({"version": 1, "node_id": self.node_id, "host": self.host, "pid": self.pid,
                      "since": self.since, "shards": {str(s): v for s, v in sorted(self.shards.items())}})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "NodeInfo":
        obj = _load(raw, path, "node info")
        _check_version(obj, path, "node info")
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
        return _dump({"version": 1, "node_id": self.node_id, "host": self.host, "pid": self.pid,
                      "epoch": self.epoch, "since": self.since, "loaded": self.loaded})

    @classmethod
    def decode(cls, raw: bytes, path: str = LEADER) -> "LeaderInfo":
        obj = _load(raw, path, "leader info")
        _check_version(obj, path, "leader info")
        try:
            return cls(str(obj["node_id"]), str(obj["host"]), int(obj["pid"]),
                       int(obj["epoch"]), int(obj["since"]), bool(obj.get("loaded", False)))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptZnode(path, f"leader info is malformed ({e})") from None


# ---------------------------------------------------------------- offsets

# ---------------------------------------------------------------- the ACL policy

_DIGEST_ID = re.compile(r"^[^:\s]+:[A-Za-z0-9+/=]{28}$")


@dataclass(frozen=True)
class AclPolicy:
    """acl: digest ids (``user:base64(sha1(user:password))``, no secrets) of the coordinators'
    and the admins' identities, each group's identity, and whether anyone else may read."""
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
        return _dump({"version": 1, "coordinator": self.coordinator, "admin": self.admin,
                      "groups": dict(sorted(self.groups.items())), "world_read": self.world_read})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "AclPolicy":
        obj = _load(raw, path, "ACL policy")
        _check_version(obj, path, "ACL policy")
        groups = obj.get("groups", {})
        _require(isinstance(groups, dict), path, "ACL policy groups must map group -> digest id")
        for ident in (obj.get("coordinator"), obj.get("admin"), *groups.values()):
            _require(isinstance(ident, str) and bool(_DIGEST_ID.match(ident)), path,
                     f"ACL policy names {str(ident)[:60]!r}, which is not a digest id (user:base64 sha1)")
        for group in groups:
            validate_name(group, "group")
        _require(isinstance(obj.get("world_read", True), bool), path, "ACL policy world_read must be true or false")
        return cls(obj["coordinator"], obj["admin"], dict(groups), obj.get("world_read", True))


NO_OFFSET = b""  # an offsets znode created by a claim before anything was committed (the fence exists)


def encode_offset(offset: Optional[int]) -> bytes:
    return NO_OFFSET if offset is None else str(int(offset)).encode()


def decode_offset(raw: bytes, path: str) -> Optional[int]:
    """The committed offset (next to consume), or None: the znode exists (a claim created it
    to carry the fencing token, its version) but nothing was committed yet."""
    if not raw.strip():
        return None
    try:
        value = int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise CorruptZnode(path, f"committed offset {raw[:32]!r} is not a decimal number") from None
    _require(value >= 0, path, "committed offset is negative")
    return value
