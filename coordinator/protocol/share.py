"""What lives under ``/consumers/share-groups/<group>``: a share group's settings, its members,
and the state of each of its share-partitions (the records in flight, in ranges).

A share group is a queue over topics: every member may receive records of every partition,
each record is locked to one member at a time, and acknowledged one by one (KIP-932's share
groups). The rules of the state are pure functions in :mod:`coordinator.share_partition`; this
module only says what the znodes hold and decodes them, refusing anything this protocol does
not write (:class:`~coordinator.errors.CorruptZnode`).

The state of a share-partition (one znode, bounded by the group's
``share.partition.max.record.locks``)::

    {"version": 1, "start": S, "end": E, "next_token": T, "dlq_scan": D,
     "ranges": [[first, last, state, deliveries, token, extra], ...],
     "held": {"<token>": [holder, renewals], ...}, "writes": [write id, ...]}

Every offset below ``start`` is done (accepted or archived). ``[start, end)`` is the window of
records delivered at least once; the ranges cover it exactly, in order, without a gap. Offsets
from ``end`` on were never delivered. A range's ``state`` is one of ``RANGE_STATES``;
``token`` names the acquisition that holds it (``held`` says by whom, and how often it was
renewed); ``extra`` is the delay of a delayed range (ms) or the reason of an archived one.
``writes`` are the ids of the last members' writes (a writer whose answer was lost looks for its
own). ``dlq_scan`` (-1: none) is where, in the dead-letter topic's partition, a writer that takes
over pending dead letters starts looking for the ones already written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from coordinator.errors import InvalidConfig, InvalidName
from coordinator.protocol.codec import check_version, dump, is_int, load, now_ms, require
from coordinator.protocol.paths import validate_name

SHARE_GROUPS = "/consumers/share-groups"

# The states of a range of a share-partition.
AVAILABLE = "av"      # may be acquired (delivered before: ``deliveries`` times)
ACQUIRED = "aq"       # locked to the holder of ``token`` until it acknowledges or its lock ends
DELAYED = "dl"        # released with a delay (``extra`` ms): available once the decider's clock says so
ACCEPTED = "ok"       # done: processed
ARCHIVED = "ar"       # done: rejected or past the delivery limit (dead-lettered, if the group has a topic)
DEAD_LETTER = "dq"    # archived, its dead letter not written yet (``extra``: the reason)
WRITING = "dw"        # archived, its dead letter being written by the holder of ``token``
RANGE_STATES = (AVAILABLE, ACQUIRED, DELAYED, ACCEPTED, ARCHIVED, DEAD_LETTER, WRITING)
#: States whose range has a token in ``held``.
HELD_STATES = (ACQUIRED, WRITING)
#: States of records that are done (the start moves over them).
DONE_STATES = (ACCEPTED, ARCHIVED)

# Why a record was archived (``extra`` of DEAD_LETTER and WRITING ranges; a dead letter's header).
REJECTED, DELIVERY_LIMIT = 1, 2
REASONS = {REJECTED: "rejected", DELIVERY_LIMIT: "delivery-limit"}

#: The most deliveries a record can be counted (the limit's maximum is 10).
MAX_DELIVERIES = 100
#: No window is wider than the largest lock limit: a decoder refuses what no writer makes.
MAX_WINDOW = 10_000
#: The ids of the last writes kept in the state: a writer whose answer was lost finds its own there.
RECENT_WRITES = 16
#: Acquisitions held at once per share-partition (each names its holder). With the widest window
#: cut into one range per record, the znode stays under 700 KB (ZooKeeper's limit is 1 MB).
MAX_HELD_TOKENS = 500


# ---------------------------------------------------------------- paths

def share_group_path(group: str) -> str:
    """The share group's znode; its data is the group's :class:`ShareGroupConfig`."""
    return f"{SHARE_GROUPS}/{validate_name(group, 'group')}"


def share_members_path(group: str, member_id: Optional[str] = None) -> str:
    base = f"{share_group_path(group)}/members"
    return base if member_id is None else f"{base}/{validate_name(member_id, 'member id')}"


def share_partitions_path(group: str, topic: Optional[str] = None, partition: Optional[int] = None) -> str:
    base = f"{share_group_path(group)}/partitions"
    if topic is None:
        return base
    base += "/" + validate_name(topic)
    return base if partition is None else f"{base}/{int(partition)}"


# ---------------------------------------------------------------- the group's settings

@dataclass(frozen=True)
class Setting:
    default: object
    low: int = 0
    high: int = 0
    choices: Tuple[str, ...] = ()
    doc: str = ""


#: Every group-level setting, under Kafka's names where Kafka has one.
SETTINGS: Dict[str, Setting] = {
    "share.record.lock.duration.ms": Setting(30_000, 1_000, 3_600_000,
                                             doc="how long a record stays locked to the member that acquired it"),
    "share.delivery.count.limit": Setting(5, 2, 10, doc="deliveries of a record before it is archived"),
    "share.partition.max.record.locks": Setting(2_000, 100, MAX_WINDOW,
                                                doc="records in flight per partition (the window's width)"),
    "share.auto.offset.reset": Setting("latest", choices=("latest", "earliest"),
                                       doc="where a share-partition starts when it has no state yet"),
    "errors.deadletterqueue.topic.name": Setting("", doc="where archived records are written (empty: nowhere)"),
    "share.redelivery.backoff.ms": Setting(0, 0, 3_600_000,
                                           doc="the delay before a released or expired record is delivered "
                                               "again, doubled per delivery (0: at once)"),
    "share.redelivery.backoff.max.ms": Setting(60_000, 0, 3_600_000, doc="the backoff's maximum"),
}


@dataclass(frozen=True)
class ShareGroupConfig:
    """The share group's settings (the group znode's data): the same for every member, read by
    the members and by the group's coordinator."""
    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    max_record_locks: int = 2_000
    auto_offset_reset: str = "latest"
    dead_letter_topic: str = ""
    backoff_ms: int = 0
    backoff_max_ms: int = 60_000

    _FIELDS = {"share.record.lock.duration.ms": "lock_duration_ms",
               "share.delivery.count.limit": "delivery_count_limit",
               "share.partition.max.record.locks": "max_record_locks",
               "share.auto.offset.reset": "auto_offset_reset",
               "errors.deadletterqueue.topic.name": "dead_letter_topic",
               "share.redelivery.backoff.ms": "backoff_ms",
               "share.redelivery.backoff.max.ms": "backoff_max_ms"}

    def settings(self) -> Dict[str, object]:
        """{Kafka-style key: value} of every setting."""
        return {key: getattr(self, name) for key, name in self._FIELDS.items()}

    def with_settings(self, updates: Dict[str, str]) -> "ShareGroupConfig":
        """This config with ``updates`` ({key: text}) applied; InvalidConfig names a bad key or value."""
        values = self.settings()
        for key, text in updates.items():
            values[key] = parse_setting(key, text)
        return ShareGroupConfig(**{self._FIELDS[k]: v for k, v in values.items()})

    def redelivery_delay_ms(self, deliveries: int) -> int:
        """The backoff before a record delivered ``deliveries`` times is available again."""
        if not self.backoff_ms or deliveries < 1:
            return 0
        return min(self.backoff_max_ms, self.backoff_ms << min(deliveries - 1, 30))

    def encode(self) -> bytes:
        return dump({"version": 1, "settings": self.settings(), "timestamp": now_ms()})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "ShareGroupConfig":
        if not raw:
            return cls()   # a group znode made bare (by a tool) has the defaults
        obj = load(raw, path, "share group settings")
        check_version(obj, path, "share group settings")
        settings = obj.get("settings")
        require(isinstance(settings, dict), path, "share group settings have no 'settings' object")
        try:
            return cls().with_settings({k: str(v) for k, v in settings.items()})
        except InvalidConfig as e:
            from coordinator.errors import CorruptZnode
            raise CorruptZnode(path, str(e)) from None


def parse_setting(key: str, text: str):
    """The value of one setting from its text; InvalidConfig in one line for a bad key or value."""
    setting = SETTINGS.get(key)
    if setting is None:
        raise InvalidConfig(f"unknown share group setting {key[:60]!r} (known: {', '.join(SETTINGS)})")
    text = str(text).strip()
    if setting.choices:
        if text not in setting.choices:
            raise InvalidConfig(f"{key} must be one of {', '.join(setting.choices)}, not {text[:40]!r}")
        return text
    if isinstance(setting.default, str):
        if text:
            try:
                validate_name(text)
            except InvalidName as e:
                raise InvalidConfig(f"{key}: {e}") from None
        return text
    try:
        value = int(text)
    except ValueError:
        raise InvalidConfig(f"{key} must be a whole number, not {text[:40]!r}") from None
    if not setting.low <= value <= setting.high:
        raise InvalidConfig(f"{key} must be between {setting.low:,} and {setting.high:,}, not {value:,}")
    return value


# ---------------------------------------------------------------- members

@dataclass
class ShareMember:
    """members/<member id> (ephemeral): what a member subscribes to, for the tools and its coordinator."""
    topics: List[str]
    pattern: str = ""
    host: str = ""
    client_id: str = ""
    timestamp: int = 0

    def encode(self) -> bytes:
        return dump({"version": 1, "topics": self.topics, "pattern": self.pattern, "host": self.host,
                     "client_id": self.client_id, "timestamp": self.timestamp or now_ms()})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "ShareMember":
        obj = load(raw, path, "share member")
        check_version(obj, path, "share member")
        topics = obj.get("topics")
        require(isinstance(topics, list) and all(isinstance(t, str) for t in topics), path,
                "share member's topics are not a list of names")
        texts = [obj.get(k, "") for k in ("pattern", "host", "client_id")]
        require(all(isinstance(t, str) for t in texts), path, "share member has a field that is not text")
        stamp = obj.get("timestamp", 0)
        require(is_int(stamp), path, "share member's timestamp is not a whole number")
        return cls(topics, *texts, timestamp=stamp)


# ---------------------------------------------------------------- a share-partition's state

@dataclass
class SharePartitionState:
    """partitions/<topic>/<partition>: the window of records in flight (see the module's docstring).

    ``ranges`` are lists ``[first, last, state, deliveries, token, extra]`` covering
    ``[start, end)``; ``held`` maps a token to ``[holder, renewals]``."""
    start: int = 0
    end: int = 0
    ranges: List[list] = field(default_factory=list)
    held: Dict[int, list] = field(default_factory=dict)
    next_token: int = 1
    dlq_scan: int = -1
    writes: List[str] = field(default_factory=list)   # the ids of the last RECENT_WRITES member writes

    def encode(self) -> bytes:
        return dump({"version": 1, "start": self.start, "end": self.end, "next_token": self.next_token,
                     "dlq_scan": self.dlq_scan, "ranges": self.ranges,
                     "held": {str(t): h for t, h in self.held.items()}, "writes": self.writes})

    @classmethod
    def decode(cls, raw: bytes, path: str) -> "SharePartitionState":
        obj = load(raw, path, "share-partition state")
        check_version(obj, path, "share-partition state")
        start, end, next_token, dlq_scan = (obj.get(k) for k in ("start", "end", "next_token", "dlq_scan"))
        require(all(is_int(v) for v in (start, end, next_token, dlq_scan)), path,
                "share-partition state has a position that is not a whole number")
        require(0 <= start <= end and end - start <= MAX_WINDOW and next_token >= 1 and dlq_scan >= -1, path,
                f"share-partition state's window [{start}, {end}) or token {next_token} is out of range")
        held = _decode_held(obj.get("held"), next_token, path)
        ranges = obj.get("ranges")
        require(isinstance(ranges, list), path, "share-partition state's ranges are not a list")
        expected = start
        for r in ranges:
            _check_range(r, expected, held, next_token, path)
            expected = r[1] + 1
        require(expected == end, path, f"share-partition state's ranges end at {expected}, not at {end}")
        writes = obj.get("writes", [])
        require(isinstance(writes, list) and len(writes) <= RECENT_WRITES
                and all(isinstance(w, str) and len(w) <= 300 for w in writes), path,
                "share-partition state's recent writes are not a short list of ids")
        return cls(start, end, ranges, held, next_token, dlq_scan, writes)


def _decode_held(held, next_token: int, path: str) -> Dict[int, list]:
    require(isinstance(held, dict) and len(held) <= MAX_HELD_TOKENS, path,
            "share-partition state's held tokens are not an object of at most 500")
    out = {}
    for text, value in held.items():
        require(text.isdigit() and len(text) < 19 and 0 < int(text) < next_token, path,
                f"share-partition state holds an unknown token {text[:24]!r}")
        require(isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and is_int(value[1])
                and value[1] >= 0, path, f"share-partition state's token {text} is not [holder, renewals]")
        out[int(text)] = value
    return out


def _check_range(r, expected: int, held: Dict[int, list], next_token: int, path: str) -> None:
    require(isinstance(r, list) and len(r) == 6 and all(is_int(r[i]) for i in (0, 1, 3, 4, 5)), path,
            "a share-partition range is not [first, last, state, deliveries, token, extra]")
    first, last, state, deliveries, token, extra = r
    require(first == expected and first <= last, path,
            f"share-partition range [{first}, {last}] does not follow offset {expected - 1}")
    require(state in RANGE_STATES, path, f"share-partition range has an unknown state {str(state)[:8]!r}")
    require(0 <= deliveries <= MAX_DELIVERIES and 0 <= token < next_token and extra >= 0, path,
            f"share-partition range [{first}, {last}] has a count, token or extra out of range")
    require(state not in HELD_STATES or token in held, path,
            f"share-partition range [{first}, {last}] is held by token {token}, which is not held")
