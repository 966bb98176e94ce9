"""The ``sticky`` strategy: range's per-topic balance, moving as few partitions as possible.

``range`` and ``roundrobin`` recompute the assignment from scratch, so one member joining a
group of ten on 100 partitions moves most of them from one stream to another: every moved
partition means a fetcher stopped, offsets committed and another fetcher started on another
member. ``sticky`` also takes the group's *previous* assignment (the ownership of the last
generation, as stored in the group state) and keeps every partition that can stay where it is.

For each topic on its own (like ``range``), with the ``S`` streams subscribed to it sorted by
:func:`coordinator.assignors.range.stream_key` and ``P`` partitions:

1. *kept*: for each stream, the partitions of the topic that ``previous`` gave to it, if the
   stream is still subscribed to the topic and the partition still exists (``< P``).
2. *capacity*: ``base, extra = divmod(P, S)``; every stream may hold ``base`` partitions and
   ``extra`` of them ``base + 1`` — the same counts as ``range``, so per topic the counts differ
   by at most one. The ``base + 1`` slots go to the streams with the most kept partitions (ties
   in stream order): that is what lets the most partitions stay.
3. each stream keeps its lowest kept partitions up to its capacity; the others are released.
4. the pool — released partitions, partitions whose previous owner left or unsubscribed, new
   partitions — is dealt in ascending order to the streams in stream order, each filled up to
   its capacity. With more streams than partitions some streams stay idle, as in ``range``.

Why this is the fewest moves: a balanced assignment must give exactly ``extra`` streams
``base + 1`` partitions and the others ``base``. A stream can keep at most
``min(kept, capacity)`` of its partitions, and giving the larger capacities to the streams
that kept most maximises the sum of those minimums; every other partition has to move anyway.
So the number of partitions that change owner is the minimum over all per-topic balanced
assignments. It follows that the assignment is a fixed point: given its own output as
``previous`` with the same members and partitions, it returns it unchanged, and with no
``previous`` at all it returns exactly ``range``'s assignment (every stream keeps nothing, the
``base + 1`` slots go to the first streams and the pool is dealt in order).

``previous`` is read from a znode another process wrote, so it is not trusted: entries that
are not ``int partition -> str stream id``, streams that are not (or no longer) subscribed to
the topic and partitions that do not exist are ignored, never an error. Only ``members`` and
``partitions`` are checked (:func:`coordinator.assignors.range.check_input`).

Unlike Kafka's ``StickyAssignor`` this does not balance across topics (it balances each topic
like ``range``) and needs no member-side user data: the coordinator already holds the previous
assignment. Cost per topic: O(P + S log S), plus one pass over ``previous``'s entries for it.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from coordinator.assignors.range import Members, Partitions, check_input, streams_by_topic
from coordinator.protocol import Ownership, stream_id

NAME = "sticky"


def assign(members: Members, partitions: Partitions, previous: Optional[Ownership] = None) -> Ownership:
    """Sticky assignment; see the module docstring. Pure and deterministic: the result does not
    depend on the iteration order of any mapping. Malformed ``previous`` entries are ignored."""
    check_input(members, partitions)
    if not isinstance(previous, Mapping):
        previous = {}
    result: Ownership = {}
    for topic, streams in streams_by_topic(members, partitions).items():
        result[topic] = _assign_topic(partitions[topic], [stream_id(cid, i) for cid, i in streams],
                                      previous.get(topic))
    return result


def _assign_topic(count: int, sids: List[str], before: object) -> Dict[int, str]:
    """One topic: ``count`` partitions over the streams ``sids`` (in stream order), keeping what
    ``before`` (that topic's previous partition -> stream id map, unchecked) allows."""
    position = {sid: n for n, sid in enumerate(sids)}
    kept: List[List[int]] = [[] for _ in sids]
    if isinstance(before, Mapping):
        for partition, sid in before.items():
            if (isinstance(partition, int) and not isinstance(partition, bool) and 0 <= partition < count
                    and isinstance(sid, str) and sid in position):
                kept[position[sid]].append(partition)

    base, extra = divmod(count, len(sids))
    capacity = [base] * len(sids)
    for n in sorted(range(len(sids)), key=lambda n: (-len(kept[n]), n))[:extra]:
        capacity[n] = base + 1

    owner: List[Optional[int]] = [None] * count  # partition -> stream position
    load = [0] * len(sids)
    for n, parts in enumerate(kept):
        parts.sort()
        for partition in parts[:capacity[n]]:
            owner[partition] = n
        load[n] = min(len(parts), capacity[n])

    n = 0  # the next stream that may still have room; streams before it are full
    for partition in range(count):
        if owner[partition] is None:
            while load[n] >= capacity[n]:
                n += 1  # cannot run past the end: the capacities add up to ``count``
            owner[partition] = n
            load[n] += 1
    return {partition: sids[n] for partition, n in enumerate(owner)}
