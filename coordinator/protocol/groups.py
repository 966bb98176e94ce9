"""What lives under ``/consumers/groups/<group>``: members' registrations, the commands of their
channels, the group state (with its static members and verification record), the rebalance
timeline, and committed offsets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from coordinator.errors import CorruptZnode, InvalidName
from coordinator.protocol.codec import check_version, dump, is_int, load, now_ms, require
from coordinator.protocol.paths import LEGAL_NAME, topic_matcher, validate_name

PATTERN_STATIC = "static"
PATTERN_WHITE_LIST = "white_list"
PATTERN_BLACK_LIST = "black_list"
PATTERNS = (PATTERN_STATIC, PATTERN_WHITE_LIST, PATTERN_BLACK_LIST)

STOP_FETCHER = "stop-fetcher"
START_FETCHER = "start-fetcher"

# The group states (``state`` znode). Which step of a rebalance writes which, and why any may
# follow any, is said where they are built: coordinator/plan.py.
EMPTY, REBALANCING, STABLE, FAILED = "Empty", "Rebalancing", "Stable", "Failed"


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
        return dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Registration":
        obj = load(raw, path, "registration")
        check_version(obj, path, "registration", supported=(1, 2))
        sub, pattern, strategies = obj.get("subscription"), obj.get("pattern"), obj.get("strategies")
        require(isinstance(sub, dict) and sub, path, "registration has no subscription")
        require(all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                     for k, v in sub.items()), path, "subscription must map topic-or-regex to streams >= 1")
        require(pattern in PATTERNS, path, f"pattern must be one of {list(PATTERNS)}")
        if pattern != PATTERN_STATIC:
            require(len(sub) == 1, path, "a wildcard subscription has exactly one regex")
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
        require(isinstance(strategies, list) and strategies and all(isinstance(s, str) for s in strategies),
                 path, "registration must list at least one assignment strategy")
        static = {}
        if obj["version"] == 2:
            instance = obj.get("group_instance_id")
            require(isinstance(instance, str) and bool(LEGAL_NAME.match(instance)), path,
                     "a version 2 registration needs a valid group_instance_id")
            for key in ("session_timeout_ms", "static_grace_ms"):
                require(is_int(obj.get(key)) and obj[key] > 0, path, f"registration's {key} must be positive")
            static = {"group_instance_id": instance, "session_timeout_ms": obj["session_timeout_ms"],
                      "static_grace_ms": obj["static_grace_ms"]}
        try:
            timestamp = int(obj.get("timestamp", 0))
        except (TypeError, ValueError):
            raise CorruptZnode(path, f"registration's timestamp {obj.get('timestamp')!r:.40} is not a number") from None
        return cls(subscription=dict(sub), pattern=pattern, strategies=list(strategies),
                   host=str(obj.get("host", "")), client_id=str(obj.get("client_id", "")),
                   timestamp=timestamp, **static)

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
        return dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "Command":
        obj = load(raw, path, "command")
        check_version(obj, path, "command")
        option = obj.get("option")
        require(option in (STOP_FETCHER, START_FETCHER), path, f"unknown command option {option!r}")
        gen, epoch = obj.get("generation"), obj.get("epoch")
        require(isinstance(gen, int) and isinstance(epoch, int), path, "command needs integer generation and epoch")
        ownership: Ownership = {}
        raw_own = obj.get("ownership", {})
        require(isinstance(raw_own, dict), path, "command ownership must be a map")
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
        return dump(obj)

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "GroupState":
        if not raw:
            return cls()
        obj = load(raw, path, "group state")
        check_version(obj, path, "group state")
        require(obj.get("state") in (EMPTY, REBALANCING, STABLE, FAILED), path,
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
        require(isinstance(obj, dict), path, "timeline entry is not a JSON object")
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
    return dump({"version": 1, "entries": [e.encode(newest=i == len(kept) - 1) for i, e in enumerate(kept)]})


def decode_timeline(raw: bytes, path: str) -> List[RebalanceRecord]:
    if not raw:
        return []
    obj = load(raw, path, "timeline")
    check_version(obj, path, "timeline")
    entries = obj.get("entries")
    require(isinstance(entries, list), path, "timeline has no 'entries' list")
    return [RebalanceRecord.decode(e, path) for e in entries]


# ---------------------------------------------------------------- offsets

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
    require(value >= 0, path, "committed offset is negative")
    return value


# ---------------------------------------------------------------- completed offsets (parallel consumers)

#: The most offsets a Completed record covers above its base: a parallel consumer stops
#: dispatching a partition's records this far past its committed offset, so the record (a
#: bitmap, compressed) stays a few kilobytes at most.
MAX_COMPLETED_SPAN = 65_536


def encode_completed(base: int, done) -> bytes:
    """completed/<topic>/<partition>: the offsets of ``done`` (each above ``base``, within
    :data:`MAX_COMPLETED_SPAN`) finished while ``base`` was the committed offset, as a bitmap
    relative to ``base + 1`` (bit i: offset base + 1 + i), zlib-compressed, base64 in JSON."""
    import base64
    import zlib
    bits = bytearray((MAX_COMPLETED_SPAN + 7) // 8)
    top = 0
    for o in done:
        i = o - base - 1
        if not 0 <= i < MAX_COMPLETED_SPAN:
            raise ValueError(f"offset {o} is outside the completed span above {base}")
        bits[i >> 3] |= 1 << (i & 7)
        top = max(top, (i >> 3) + 1)
    packed = base64.b64encode(zlib.compress(bytes(bits[:top]), 6)).decode("ascii")
    return dump({"version": 1, "base": int(base), "bitmap": packed})


def decode_completed(raw: bytes, path: str):
    """(base, frozenset of completed offsets), or None for an empty znode (nothing recorded)."""
    import base64
    import binascii
    import zlib
    if not raw.strip():
        return None
    obj = load(raw, path, "completed offsets")
    check_version(obj, path, "completed offsets")
    base, packed = obj.get("base"), obj.get("bitmap")
    require(is_int(base) and base >= 0, path, "completed offsets: base is not a whole number >= 0")
    require(isinstance(packed, str), path, "completed offsets: bitmap is not a string")
    limit = (MAX_COMPLETED_SPAN + 7) // 8
    try:
        inflate = zlib.decompressobj()
        bits = inflate.decompress(base64.b64decode(packed.encode("ascii"), validate=True), limit + 1)
    except (binascii.Error, zlib.error, UnicodeEncodeError, ValueError) as e:
        raise CorruptZnode(path, f"completed offsets: bitmap cannot be decoded ({e})") from None
    require(len(bits) <= limit and not inflate.unconsumed_tail, path,
            f"completed offsets: bitmap spans more than {MAX_COMPLETED_SPAN} offsets")
    done = frozenset(base + 1 + (k << 3) + j for k, byte in enumerate(bits) if byte for j in range(8)
                     if byte >> j & 1)
    return base, done
