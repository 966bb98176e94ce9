"""The rules of a share-partition's state, as pure functions (no ZooKeeper, no clock).

A share-partition (:class:`~coordinator.protocol.share.SharePartitionState`) is the window of a
partition's records in flight for one share group. Members change it by compare-and-set of its
znode (:mod:`consumer.share`): they *acquire* records (locked to them under a new token) and
*acknowledge* them. The group's coordinator changes it too (:mod:`coordinator.share_decider`),
for what is a matter of time, judged by its own clock only: it *expires* a lock, *promotes* a
delayed record, and *releases* what a member that left still held. Every change works on whole
ranges, so one write carries a whole poll's records.

The moves of a record (``deliveries`` counts acquisitions)::

    (never delivered) --acquire--> ACQUIRED --ACCEPT--> ACCEPTED
    ACQUIRED --RELEASE / lock expired / holder gone--> AVAILABLE, or DELAYED (a backoff), or
             archived once deliveries reached the limit
    ACQUIRED --REJECT--> archived;  DELAYED --promote (the decider's clock)--> AVAILABLE
    AVAILABLE --acquire--> ACQUIRED;  archived = ARCHIVED, or DEAD_LETTER --claimed--> WRITING
             --written--> ARCHIVED (the group has a dead-letter topic; WRITING --expired--> DEAD_LETTER)

An acknowledgement carries the token of the acquisition: records no longer held under it (the
lock expired, or the decider released them) are *refused*, as a commit by a member that lost
its partition is refused; they are or will be delivered again. The start moves over the
records that are done, so the window (``end - start``) never holds more than the group's
``share.partition.max.record.locks``.
"""
from __future__ import annotations

import bisect
import enum
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from coordinator.protocol.share import (ACCEPTED, ACQUIRED, ARCHIVED, AVAILABLE, DEAD_LETTER, DELAYED,
                                        DELIVERY_LIMIT, DONE_STATES, MAX_HELD_TOKENS, RECENT_WRITES, REJECTED,
                                        WRITING, SharePartitionState, ShareGroupConfig)


class AcknowledgeType(enum.Enum):
    """What a member says of a record it was given (Kafka's ``AcknowledgeType``)."""
    ACCEPT = "accept"     # processed: done
    RELEASE = "release"   # deliver it again (to anyone), after an optional delay
    REJECT = "reject"     # cannot be processed: archive it (dead-letter it, if the group has a topic)
    RENEW = "renew"       # still working on it: extend the lock of what this poll acquired


#: (first, last, deliveries): records acquired.
Acquired = Tuple[int, int, int]
#: (first, last): offsets an acknowledgement did not reach.
Refused = Tuple[int, int]


def initial(offset: int) -> SharePartitionState:
    """The state of a share-partition that starts at ``offset``."""
    return SharePartitionState(start=offset, end=offset)


def copy(state: SharePartitionState) -> SharePartitionState:
    return SharePartitionState(state.start, state.end, [list(r) for r in state.ranges],
                               {t: list(h) for t, h in state.held.items()}, state.next_token, state.dlq_scan,
                               list(state.writes))


def note_write(state: SharePartitionState, write_id: str) -> None:
    """Record ``write_id`` among the state's recent writes (so its writer can tell, if the answer
    to its write was lost, whether the write was made)."""
    state.writes = (state.writes + [write_id])[-RECENT_WRITES:]


def room(state: SharePartitionState, config: ShareGroupConfig) -> int:
    """How many never-delivered records the window may still take."""
    return max(0, config.max_record_locks - (state.end - state.start))


def counts(state: SharePartitionState) -> Dict[str, int]:
    """{range state: records} of the window (the tools' and metrics' view)."""
    out: Dict[str, int] = {}
    for first, last, s, *_ in state.ranges:
        out[s] = out.get(s, 0) + last - first + 1
    return out


# ---------------------------------------------------------------- members: acquire

def acquire(state: SharePartitionState, holder: str, max_records: int, fresh: Sequence[int],
            config: ShareGroupConfig) -> Tuple[int, List[Acquired]]:
    """Lock up to ``max_records`` records to ``holder`` under a new token: available ones of the
    window first (oldest first), then never-delivered ones from ``fresh`` (the offsets the
    member read at and after ``state.end``, in order). Returns (token, what was acquired);
    ([]: nothing to acquire) — the token is only held if something was."""
    token = state.next_token
    taken: List[Acquired] = []
    wanted = max_records if len(state.held) < MAX_HELD_TOKENS else 0
    for first, last, s, deliveries, *_ in list(state.ranges):
        if wanted <= 0:
            break
        if s == AVAILABLE:
            upto = min(last, first + wanted - 1)
            _set(state, first, upto, ACQUIRED, token, deliveries=deliveries + 1)
            taken.append((first, upto, deliveries + 1))
            wanted -= upto - first + 1
    fresh = [o for o in fresh if o >= state.end][:max(0, min(wanted, room(state, config)))]
    if fresh:
        taken += _acquire_fresh(state, fresh, token)
    if taken:
        state.held[token] = [holder, 0]
        state.next_token = token + 1
        _compact(state)
    return token, taken


def _acquire_fresh(state: SharePartitionState, fresh: List[int], token: int) -> List[Acquired]:
    """Extend the window over ``fresh``: runs of present offsets acquired, gaps (no record
    there: compacted, or a transaction's marker) done at once."""
    taken = []
    for first, last in _runs(fresh):
        if first > state.end:
            state.ranges.append([state.end, first - 1, ACCEPTED, 0, 0, 0])
        state.ranges.append([first, last, ACQUIRED, 1, token, 0])
        state.end = last + 1
        taken.append((first, last, 1))
    return taken


# ---------------------------------------------------------------- members: acknowledge

def acknowledge(state: SharePartitionState, holder: str, token: int,
                acks: Iterable[Tuple[int, int, AcknowledgeType, int]],
                config: ShareGroupConfig) -> List[Refused]:
    """Apply ``acks`` ((first, last, type, delay ms)) of records ``holder`` acquired under
    ``token``. Returns the offsets refused: those no longer held under that token."""
    refused: List[Refused] = []
    held = state.held.get(token)
    mine = held is not None and held[0] == holder
    for first, last, kind, delay_ms in acks:
        if kind is AcknowledgeType.RENEW:
            if mine:
                held[1] += 1
            else:
                refused.append((first, last))
            continue
        for a, b, s, deliveries, t, _ in _overlapping(state, first, last):
            if not (mine and s == ACQUIRED and t == token):
                refused.append((a, b))
            elif kind is AcknowledgeType.ACCEPT:
                _set(state, a, b, ACCEPTED, 0, deliveries=0)
            elif kind is AcknowledgeType.REJECT:
                _archive(state, a, b, deliveries, REJECTED, config)
            else:
                delay = delay_ms if delay_ms else config.redelivery_delay_ms(deliveries)
                _release(state, a, b, deliveries, token, delay, config)
    _forget_tokens(state)
    _compact(state)
    return _merged(refused)


def release_undelivered(state: SharePartitionState, holder: str, token: int, first: int, last: int) -> None:
    """Give back records acquired but never handed to the application (a member closing): they
    are available again, this delivery not counted."""
    held = state.held.get(token)
    if held is None or held[0] != holder:
        return
    for a, b, s, deliveries, t, _ in _overlapping(state, first, last):
        if s == ACQUIRED and t == token:
            _set(state, a, b, AVAILABLE, 0, deliveries=max(0, deliveries - 1))
    _forget_tokens(state)
    _compact(state)


# ---------------------------------------------------------------- the decider: time

def expire(state: SharePartitionState, token: int, config: ShareGroupConfig) -> int:
    """The lock of ``token`` ended (the decider's clock): its acquired records are released
    (archived past the limit; delayed by the group's backoff), its dead letters pending again.
    Returns the records released."""
    released = 0
    for a, b, s, deliveries, t, extra in [list(r) for r in state.ranges]:
        if t != token:
            continue
        if s == ACQUIRED:
            _release(state, a, b, deliveries, token, config.redelivery_delay_ms(deliveries), config)
            released += b - a + 1
        elif s == WRITING:
            _set(state, a, b, DEAD_LETTER, 0, extra=extra)
    state.held.pop(token, None)
    _compact(state)
    return released


def expire_holder(state: SharePartitionState, holder: str, config: ShareGroupConfig) -> int:
    """Release everything ``holder`` holds (it left the group). Returns the records released."""
    return sum(expire(state, t, config) for t, h in list(state.held.items()) if h[0] == holder)


def delayed(state: SharePartitionState) -> List[Tuple[int, int, int]]:
    """(first, token, delay ms) of each delayed range (the decider times them)."""
    return [(r[0], r[4], r[5]) for r in state.ranges if r[2] == DELAYED]


def promote(state: SharePartitionState, first: int, token: int) -> bool:
    """The delay of the delayed range at ``first`` (of ``token``) ended: it is available."""
    r = _range_at(state, first)
    if r is None or r[0] != first or r[2] != DELAYED or r[4] != token:
        return False
    _set(state, r[0], r[1], AVAILABLE, 0, deliveries=r[3])
    _compact(state)
    return True


# ---------------------------------------------------------------- dead letters

def claim_dead_letters(state: SharePartitionState, holder: str, max_records: int,
                       dead_letter_end: int) -> Tuple[int, List[Tuple[int, int, int, int]]]:
    """Take up to ``max_records`` pending dead letters to write, under a new token. Returns
    (token, [(first, last, deliveries, reason)]). ``dead_letter_end`` is the dead-letter
    partition's end now: where a writer taking over looks for letters already written."""
    token, taken = state.next_token, []
    wanted = max_records if len(state.held) < MAX_HELD_TOKENS else 0
    for first, last, s, deliveries, _, reason in list(state.ranges):
        if wanted > 0 and s == DEAD_LETTER:
            upto = min(last, first + wanted - 1)
            _set(state, first, upto, WRITING, token, deliveries=deliveries, extra=reason)
            taken.append((first, upto, deliveries, reason))
            wanted -= upto - first + 1
    if taken:
        state.held[token] = [holder, 0]
        state.next_token = token + 1
        if state.dlq_scan < 0:
            state.dlq_scan = dead_letter_end
        _compact(state)
    return token, taken


def dead_letters_written(state: SharePartitionState, holder: str, token: int) -> bool:
    """The letters claimed under ``token`` are in the dead-letter topic: archived. False if the
    claim had expired (another writer takes them over; it skips the ones already written)."""
    held = state.held.get(token)
    if held is None or held[0] != holder:
        return False
    for a, b, s, _, t, _ in [list(r) for r in state.ranges]:
        if s == WRITING and t == token:
            _set(state, a, b, ARCHIVED, 0, deliveries=0)
    state.held.pop(token, None)
    if not any(r[2] in (DEAD_LETTER, WRITING) for r in state.ranges):
        state.dlq_scan = -1
    _compact(state)
    return True


def reset(state: SharePartitionState, offset: int) -> SharePartitionState:
    """The state started over at ``offset`` (an operator's reset; nothing may be held)."""
    if state.held:
        raise ValueError("records are held by members: stop the group's members first")
    return initial(offset)


# ---------------------------------------------------------------- range bookkeeping

def _release(state, a: int, b: int, deliveries: int, token: int, delay_ms: int, config: ShareGroupConfig) -> None:
    if deliveries >= config.delivery_count_limit:
        _archive(state, a, b, deliveries, DELIVERY_LIMIT, config)
    elif delay_ms > 0:
        _set(state, a, b, DELAYED, token, deliveries=deliveries, extra=int(delay_ms))
    else:
        _set(state, a, b, AVAILABLE, 0, deliveries=deliveries)


def _archive(state, a: int, b: int, deliveries: int, reason: int, config: ShareGroupConfig) -> None:
    if config.dead_letter_topic:
        _set(state, a, b, DEAD_LETTER, 0, deliveries=deliveries, extra=reason)
    else:
        _set(state, a, b, ARCHIVED, 0, deliveries=0)


def _set(state, first: int, last: int, new_state: str, token: int, deliveries: Optional[int] = None,
         extra: int = 0) -> None:
    """Give offsets [first, last] (inside the window) ``new_state``; each range keeps its
    deliveries unless ``deliveries`` is given."""
    i, j = _split(state, first), _split(state, last + 1)
    for r in state.ranges[i:j]:
        r[2], r[4], r[5] = new_state, token, extra
        if deliveries is not None:
            r[3] = deliveries


def _split(state, offset: int) -> int:
    """The index of the range that starts at ``offset`` (splitting the one around it); len at the end."""
    firsts = [r[0] for r in state.ranges]
    i = bisect.bisect_right(firsts, offset) - 1
    if i < 0:
        return 0
    r = state.ranges[i]
    if r[0] == offset:
        return i
    if offset > r[1]:
        return i + 1
    state.ranges.insert(i + 1, [offset, r[1]] + r[2:])
    r[1] = offset - 1
    return i + 1


def _range_at(state, offset: int) -> Optional[list]:
    i = bisect.bisect_right([r[0] for r in state.ranges], offset) - 1
    return state.ranges[i] if i >= 0 and state.ranges[i][1] >= offset else None


def _overlapping(state, first: int, last: int) -> List[list]:
    """Copies of the pieces of ranges within [first, last]; offsets outside the window come
    back as a piece of no state (refused)."""
    out = []
    if first < state.start:
        out.append([first, min(last, state.start - 1), None, 0, -1, 0])
    for r in state.ranges:
        a, b = max(first, r[0]), min(last, r[1])
        if a <= b:
            out.append([a, b] + r[2:])
    if last >= state.end:
        out.append([max(first, state.end), last, None, 0, -1, 0])
    return out


def _forget_tokens(state) -> None:
    alive = {r[4] for r in state.ranges if r[2] in (ACQUIRED, WRITING)}
    for t in [t for t in state.held if t not in alive]:
        del state.held[t]


def _compact(state) -> None:
    """Merge neighbours that say the same, and move the start over the records that are done.
    Delayed ranges are never merged: the decider times each from when it first sees it (by its
    first offset and token), so a record delayed later must not join an earlier one's clock."""
    merged: List[list] = []
    for r in state.ranges:
        if merged and merged[-1][2:] == r[2:] and merged[-1][1] + 1 == r[0] and r[2] != DELAYED:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    while merged and merged[0][2] in DONE_STATES:
        state.start = merged.pop(0)[1] + 1
    state.ranges = merged
    if not merged:
        state.start = state.end


def _runs(offsets: Sequence[int]) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for o in offsets:
        if runs and runs[-1][1] + 1 == o:
            runs[-1] = (runs[-1][0], o)
        else:
            runs.append((o, o))
    return runs


def _merged(pieces: List[Refused]) -> List[Refused]:
    out: List[Refused] = []
    for a, b in sorted(pieces):
        if out and out[-1][1] + 1 >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
