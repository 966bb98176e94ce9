"""The topic registry: /brokers/topics/<topic> in Kafka's own JSON format.

Partitions can be added, never removed, up to :data:`~coordinator.protocol.cluster.MAX_PARTITIONS` per topic. Topic
names are checked (:func:`protocol.validate_name`) before any path is built. The coordinator
watches these znodes; producers and consumers read partition counts from them.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from kazoo.exceptions import NodeExistsError, NoNodeError

from coordinator import protocol
from coordinator.errors import CorruptZnode, InvalidPartitions, TopicExists, UnknownTopic
from coordinator.protocol import TopicZnode
from coordinator.zkclient import riding_out_failover


class TopicRegistry:
    def __init__(self, client):
        self.client = client

    def create(self, topic: str, partitions: int) -> None:
        protocol.validate_name(topic)
        _check_count(partitions)
        self.client.ensure_path(protocol.BROKER_TOPICS)
        try:
            self.client.create(protocol.topic_path(topic), protocol.encode_topic(partitions))
        except NodeExistsError:
            raise TopicExists(topic) from None

    def ensure(self, topic: str, partitions: int) -> int:
        """Create the topic if it is missing; return its partition count."""
        try:
            self.create(topic, partitions)
            return partitions
        except TopicExists:
            return self.partitions(topic)

    def list(self) -> List[str]:
        try:
            return sorted(self.client.get_children(protocol.BROKER_TOPICS))
        except NoNodeError:
            return []

    def partitions(self, topic: str) -> int:
        protocol.validate_name(topic)
        return self._partitions(topic)

    @riding_out_failover()
    def _partitions(self, topic: str) -> int:
        path = protocol.topic_path(topic)
        try:
            raw, _ = self.client.get(path)
        except NoNodeError:
            raise UnknownTopic(topic) from None
        return protocol.decode_topic(raw, path)

    def all_partitions(self) -> Dict[str, int]:
        """{topic: partitions} for every readable topic; corrupt ones are left out."""
        return {topic: znode.partitions for topic, (znode, _) in self.znodes().items() if znode is not None}

    def znodes(self) -> Dict[str, Tuple[Optional[TopicZnode], int]]:
        """{topic: (its znode decoded, or None if unreadable; the znode's version)}, read in
        one round trip."""
        asyncs = [(t, self.client.get_async(protocol.topic_path(t))) for t in self.list()]
        result = {}
        for topic, a in asyncs:
            try:
                raw, stat = a.get()
            except NoNodeError:
                continue
            try:
                result[topic] = (protocol.decode_topic_znode(raw, protocol.topic_path(topic)), stat.version)
            except CorruptZnode:
                result[topic] = (None, stat.version)
        return result

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow ``topic`` to ``total`` partitions (compare-and-set on the znode version).
        Idempotent, so a connection lost mid-call is retried."""
        protocol.validate_name(topic)
        _check_count(total)
        self._add_partitions(topic, total)

    @riding_out_failover()
    def _add_partitions(self, topic: str, total: int) -> None:
        path = protocol.topic_path(topic)
        try:
            raw, stat = self.client.get(path)
        except NoNodeError:
            raise UnknownTopic(topic) from None
        current = protocol.decode_topic(raw, path)
        if total < current:
            raise InvalidPartitions(f"topic {topic!r} has {current} partitions; partitions cannot be removed")
        if total == current:
            return
        self.client.set(path, protocol.encode_topic(total), version=stat.version)


def _check_count(partitions) -> None:
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidPartitions(f"partitions must be a whole number >= 1, got {partitions!r}")
    if partitions > protocol.MAX_PARTITIONS:
        raise InvalidPartitions(f"partitions must be at most {protocol.MAX_PARTITIONS:,} per topic, got {partitions:,}")
