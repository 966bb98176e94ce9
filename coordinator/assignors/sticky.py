"""The ``sticky`` strategy: totals as even as the subscriptions allow, moving the fewest partitions.

``range`` and ``roundrobin`` recompute the assignment from scratch, so one member joining a
group of ten on 100 partitions moves most of them from one stream to another: every moved
partition means a fetcher stopped, offsets committed and another fetcher started on another
member. ``sticky`` also takes the group's *previous* assignment (the ownership of the last
generation, as stored in the group state) and keeps every partition it can where it was.

The unit is the stream, as in ``range`` and ``roundrobin``: a member asking for ``n`` streams of
a topic is ``n`` consumers of it (Kafka's ZooKeeper consumer threads), and stream ``<cid>-<i>``
is subscribed to the topics the member asks at least ``i + 1`` streams of. A stream's *total* is
the number of partitions it holds over all topics. With one stream per member, as in Kafka's
model, streams are members.

Guarantees, in order of priority (each one holds among the assignments that keep the ones
before it):

1. **Balanced across topics.** The totals are as even as the subscriptions allow: no stream
   holds 2 or more partitions more than another stream to which one of its partitions could be
   handed, either directly (the other stream subscribes to that partition's topic) or through
   a chain of such hand-overs (the first stream gives a partition to a second, the second one
   of its own to a third, ...). The direct case is Kafka's sticky guarantee
   (``AbstractStickyAssignor.isBalanced``): no stream with 2+ fewer partitions than another
   can take one of the other's partitions. When every stream subscribes to the same topics the
   totals differ by at most one. These totals are exactly those with the smallest sum of
   squares; each stream's total is one of two neighbouring values fixed by the subscriptions
   and partition counts alone, and ``previous`` only decides which.
2. **Sticky.** Among those, the fewest partitions change stream: the number of partitions
   whose stream is not the one ``previous`` named is the minimum over all assignments with
   balanced totals (exact, not a heuristic). Entries of ``previous`` for streams that are gone,
   or no longer subscribed to the topic, and partitions that no longer exist do not count.
3. **Balanced per topic where it is free.** Among those, each topic's partitions are spread as
   evenly over its streams as possible (smallest sum over streams and topics of the squared
   per-topic counts), so with no ``previous`` and equal subscriptions every topic is split like
   ``range`` (counts differ by at most one) while the totals are balanced too.
4. **Earlier streams first.** Among those, larger totals go to earlier streams (stream order:
   consumer id, then numeric index). Each stream keeps its lowest previous partitions; the
   others are dealt in ascending order to the streams in stream order, each up to its count.

Consequences: the result is a fixed point (given its own output as ``previous`` with the same
members and partitions it returns it unchanged: it is balanced and moves nothing). With no
``previous`` it is ``range``'s assignment whenever ``range``'s totals are balanced, in
particular for a single topic; on several topics it is not ``range`` (``range`` favours the first
streams in every topic: three members on four topics of two partitions get 4, 4 and 0 from
``range``, 3, 3 and 2 here). A member joining or leaving a group whose streams all subscribe
to the same topics moves only the partitions that must move (the newcomer's share, the
leaver's partitions); with unequal subscriptions balancing may also move partitions between
members that stay, as few as possible.

Unlike Kafka's ``StickyAssignor``, balance (1) covers chains of hand-overs: with streams A on t1,
B on t1 and t2, C on t2, one partition each of t1 and t2 can go from A to B and from B to C, so
totals 3, 2, 1 become 2, 2, 2, where Kafka would keep 3, 2, 1 (no single hand-over helps). The
price is those moves; the gain is totals that do not depend on history. And (2) is exact where
Kafka's is a heuristic. No member-side user data is needed: the coordinator holds ``previous``.

How: the counts (partitions of each topic per stream) are a minimum-cost flow from topics to
streams, with a convex cost per stream whose terms are weighted so that (1) dominates (2), (2)
dominates (3) and (3) dominates (4). A first estimate comes from streams with the same topics
taken together (they can always even out among themselves), and is then improved by cancelling
negative-cost cycles until there are none, which proves it optimal. Cycles are searched on a
graph of the topics (plus one node for the totals), whose edges are the cheapest stream for
each pair, kept in heaps, so the search does not grow with the number of streams. The
partitions are then laid out as described in (4). ``range`` does the same layout from zero.

Cost: a stream enters about ``T_s * H_s`` heap entries each time its counts change (``T_s``
topics it subscribes to, ``H_s`` topics it holds), and a search is linear in the topic graph's
edges, at most ``(T + 1)^2`` for ``T`` topics. Groups on a few topics are cheap whatever their
size (500 members on 4 topics with 5,000 partitions take tens of milliseconds); members on
many topics each (hundreds) cost roughly the square of that number per member.

``previous`` is read from a znode another process wrote, so it is not trusted: entries that
are not ``int partition -> str stream id``, streams that are not (or no longer) subscribed to
the topic and partitions that do not exist are ignored, never an error. Only ``members`` and
``partitions`` are checked (:func:`coordinator.assignors.range.check_input`).
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from coordinator.assignors.range import Members, Partitions, check_input, streams_by_topic
from coordinator.protocol import Ownership, stream_id

NAME = "sticky"

# A unit is a stream (or, for the first estimate, a class of streams with the same topics).
CostOfTotal = Callable[[int, int], int]          # (unit, total) -> cost
CostOfTopic = Callable[[int, int, int], int]     # (unit, topic, count) -> cost
Arc = Tuple[str, int, int]                       # (kind, unit, topic); topic -1 for totals

GAIN, RELEASE, UP, DOWN = "gain", "release", "up", "down"


def assign(members: Members, partitions: Partitions, previous: Optional[Ownership] = None) -> Ownership:
    """Sticky assignment; see the module docstring. Pure and deterministic: the result does not
    depend on the iteration order of any mapping. Malformed ``previous`` entries are ignored."""
    check_input(members, partitions)
    if not isinstance(previous, Mapping):
        previous = {}
    by_topic = streams_by_topic(members, partitions)
    topics = list(by_topic)  # sorted
    keys = sorted({key for streams in by_topic.values() for key in streams})
    sids = [stream_id(cid, i) for cid, i in keys]
    position = {key: n for n, key in enumerate(keys)}
    subscribers = [[position[key] for key in by_topic[topic]] for topic in topics]  # in stream order
    topics_of: List[List[int]] = [[] for _ in keys]
    for t, streams in enumerate(subscribers):
        for s in streams:
            topics_of[s].append(t)
    sizes = [partitions[topic] for topic in topics]

    kept = [_kept(sizes[t], {sids[s]: s for s in subscribers[t]}, previous.get(topic))
            for t, topic in enumerate(topics)]  # topic -> stream -> its previous partitions, sorted
    counts = _counts(topics_of, sizes, [{s: len(parts) for s, parts in by_stream.items()} for by_stream in kept])
    return {topic: _layout(sizes[t], subscribers[t], counts, t, kept[t], sids) for t, topic in enumerate(topics)}


def _kept(size: int, streams: Mapping[str, int], before: object) -> Dict[int, List[int]]:
    """The valid part of one topic's previous map: stream -> its previous partitions (sorted)."""
    kept: Dict[int, List[int]] = {}
    if isinstance(before, Mapping):
        for partition, sid in before.items():
            if (isinstance(partition, int) and not isinstance(partition, bool) and 0 <= partition < size
                    and isinstance(sid, str) and sid in streams):
                kept.setdefault(streams[sid], []).append(partition)
    for parts in kept.values():
        parts.sort()
    return kept


def _layout(size: int, streams: Sequence[int], counts: Sequence[Mapping[int, int]], t: int,
            kept: Mapping[int, List[int]], sids: Sequence[str]) -> Dict[int, str]:
    """One topic: each stream keeps its lowest previous partitions up to its count; the rest
    are dealt in ascending order to the streams in stream order, each up to its count."""
    owner: List[Optional[int]] = [None] * size
    room = []
    for s in streams:
        mine = kept.get(s, [])[:counts[s].get(t, 0)]
        for partition in mine:
            owner[partition] = s
        room.append([s, counts[s].get(t, 0) - len(mine)])
    n = 0  # the next stream that may still have room; streams before it are full
    for partition in range(size):
        if owner[partition] is None:
            while room[n][1] == 0:
                n += 1  # cannot run past the end: the counts add up to ``size``
            owner[partition] = room[n][0]
            room[n][1] -= 1
    return {partition: sids[s] for partition, s in enumerate(owner)}


# ---------------------------------------------------------------- the counts

def _counts(topics_of: List[List[int]], sizes: List[int], kept: List[Dict[int, int]]) -> List[Dict[int, int]]:
    """stream -> {topic: partitions of it}: the optimum of guarantees 1-4 (module docstring).

    ``kept[t][s]`` is how many partitions of topic ``t`` stream ``s`` held and may keep."""
    total = sum(sizes)
    n_streams = len(topics_of)
    # Weights making the cost lexicographic: each term's whole range is below one unit of the
    # term above it (sum of position * total < W_TOPIC; sum of W_TOPIC * count^2 + that < W_MOVE;
    # W_MOVE * moves + those < W_TOTAL).
    w_topic = n_streams * total + 1
    w_move = w_topic * (total * total + 1)
    w_total = w_move * (total + 1)

    def kept_of(s: int, t: int) -> int:
        return kept[t].get(s, 0)

    def stream_total_cost(s: int, n: int) -> int:
        return w_total * n * n + s * n

    def stream_topic_cost(s: int, t: int, x: int) -> int:
        return w_move * max(0, x - kept_of(s, t)) + w_topic * x * x

    first = _first_estimate(topics_of, sizes, kept, w_total, w_move, w_topic)
    flow = _Flow(len(sizes), topics_of, first, stream_total_cost, stream_topic_cost)
    flow.optimise()
    return flow.held


def _first_estimate(topics_of: List[List[int]], sizes: List[int], kept: List[Dict[int, int]],
                    w_total: int, w_move: int, w_topic: int) -> List[Dict[int, int]]:
    """Counts with balanced totals (guarantee 1 exactly), close to the optimum otherwise.

    Streams with the same topics form a class; within a class any split of the class's counts
    is possible, so a class's best cost for a total ``L`` over ``m`` streams is that of ``L``
    split evenly, and the classes' counts are a flow problem of their own, with one unit per
    class: started by water-filling, optimised like the streams'. Each class's total is then
    split: the larger shares to the streams that kept most (then stream order), each stream
    keeps what it can of its previous partitions within its class's count of the topic, and
    the rest is dealt round-robin, topic by topic."""
    classes: Dict[Tuple[int, ...], List[int]] = {}
    for s, topics in enumerate(topics_of):
        classes.setdefault(tuple(topics), []).append(s)  # streams in stream order
    class_topics = [list(topics) for topics in classes]
    class_streams = list(classes.values())
    class_kept = [{t: sum(kept[t].get(s, 0) for s in streams) for t in topics}
                  for topics, streams in zip(class_topics, class_streams)]

    # start: each topic poured into its classes where their streams are least loaded, the
    # topics with the fewest streams first
    held: List[Dict[int, int]] = [{} for _ in class_streams]
    class_total = [0] * len(class_streams)
    takers_of = [[q for q, topics in enumerate(class_topics) if t in topics] for t in range(len(sizes))]
    for t in sorted(range(len(sizes)), key=lambda t: (sum(len(class_streams[q]) for q in takers_of[t]), t)):
        shares = _pour(sizes[t], {q: class_total[q] for q in takers_of[t]},
                       {q: len(class_streams[q]) for q in takers_of[t]})
        for q, share in shares.items():
            held[q][t] = share
            class_total[q] += share

    def class_total_cost(q: int, total: int) -> int:
        return w_total * _even_squares(total, len(class_streams[q]))

    def class_topic_cost(q: int, t: int, x: int) -> int:
        return w_move * max(0, x - class_kept[q][t]) + w_topic * _even_squares(x, len(class_streams[q]))

    classes_flow = _Flow(len(sizes), class_topics, held, class_total_cost, class_topic_cost)
    classes_flow.optimise()

    counts: List[Dict[int, int]] = [{} for _ in topics_of]
    for q, streams in enumerate(class_streams):
        _split_class(streams, class_topics[q], dict(classes_flow.held[q]), classes_flow.total[q], kept, counts)
    return counts


def _split_class(streams: List[int], topics: List[int], room: Dict[int, int], total: int,
                 kept: List[Dict[int, int]], counts: List[Dict[int, int]]) -> None:
    """Split one class's ``total`` (``room``: its count of each topic) over its ``streams``
    into ``counts``: the larger shares to the streams that kept most (then stream order), each
    stream keeps what it can of its previous partitions, the rest dealt round-robin, topic by
    topic."""
    base, extra = divmod(total, len(streams))
    kept_total = {s: sum(kept[t].get(s, 0) for t in topics) for s in streams}
    larger = set(sorted(streams, key=lambda s: (-min(kept_total[s], base + 1), s))[:extra])
    need = {}
    for s in streams:
        left = base + (1 if s in larger else 0)
        for t in topics:
            keep = min(kept[t].get(s, 0), left, room[t])
            if keep:
                counts[s][t] = keep
                left -= keep
                room[t] -= keep
        need[s] = left
    ring = deque(s for s in streams if need[s])
    for t in topics:
        for _ in range(room[t]):  # the class's counts add up to its streams' needs
            s = ring.popleft()
            counts[s][t] = counts[s].get(t, 0) + 1
            need[s] -= 1
            if need[s]:
                ring.append(s)


def _even_squares(total: int, width: int) -> int:
    """The sum of squares of ``total`` split as evenly as possible into ``width`` parts."""
    base, extra = divmod(total, width)
    return (width - extra) * base * base + extra * (base + 1) * (base + 1)


def _pour(amount: int, level: Dict[int, int], width: Dict[int, int]) -> Dict[int, int]:
    """Split ``amount`` over classes (current totals ``level``, ``width`` streams each) so that
    their streams' totals end as even as possible (water-filling; at the last level, the first
    classes first). Returns class -> its share."""
    def wanted(depth: int) -> int:  # what lifts every class to ``depth`` per stream
        return sum(max(0, depth * width[q] - level[q]) for q in level)
    low, high = 0, amount + max(level.values(), default=0)
    while low < high:  # the deepest level the amount fills completely
        mid = (low + high + 1) // 2
        if wanted(mid) <= amount:
            low = mid
        else:
            high = mid - 1
    share = {q: max(0, low * width[q] - level[q]) for q in sorted(level)}
    left = amount - sum(share.values())
    for q in sorted(level):  # the rest: one more per stream at that level, class by class
        more = min(left, max(0, (low + 1) * width[q] - level[q] - share[q]))
        share[q] += more
        left -= more
    return share


class _Flow:
    """Counts of partitions per unit and topic, improved by cancelling negative-cost cycles.

    The flow network: each topic sends its partitions to units subscribed to it; a unit's cost
    is ``total_cost(unit, its total) + sum of topic_cost(unit, topic, its count)``, both convex.
    A change that keeps every topic's partitions assigned is a cycle in the residual graph:
    units gaining a partition of one topic and releasing one of another, or a unit releasing
    one (its total goes down) and another gaining one (its total goes up). The counts are
    optimal exactly when no such cycle has a negative cost.

    The search runs on a small graph: the topics and one node ``totals``. The edge ``a -> b``
    costs the cheapest unit that can gain from ``a`` and release to ``b`` (gain a topic and
    release another, gain a topic with its total going up, or release a topic with its total
    going down); each edge keeps its candidates in a heap whose stale entries (a unit whose
    counts changed since) are dropped when they reach the top. A label-correcting search
    (Bellman-Ford with a queue, labels kept from one search to the next) finds a negative
    cycle there; it is expanded to the units behind its edges, split where a unit repeats (one
    part is still negative), and pushed as many times as each push still lowers the cost.
    Not thread-safe; used within one ``assign`` call.
    """

    def __init__(self, n_topics: int, topics_of: List[List[int]], held: List[Dict[int, int]],
                 total_cost: CostOfTotal, topic_cost: CostOfTopic):
        self.totals_node = n_topics
        self.nodes = n_topics + 1
        self.topics_of = topics_of
        self.held = held
        self.total = [sum(counts.values()) for counts in held]
        self.total_cost = total_cost
        self.topic_cost = topic_cost
        self.version = [0] * len(topics_of)
        self.edges_of: List[List[Tuple[int, int]]] = [[] for _ in topics_of]  # unit -> edges it is in
        self.heaps: Dict[Tuple[int, int], List[Tuple[int, int, int]]] = {}
        self.out: List[Dict[int, Tuple[int, int]]] = [{} for _ in range(self.nodes)]  # a -> b -> (cost, unit)
        self.dirty: set = set()  # edges whose cheapest candidate may have changed
        self.label = [0] * self.nodes
        for unit in range(len(topics_of)):
            self._publish(unit)

    def optimise(self) -> None:
        while True:
            cycle = self._negative_cycle()
            if cycle is None:
                return
            self._push(cycle)

    # ---- candidates

    def _publish(self, unit: int) -> None:
        """(Re)enter ``unit`` as a candidate for every edge it can serve at its current counts."""
        self.dirty.update(self.edges_of[unit])  # its old entries are stale now
        self.version[unit] += 1
        version = self.version[unit]
        counts, n = self.held[unit], self.total[unit]
        up = self.total_cost(unit, n + 1) - self.total_cost(unit, n)
        gains = [(t, self._marginal((GAIN, unit, t), 1)) for t in self.topics_of[unit]]
        releases = [(t, self._marginal((RELEASE, unit, t), 1)) for t in self.topics_of[unit] if counts.get(t)]
        totals = self.totals_node
        entries = []
        for t, gain in gains:
            entries.append(((t, totals), gain + up))
            entries.extend(((t, other), gain + release) for other, release in releases if other != t)
        if releases:
            down = self.total_cost(unit, n - 1) - self.total_cost(unit, n)
            entries.extend(((totals, t), down + release) for t, release in releases)
        heaps = self.heaps
        for edge, cost in entries:
            heapq.heappush(heaps.setdefault(edge, []), (cost, unit, version))
        self.edges_of[unit] = [edge for edge, cost in entries]
        self.dirty.update(self.edges_of[unit])

    def _refresh(self) -> None:
        """Bring the cheapest candidate of every dirty edge up to date."""
        for edge in sorted(self.dirty):
            heap = self.heaps[edge]
            while heap and heap[0][2] != self.version[heap[0][1]]:
                heapq.heappop(heap)
            a, b = edge
            if heap:
                self.out[a][b] = (heap[0][0], heap[0][1])
            else:
                self.out[a].pop(b, None)
        self.dirty.clear()

    # ---- cycles

    def _negative_cycle(self) -> Optional[List[Arc]]:
        """A simple negative cycle of the residual graph, as arcs (in, out) per unit; or None.

        Labels start from the last search's, which is valid (as if a virtual source reached
        every node at its old label) and usually close. When a label's chain of corrections
        gets longer than the graph has nodes, the parent graph is checked for a cycle: any
        cycle there is negative, and with a negative cycle in the graph one eventually
        appears (Cherkassky and Goldberg, "Negative-cycle detection algorithms", 1999)."""
        self._refresh()
        label, out, nodes = self.label, self.out, self.nodes
        parent: List[Optional[Tuple[int, int]]] = [None] * nodes  # node -> (previous node, unit)
        depth = [0] * nodes
        queue = deque(range(nodes))
        queued = [True] * nodes
        while queue:
            a = queue.popleft()
            queued[a] = False
            for b, (cost, unit) in out[a].items():
                if label[a] + cost < label[b]:
                    label[b] = label[a] + cost
                    parent[b] = (a, unit)
                    depth[b] = depth[a] + 1
                    if depth[b] >= nodes:
                        start = _cycle_in(parent)
                        if start is not None:
                            return self._expand(start, parent)
                        depth[b] = 0
                    if not queued[b]:
                        queued[b] = True
                        queue.append(b)
        return None

    def _expand(self, start: int, parent: List[Optional[Tuple[int, int]]]) -> List[Arc]:
        steps = []
        b = start
        while True:
            a, unit = parent[b]
            steps.append((a, b, unit))
            b = a
            if b == start:
                break
        steps.reverse()
        arcs: List[Arc] = []
        for a, b, unit in steps:
            arcs.append((DOWN, unit, -1) if a == self.totals_node else (GAIN, unit, a))
            arcs.append((UP, unit, -1) if b == self.totals_node else (RELEASE, unit, b))
        return self._simple(arcs)

    def _simple(self, arcs: List[Arc]) -> List[Arc]:
        """Split a negative closed walk where a unit repeats until no unit does; the cost is
        additive over arcs, so one part of each split is negative."""
        while True:
            seen: Dict[int, int] = {}
            for i in range(0, len(arcs), 2):
                unit = arcs[i][1]
                if unit in seen:
                    j = seen[unit]
                    inner = arcs[j + 1:i + 1]            # from the unit's first out to its second in
                    outer = arcs[i + 1:] + arcs[:j + 1]  # from its second out to its first in
                    inner = inner[-1:] + inner[:-1]
                    outer = outer[-1:] + outer[:-1]
                    arcs = inner if self._cost(inner, 1) < 0 else outer
                    break
                seen[unit] = i
            else:
                return arcs

    def _marginal(self, arc: Arc, m: int) -> int:
        """The cost of the ``m``-th unit of flow along ``arc`` from the current counts."""
        kind, unit, t = arc
        if kind == GAIN:
            x = self.held[unit].get(t, 0)
            return self.topic_cost(unit, t, x + m) - self.topic_cost(unit, t, x + m - 1)
        if kind == RELEASE:
            x = self.held[unit][t]
            return self.topic_cost(unit, t, x - m) - self.topic_cost(unit, t, x - m + 1)
        n = self.total[unit]
        if kind == UP:
            return self.total_cost(unit, n + m) - self.total_cost(unit, n + m - 1)
        return self.total_cost(unit, n - m) - self.total_cost(unit, n - m + 1)

    def _cost(self, arcs: List[Arc], m: int) -> int:
        return sum(self._marginal(arc, m) for arc in arcs)

    def _push(self, arcs: List[Arc]) -> None:
        """Push flow around the cycle as many times as each push still lowers the cost (the
        m-th push costs more than the one before, the costs being convex)."""
        room = min([self.held[unit][t] for kind, unit, t in arcs if kind == RELEASE]
                   + [self.total[unit] for kind, unit, t in arcs if kind == DOWN])
        low, high = 1, room  # the first push is negative
        while low < high:
            mid = (low + high + 1) // 2
            if self._cost(arcs, mid) < 0:
                low = mid
            else:
                high = mid - 1
        for kind, unit, t in arcs:
            if kind == GAIN:
                self.held[unit][t] = self.held[unit].get(t, 0) + low
            elif kind == RELEASE:
                self.held[unit][t] -= low
            elif kind == UP:
                self.total[unit] += low
            else:
                self.total[unit] -= low
        for unit in sorted({unit for kind, unit, t in arcs}):
            self._publish(unit)


def _cycle_in(parent: List[Optional[Tuple[int, int]]]) -> Optional[int]:
    """A node on a cycle of the parent graph, or None."""
    mark = [0] * len(parent)  # 0: unseen, else the walk that saw it
    for first in range(len(parent)):
        node = first
        while node is not None and not mark[node]:
            mark[node] = first + 1
            node = parent[node][0] if parent[node] is not None else None
        if node is not None and mark[node] == first + 1:
            return node
    return None
