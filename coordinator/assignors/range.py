"""The ``range`` strategy: the legacy Kafka ZooKeeper consumer's per-topic range assignment.

For each topic on its own, the streams subscribed to it are sorted (see :func:`stream_key`),
the partitions ``0..P-1`` are cut into ``S`` contiguous ranges, and the first ``P % S`` streams
get one partition more than the others (Kafka 0.8's ``RangeAssignor``). With more streams than
partitions the last streams stay idle. Per topic the counts differ by at most one; across
topics the first streams in the order are favoured every time, which is what ``roundrobin``
avoids.

This module also holds the input checks and the stream bookkeeping shared with
:mod:`coordinator.assignors.roundrobin` and :mod:`coordinator.assignors.sticky`.

Stream order: by consumer id (plain string order), then by stream index as a *number*, so
``c-2`` comes before ``c-10``. Kafka 0.8 compared the thread-id strings and put ``c-10``
before ``c-2``; the numeric order keeps a member's streams in the order it created them.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

from coordinator.protocol import Ownership, stream_id

Members = Mapping[str, Mapping[str, int]]  # consumer id -> {topic: number of streams}
Partitions = Mapping[str, int]             # topic -> partition count
StreamKey = Tuple[str, int]                # (consumer id, stream index)

NAME = "range"


def stream_key(consumer_id: str, index: int) -> StreamKey:
    """The sort key of a stream: consumer id as a string, then the index as a number."""
    return (consumer_id, index)


def check_input(members: Members, partitions: Partitions) -> None:
    """Reject malformed input with ValueError. The coordinator passes registrations that
    :class:`coordinator.protocol.Registration` already validated, so this only fires on a bug."""
    for topic, count in partitions.items():
        if not isinstance(topic, str) or isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"partitions must map topic -> count >= 0, got {topic!r}: {count!r}")
    for cid, subscription in members.items():
        if not isinstance(cid, str) or not cid:
            raise ValueError(f"consumer ids must be non-empty strings, got {cid!r}")
        for topic, streams in subscription.items():
            if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
                raise ValueError(f"member {cid!r} subscribes to {topic!r} with {streams!r} streams; "
                                 f"must be an int >= 1")


def streams_by_topic(members: Members, partitions: Partitions) -> Dict[str, List[StreamKey]]:
    """topic -> sorted stream keys subscribed to it, for topics that exist and have at least one
    subscriber. Topics a member names that are not in ``partitions`` (deleted since the
    subscription was resolved) are ignored. Keys are inserted in sorted topic order."""
    out: Dict[str, List[StreamKey]] = {}
    for cid, subscription in members.items():
        for topic, streams in subscription.items():
            if topic in partitions:
                out.setdefault(topic, []).extend(stream_key(cid, i) for i in range(streams))
    return {topic: sorted(out[topic]) for topic in sorted(out)}


def assign(members: Members, partitions: Partitions, previous: Optional[Ownership] = None) -> Ownership:
    """Range assignment; see the module docstring. Pure and deterministic: the result does not
    depend on the iteration order of either mapping. O(P + S log S). ``previous`` (the group's
    last assignment) is accepted for the common strategy signature and ignored."""
    check_input(members, partitions)
    result: Ownership = {}
    for topic, streams in streams_by_topic(members, partitions).items():
        count = partitions[topic]
        per_stream, extra = divmod(count, len(streams))
        owned: Dict[int, str] = {}
        partition = 0
        for position, (cid, index) in enumerate(streams):
            n = per_stream + (1 if position < extra else 0)
            if n == 0:
                break  # more streams than partitions: the rest stay idle
            sid = stream_id(cid, index)
            for p in range(partition, partition + n):
                owned[p] = sid
            partition += n
        result[topic] = owned
    return result
