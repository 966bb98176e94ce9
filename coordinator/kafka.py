"""Kafka clients the way zkgroups wants them, for both sides (the coordinator mirrors topics of
KRaft clusters; the consumer side reads and writes records): bootstrap servers checked up
front, librdkafka properties from the user's ``[kafka]`` table merged with what zkgroups must
own, librdkafka's log lines routed to Python logging, its global errors reported once a while.
confluent-kafka is imported only when Kafka is used (the ``kafka`` extra).
"""
from __future__ import annotations

import logging
import time
from typing import Dict, Mapping, Optional

from coordinator.errors import InvalidConfig, RetriableError

log = logging.getLogger("zkgroups.kafka")

#: How long a metadata or offsets request may take before the brokers count as unreachable.
DEFAULT_TIMEOUT_S = 10.0


class KafkaUnavailable(RetriableError):
    """The Kafka cluster did not answer in time (brokers down, wrong bootstrap servers)."""


def confluent_kafka():
    try:
        import confluent_kafka
    except ImportError:
        raise InvalidConfig("the Kafka data plane needs confluent-kafka: pip install 'zkgroups[kafka]'") from None
    return confluent_kafka


def check_bootstrap_servers(servers: str) -> str:
    """``host:port[,host:port...]`` (one line InvalidConfig otherwise)."""
    parts = [s.strip() for s in servers.split(",")]
    for part in parts:
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfig(f"bootstrap servers {servers!r}: {part!r} is not host:port")
    return ",".join(parts)


def librdkafka_config(servers: str, user: Optional[Mapping[str, object]], defaults: Mapping[str, object],
                      forced: Mapping[str, object] = None) -> dict:
    """The librdkafka configuration: defaults, then the user's ``[kafka]`` properties (security,
    SASL, SSL, tuning), then what zkgroups must own; conflicts are one-line errors."""
    user = dict(user or {})
    for key in ("bootstrap.servers", "group.id", "logger", *(forced or {})):
        if key in user:
            raise InvalidConfig(f"[kafka] {key} is set by zkgroups and cannot be given")
    return {**defaults, **user, **(forced or {}), "bootstrap.servers": servers,
            "logger": log, "error_cb": log_client_error}


_last_error: Dict[str, float] = {}


def log_client_error(err) -> None:
    """librdkafka's global errors (all brokers down, ...): one line per kind per 30 s. They are
    retried inside librdkafka; readers and writers see them only if they last."""
    name = err.name()
    now = time.monotonic()
    if now - _last_error.get(name, -1e9) >= 30:
        _last_error[name] = now
        log.warning("Kafka: %s", err.str())
