"""The timestamps of records at given offsets, read from a data plane: what lag in seconds
(:mod:`coordinator.lagtime`) needs of the oldest unconsumed record of a partition.

Bounded: one record is read per (topic, partition, offset) asked; on Kafka every partition
asked is read by one ``assign()`` of a client of its own (fetches of at most
:data:`PARTITION_FETCH_BYTES` a partition), until each has handed out a record or
``timeout_s`` passed; on the embedded log each is one ``fetch`` of one record. An offset
below the earliest the data plane still holds (retention deleted the record) reads the
earliest record held: the oldest one the group can still consume. What cannot be read (a
topic gone, a record not arrived in time) is left out: its lag in seconds is unknown.

Threads: one caller at a time (the console's lag reader, the exporter, a command).
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Sequence

from consumer.records import TopicPartition
from coordinator.errors import OffsetOutOfRange, UnknownTopic
from coordinator.kafka import confluent_kafka
from coordinator.lagtime import Spot

log = logging.getLogger("zkgroups.lag")

#: What one fetch may bring of a partition (librdkafka still returns a whole first batch).
PARTITION_FETCH_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 5.0


class RecordTimesReader:
    """Reads record timestamps from ``plane`` (a :class:`~consumer.dataplane.DataPlane`, not
    owned: closing the reader closes only its own Kafka client)."""

    def __init__(self, plane, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.plane, self.timeout_s = plane, timeout_s
        self._kafka = None

    def __call__(self, spots: Sequence[Spot]) -> Dict[Spot, int]:
        """{spot: timestamp ms} of the record at each spot that could be read."""
        if not spots:
            return {}
        spots = self._clamped(spots)
        if self.plane.name == "kafka":
            out: Dict[Spot, int] = {}
            for round_ in _rounds(list(spots)):  # a client assigns a partition once at a time
                out.update(self._kafka_round(round_, spots))
            return out
        return self._embedded(spots)

    def close(self) -> None:
        client, self._kafka = self._kafka, None
        if client is not None:
            client.close()

    def _clamped(self, spots: Sequence[Spot]) -> Dict[Spot, List[Spot]]:
        """{where to read: the spots asked}: an offset below the earliest held reads the earliest
        (so may several: groups at different offsets retention passed)."""
        tps = sorted({TopicPartition(t, p) for t, p, _ in spots})
        earliest: Dict[TopicPartition, int] = {}
        for topic in sorted({tp.topic for tp in tps}):
            try:
                earliest.update(self.plane.earliest_offsets([tp for tp in tps if tp.topic == topic]))
            except UnknownTopic:
                continue
        out: Dict[Spot, List[Spot]] = {}
        for t, p, o in spots:
            if TopicPartition(t, p) in earliest:
                out.setdefault((t, p, max(o, earliest[TopicPartition(t, p)])), []).append((t, p, o))
        return out

    def _embedded(self, spots: Dict[Spot, List[Spot]]) -> Dict[Spot, int]:
        out = {}
        for (topic, partition, offset), asked in spots.items():
            try:
                records = self.plane.fetch(TopicPartition(topic, partition), offset, max_records=1, max_bytes=1)
            except (OffsetOutOfRange, UnknownTopic):
                continue  # deleted meanwhile: asked again next time
            if records:
                out.update(dict.fromkeys(asked, records[0].timestamp))
        return out

    def _kafka_round(self, spots: List[Spot], asked: Dict[Spot, List[Spot]]) -> Dict[Spot, int]:
        ck = confluent_kafka()
        client = self._kafka_client()
        wanted = {(t, p): o for t, p, o in spots}
        assignment = [ck.TopicPartition(t, p, o) for (t, p), o in wanted.items()]
        client.assign(assignment)
        out: Dict[Spot, int] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            while wanted and time.monotonic() < deadline:
                for message in client.consume(num_messages=1000, timeout=0.1):
                    pair = (message.topic(), message.partition())
                    if pair not in wanted or message.error() is not None or message.offset() < wanted[pair]:
                        continue
                    kind, ts = message.timestamp()
                    if kind != ck.TIMESTAMP_NOT_AVAILABLE:
                        out.update(dict.fromkeys(asked[(*pair, wanted[pair])], ts))
                    del wanted[pair]
                    client.pause([ck.TopicPartition(*pair)])
        finally:
            client.resume(assignment)  # librdkafka keeps a pause across assignments
            client.unassign()
        if wanted:
            log.debug("lag: no record of %d partitions arrived within %gs", len(wanted), self.timeout_s)
        return out

    def _kafka_client(self):
        if self._kafka is None:
            plane = self.plane
            config = {**plane.consumer_config("zkgroups-lag"), "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
                      "fetch.wait.max.ms": 10}
            self._kafka = plane.new_client(confluent_kafka().Consumer, config)
        return self._kafka


def _rounds(spots: List[Spot]) -> List[List[Spot]]:
    """The spots split so that no round has a partition twice (groups at different offsets)."""
    rounds: List[List[Spot]] = []
    taken: List[set] = []
    for spot in spots:
        for i, pairs in enumerate(taken):
            if spot[:2] not in pairs:
                rounds[i].append(spot)
                pairs.add(spot[:2])
                break
        else:
            rounds.append([spot])
            taken.append({spot[:2]})
    return rounds
