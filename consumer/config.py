"""The consumer's configuration (:class:`ConsumerConfig`) and its subscription.

A key kafka-python documents but zkgroups does not offer is refused in one line that names
the zkgroups equivalent (:mod:`consumer.kafka_python`); any other unknown key gets
:func:`coordinator.config.build`'s "unknown key" line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

from coordinator import config as cfg
from coordinator import protocol
from coordinator.acl import parse_auth
from coordinator.zktls import parse_tls
from coordinator.assignors import STRATEGIES
from coordinator.errors import InvalidConfig
from coordinator.metrics_server import check_port
from consumer import deserializers
from consumer.kafka_python import KAFKA_PYTHON_CONSUMER

START_POSITIONS = ("committed", "earliest", "latest", "timestamp")

#: What ``Consumer(topics=...)`` takes: topic names (one name as a string), or {topic: streams}.
Topics = Union[None, str, Iterable[str], Mapping[str, int]]

@dataclass
class ConsumerConfig:
    auto_offset_reset: str = "latest"          # earliest | latest | none (no committed offset)
    enable_auto_commit: bool = True            # commit positions from poll() and before partitions are revoked
    auto_commit_interval_ms: int = 5000        # at most this often
    max_poll_records: int = 500                # records one poll() returns at most, fairly across partitions
    max_poll_interval_ms: int = 300000         # no poll() for this long: leave the group (rejoin on the next poll)
    session_timeout_ms: int = cfg.DEFAULT_SESSION_TIMEOUT_MS   # the ZooKeeper session: liveness
    fetch_max_bytes: int = 52428800            # bytes one fetch reads at most
    max_partition_fetch_bytes: int = 1048576   # bytes one fetch reads from a partition at most
    fetch_max_wait_ms: int = 100               # idle partitions are looked at again this often
    client_id: str = "zkgroups"                # shown in groups describe and the metrics
    assignment_strategy: tuple = ("sticky", "range")   # preferred first; range: what older members list
    start_position: str = "committed"          # committed | earliest | latest | timestamp (seed 002)
    start_timestamp_ms: int = 0                # for start_position = "timestamp"
    connect_timeout_s: float = 10.0            # to connect (else ZooKeeperUnavailable); a later loss is waited out
    bootstrap_servers: str = ""                # Kafka brokers; "" (and no KAFKA_BOOTSTRAP_SERVERS): the embedded log
    kafka_commit_offsets: bool = False         # also copy commits to Kafka (after ZooKeeper's) for Kafka's tools
    metrics_port: Optional[int] = None         # serve Prometheus metrics on this port (0: any free one); None: off
    group_instance_id: str = ""                # a static member (Kafka's group.instance.id); "": dynamic
    static_grace_ms: int = 0                   # how long a static member's partitions wait for it; 0: session_timeout_ms
    consumer_timeout_ms: Optional[float] = None  # iteration ends after this long without a record; None: never
    key_deserializer: Optional[Callable[[bytes], Any]] = dataclass_field(default=None, repr=False)  # bytes -> key
    value_deserializer: Optional[Callable[[bytes], Any]] = dataclass_field(default=None, repr=False)  # bytes -> value
    zk_auth: Any = dataclass_field(default=None, repr=False)  # the group's ZooKeeper identity: user:password or @file
    zk_tls: Any = dataclass_field(default=None, repr=False)   # TLS to ZooKeeper: {"ca", "cert", "key", ...}; None: plaintext
    zk_sasl: Any = dataclass_field(default=None, repr=False)  # the group's SASL (DIGEST-MD5) identity: user:password or @file

    def validate(self) -> None:
        self.zk_auth = parse_auth(self.zk_auth, "zk_auth")  # a file reference is read now; errors never show it
        self.zk_tls = parse_tls(self.zk_tls, "zk_tls")  # its files are checked now (coordinator/zktls.py)
        self.zk_sasl = parse_auth(self.zk_sasl, "zk_sasl")
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise InvalidConfig(f"auto_offset_reset must be earliest, latest or none, not {self.auto_offset_reset!r}")
        if self.start_position not in START_POSITIONS:
            raise InvalidConfig(f"start_position must be one of {', '.join(START_POSITIONS)}")
        cfg.positive(self, "auto_commit_interval_ms", "max_poll_records", "max_poll_interval_ms",
                     "session_timeout_ms", "fetch_max_bytes", "max_partition_fetch_bytes")
        if self.metrics_port is not None:
            check_port(self.metrics_port, "metrics_port")
        if self.group_instance_id:
            protocol.validate_name(self.group_instance_id, "group instance id")
        if self.static_grace_ms < 0:
            raise InvalidConfig("static_grace_ms must not be negative (0: the session timeout)")
        self._validate_iteration()
        if isinstance(self.assignment_strategy, str):
            self.assignment_strategy = (self.assignment_strategy,)
        self.assignment_strategy = tuple(self.assignment_strategy)
        unknown = [s for s in self.assignment_strategy if s not in STRATEGIES]
        if unknown or not self.assignment_strategy:
            raise InvalidConfig(f"assignment_strategy: unknown strategy {unknown[0]!r} (known: "
                                f"{', '.join(sorted(STRATEGIES))})" if unknown else
                                "assignment_strategy must name at least one strategy")

    def _validate_iteration(self) -> None:
        timeout = self.consumer_timeout_ms
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
                raise InvalidConfig(f"consumer_timeout_ms must be a number >= 0 (or None: never), got {timeout!r}")
            if math.isinf(timeout):  # kafka-python's default, float('inf'): iterate until closed
                self.consumer_timeout_ms = None
        for name in ("key_deserializer", "value_deserializer"):
            value = getattr(self, name)
            if value is not None and not deserializers.usable(value):
                raise InvalidConfig(f"{name} must be callable (bytes -> value) or have deserialize(), "
                                    f"got {type(value).__name__}")


def build_consumer_config(values: Mapping[str, Any]) -> ConsumerConfig:
    return cfg.build(ConsumerConfig, values, "consumer config", hints=KAFKA_PYTHON_CONSUMER)


def subscription_of(topics: Topics, pattern: Optional[str], exclude: bool) -> Tuple[Dict[str, int], str]:
    """({topic or regex: streams}, its kind in the member's registration) of a Consumer's
    ``topics`` or ``pattern``."""
    if (topics is None) == (pattern is None):
        raise InvalidConfig("give either topics or pattern")
    if pattern is not None:
        return {pattern: 1}, protocol.PATTERN_BLACK_LIST if exclude else protocol.PATTERN_WHITE_LIST
    if isinstance(topics, str):  # Consumer("billing", "orders"): one topic, not five letters
        topics = [topics]
    return (dict(topics) if isinstance(topics, dict) else {t: 1 for t in topics}), protocol.PATTERN_STATIC
