"""The ``roundrobin`` strategy: partitions dealt one at a time around a ring of all streams.

All partitions of all subscribed topics are sorted by ``(topic, partition)`` (topic names as
strings, partitions as numbers) and dealt in turn around one circular list of every stream of
the group, sorted as in :func:`coordinator.assignors.range.stream_key`. A stream that is not
subscribed to a partition's topic is skipped; the position in the ring carries over from one
topic to the next. This is Kafka's ``RoundRobinAssignor`` (the new consumer's), applied to
streams instead of members. Kafka 0.8's ZooKeeper consumer had a round-robin assignor that
required identical subscriptions and ordered partitions by a hash; we follow the later,
general form.

Stream ``<cid>-<i>`` is subscribed to topic ``t`` when member ``cid`` subscribes to ``t`` with
more than ``i`` streams. The ring holds, per member, streams ``0..max_t(n_t)-1``.

Balance: when every stream is subscribed to every topic, the number of partitions per stream
differs by at most one over the whole group. With differing subscriptions the skipping can
leave it less even (as in Kafka); every partition is still owned by a subscribed stream.

Cost: instead of stepping over unsubscribed streams one by one, each topic keeps the sorted
ring positions of its subscribers and finds the next one with a binary search, so the result
is identical to the step-by-step walk in O(P log S + S log S).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Dict, List, Optional

from coordinator.assignors.range import Members, Partitions, check_input, stream_key, streams_by_topic
from coordinator.protocol import Ownership, stream_id

NAME = "roundrobin"


def assign(members: Members, partitions: Partitions, previous: Optional[Ownership] = None) -> Ownership:
    """Round-robin assignment; see the module docstring. Pure and deterministic. ``previous``
    (the group's last assignment) is accepted for the common strategy signature and ignored."""
    check_input(members, partitions)
    by_topic = streams_by_topic(members, partitions)
    ring = sorted(stream_key(cid, i)
                  for cid, subscription in members.items()
                  for i in range(max(subscription.values(), default=0)))
    position = {key: n for n, key in enumerate(ring)}
    ids = [stream_id(cid, i) for cid, i in ring]

    result: Ownership = {}
    cursor = 0  # ring position of the next stream to consider
    for topic, streams in by_topic.items():  # sorted by topic
        subscribed: List[int] = [position[key] for key in streams]  # sorted, since streams are
        owned: Dict[int, str] = {}
        for partition in range(partitions[topic]):
            k = bisect_left(subscribed, cursor)
            if k == len(subscribed):
                k = 0  # wrap around the ring
            owned[partition] = ids[subscribed[k]]
            cursor = subscribed[k] + 1
        result[topic] = owned
    return result
