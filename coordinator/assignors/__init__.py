"""Partition assignment strategies: pure functions from a group snapshot to an ownership map.

The coordinator calls::

    strategy = choose_strategy({cid: registration.strategies for cid, registration in ...})
    ownership = assign(strategy, members, partitions, previous)

``members`` maps consumer id -> {topic: number of streams}, subscriptions already resolved to
existing topics (:meth:`coordinator.protocol.Registration.topics`); ``partitions`` maps topic
-> partition count; ``previous`` is the group's last assignment (an ``Ownership`` as returned
here, e.g. the group state's) or None. The result maps topic -> partition -> stream id
(:func:`coordinator.protocol.stream_id`, ``f"{consumer_id}-{n}"``).

Guarantees of every strategy here:

* every partition of every topic at least one member subscribes to is assigned to exactly one
  stream of a member subscribed to that topic; the topic's key is present even if it has no
  partitions;
* topics nobody subscribes to are absent; topics a member names that are missing from
  ``partitions`` are ignored;
* deterministic (same input, ``previous`` included, same output, whatever the dict order —
  the output's own key order is sorted too), no I/O, no randomness, no state between calls;
* streams are ordered by consumer id (string order) then stream index (numeric order), so
  ``c-2`` precedes ``c-10``.

``range`` and ``roundrobin`` do not try to keep partitions where they were: they ignore
``previous``, and a membership change may move partitions that did not need to move. ``sticky``
(:mod:`coordinator.assignors.sticky`) balances the streams' totals across topics (Kafka's sticky
guarantee and more) and, among balanced assignments, moves the fewest partitions from the
stream that held them in ``previous``; malformed entries of ``previous`` are ignored, never an
error.

Adding a strategy: a module with ``NAME`` and
``assign(members, partitions, previous=None) -> Ownership``, registered in :data:`STRATEGIES`.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from coordinator.assignors import range as range_assignor
from coordinator.assignors import roundrobin as roundrobin_assignor
from coordinator.assignors import sticky as sticky_assignor
from coordinator.errors import NoCommonStrategy
from coordinator.protocol import Ownership

# Note: importing the submodule ``range`` binds the name ``range`` in this package's namespace
# (Python sets submodules as attributes of their package), shadowing the builtin here. This
# module therefore never calls the builtin ``range``.

__all__ = ["Ownership", "Assignor", "STRATEGIES", "DEFAULT_STRATEGY", "assign", "choose_strategy", "settle_strategy",
           "NoCommonStrategy"]

# assign(members, partitions, previous=None) -> Ownership
Assignor = Callable[[Mapping[str, Mapping[str, int]], Mapping[str, int], Optional[Ownership]], Ownership]

#: The strategy consumers list first unless configured otherwise.
DEFAULT_STRATEGY = sticky_assignor.NAME

#: Every strategy by name.
STRATEGIES: Dict[str, Assignor] = {
    range_assignor.NAME: range_assignor.assign,
    roundrobin_assignor.NAME: roundrobin_assignor.assign,
    sticky_assignor.NAME: sticky_assignor.assign,
}


def assign(strategy: str, members: Mapping[str, Mapping[str, int]],
           partitions: Mapping[str, int], previous: Optional[Ownership] = None) -> Ownership:
    """Run the named strategy with the group's ``previous`` assignment (None: none known; only
    ``sticky`` uses it). Raises :class:`NoCommonStrategy` for an unknown name and ValueError for
    malformed ``members``/``partitions`` (stream counts < 1, negative partition counts); a
    malformed ``previous`` is never an error."""
    try:
        assignor = STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise NoCommonStrategy(f"unknown assignment strategy {strategy!r} "
                               f"(known: {', '.join(sorted(STRATEGIES))})") from None
    return assignor(members, partitions, previous)


def choose_strategy(member_strategies: Mapping[str, Sequence[str]]) -> str:
    """Pick the strategy for a group from each member's ordered preference list.

    Kafka's vote (``GroupMetadata.selectProtocol``): the candidates are the strategies that every
    member lists *and* this coordinator knows; names it does not know are ignored, so a member
    may list a newer strategy first during a rolling upgrade. Each member votes for the first
    candidate in its own list; the most votes win. A tie goes to the tied candidate that comes
    first in the list of the member with the smallest consumer id. So a group upgrading from
    ``range`` to ``["roundrobin", "range"]`` stays on ``range`` until the last old member has
    left, then switches.

    An empty group gets :data:`DEFAULT_STRATEGY`. Raises :class:`NoCommonStrategy` when no
    known strategy is listed by every member.
    """
    if not member_strategies:
        return DEFAULT_STRATEGY
    known: Dict[str, List[str]] = {}
    unknown = set()
    for cid, prefs in member_strategies.items():
        if isinstance(prefs, str):
            raise ValueError(f"member {cid!r}: strategies must be a list of names, not a string")
        mine: List[str] = []
        for name in prefs:
            if name in STRATEGIES:
                if name not in mine:
                    mine.append(name)
            else:
                unknown.add(str(name))
        known[cid] = mine

    members = sorted(known)
    candidates = set(known[members[0]])
    for cid in members[1:]:
        candidates.intersection_update(known[cid])
    if not candidates:
        raise NoCommonStrategy(_no_common_message(member_strategies, unknown))

    votes: Dict[str, int] = {}
    for cid in members:
        first = next(name for name in known[cid] if name in candidates)
        votes[first] = votes.get(first, 0) + 1
    best = max(votes.values())
    tied = {name for name, n in votes.items() if n == best}
    return next(name for name in known[members[0]] if name in tied)


def _no_common_message(member_strategies: Mapping[str, Sequence[str]], unknown: set) -> str:
    """One line: which members list what, bounded in length for large groups."""
    by_list: Dict[tuple, List[str]] = {}
    for cid in sorted(member_strategies):
        by_list.setdefault(tuple(member_strategies[cid]), []).append(cid)
    parts = []
    for prefs, cids in sorted(by_list.items(), key=lambda item: (-len(item[1]), item[1][0]))[:5]:
        shown = ", ".join(cids[:3]) + (f" and {len(cids) - 3} more" if len(cids) > 3 else "")
        parts.append(f"[{', '.join(prefs)}] by {shown}")
    if len(by_list) > 5:
        parts.append(f"{len(by_list) - 5} other lists")
    message = (f"no assignment strategy is supported by all {len(member_strategies)} members: "
               + "; ".join(parts) + f" (known: {', '.join(sorted(STRATEGIES))}")
    if unknown:
        names = sorted(unknown)
        message += f"; unknown: {', '.join(names[:10])}"
        if len(names) > 10:
            message += f" and {len(names) - 10} more"
    return message + ")"


def settle_strategy(member_strategies: Mapping[str, Sequence[str]], current: str = "") -> Tuple[str, Dict[str, str]]:
    """The group's strategy, and the members that cannot use it, with why (one line each).

    When every member shares a known strategy this is :func:`choose_strategy` and nobody is
    left out. Otherwise, as Kafka rejects a joining member with INCONSISTENT_GROUP_PROTOCOL
    and the group goes on: members listing no strategy this coordinator knows are left out;
    if the others share one, it is chosen by their vote; if not, the group keeps ``current``
    (its strategy so far) when any of them supports it, else takes the strategy most of them
    support (a tie goes to the order of the member with the smallest id), and the members
    that do not support it are left out. Returns ``("", left_out)`` when nobody is left.
    """
    try:
        return choose_strategy(member_strategies), {}
    except NoCommonStrategy:
        pass
    known = {cid: [name for name in prefs if name in STRATEGIES] for cid, prefs in member_strategies.items()}
    left_out = {cid: "lists no strategy this coordinator knows ("
                     f"{', '.join(map(str, member_strategies[cid])) or 'none'})"
                for cid, names in known.items() if not names}
    rest = {cid: names for cid, names in known.items() if names}
    if not rest:
        return "", left_out
    try:
        return choose_strategy(rest), left_out
    except NoCommonStrategy:
        pass
    supporters: Dict[str, int] = {}
    for names in rest.values():
        for name in set(names):
            supporters[name] = supporters.get(name, 0) + 1
    if current in supporters:
        strategy = current
    else:
        best = max(supporters.values())
        tied = {name for name, n in supporters.items() if n == best}
        strategy = next(name for cid in sorted(rest) for name in rest[cid] if name in tied)
    for cid, names in rest.items():
        if strategy not in names:
            left_out[cid] = f"does not support the group's strategy {strategy} (lists {', '.join(names)})"
    return strategy, left_out
