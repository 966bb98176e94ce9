"""Where everything is: the names zkgroups accepts and the path of every znode it reads or
writes (the layout: :mod:`coordinator.protocol`). Nothing outside this package builds a path."""
from __future__ import annotations

import re
import zlib
from functools import lru_cache
from typing import Optional

import re2

from coordinator.errors import InvalidName

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

MAX_NAME_LENGTH = 249
#: Kafka's legal characters of a topic (and here group, node, instance) name.
LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


# ---------------------------------------------------------------- names

def validate_name(name: str, kind: str = "topic") -> str:
    """Kafka's rules for topic (and here group) names: [a-zA-Z0-9._-], 1-249, not . or .."""
    if not isinstance(name, str) or not name:
        raise InvalidName(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(f"{kind} name {name[:40]!r}... is longer than {MAX_NAME_LENGTH} characters")
    if name in (".", ".."):
        raise InvalidName(f"{kind} name cannot be {name!r}")
    if not LEGAL_NAME.match(name):
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


def completed_path(group: str, topic: Optional[str] = None, partition: Optional[int] = None) -> str:
    """Where a parallel consumer keeps the offsets completed above a partition's committed one."""
    base = f"{GROUPS}/{group}/completed"
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
