"""An explicit-state model of the share-group protocol over the project's real rules.

Every change of the share-partition's state in this model is made by the real pure functions of
:mod:`coordinator.share_partition` (``acquire``, ``acknowledge``, ``release_undelivered``,
``expire``, ``expire_holder``, ``promote``, ``claim_dead_letters``, ``dead_letters_written``) on a
real :class:`~coordinator.protocol.share.SharePartitionState` and
:class:`~coordinator.protocol.share.ShareGroupConfig`; the model adds only the actors, their
choices, the faults and ghost variables that say what *should* have happened, so the rules are
checked against an independent account of every record.

Actors (each action one atomic step; :mod:`tests.model.check` explores every interleaving):

* **Members** (``consumer/share.py``, ``consumer/share_exchange.py``, ``consumer/share_buffer.py``):
  acquire 1..K records (a compare-and-set of the state's version: a write that lost the race is
  made again on the current state, so a successful write is the rule applied to the current
  state, one step); hand the head of their buffer to the application; acknowledge any set of the
  records handed out under one token with ACCEPT, RELEASE, RELEASE with a delay, REJECT or
  RENEW; give back the buffered records of their oldest acquisition uncounted (``drop_stale``,
  ``close``); claim pending dead letters, then scan the dead-letter topic from the state's
  ``dlq_scan``, append the letters not found there, mark them written (four steps: a writer may
  pause between any two). A member may **crash** (its member znode goes, the process stops) or
  have its **session expire** (the znode goes, the process runs on with all it holds and
  registers again later: the zombie). A pause is no action of its own: the decider's clock may
  run out on any lock at any time after it saw it.
* **The decider** (``coordinator/share_decider.py``): a tick starts a clock for each token it has
  not seen, or whose renewals changed, and for each delayed range it has not seen (keyed, as
  there, by the range's first offset and token); "the lock of T ran out" is allowed for a token
  it has seen with no renewal since, and ``expire``\\s it; a delay it has seen may end
  (``promote``); a token whose holder's member znode is gone is released (``expire_holder``).
  A **failover** forgets every clock: a fresh decider must see a token before it expires it.

Ghosts, per record of the log: its fate (open, accepted, archived, a gap in the log), its
deliveries (acquisitions, less those given back uncounted), the token that should hold it, its
hand-outs to applications, and whether the decider's clock for its delay started after it was
delayed; the dead-letter topic as the list of letters appended (and whether the appending
writer's claim was still held then).

Invariants (:func:`violations`, and the checks made on each step):

1. **done below start / nothing lost**: every offset below ``start`` is accepted, archived or a
   gap; every record in the window is in the state its ghost says (open records available,
   acquired or delayed with the ghost's delivery count; accepted ones accepted; archived ones
   archived or waiting for their letter); beyond the window nothing happened. The "eventually"
   part is checked on the whole graph: from every reachable state, steps without faults reach a
   state where every record is accepted or archived (and every letter written):
   with finitely many states, so every strongly fair schedule terminates there.
2. **one holder**: a record is acquired only when it is open and no token holds it (the ghost);
   an acquired range's token is the one the ghost says, and is held.
3. **accept once, refusals exact**: an ACCEPT takes effect at most once per record; an
   acknowledgement under a token that is no longer the member's is refused entirely and changes
   nothing; one under a token still held is refused exactly for the records it no longer holds.
4. **delivery limit**: no delivery count, acquisition or hand-out past the limit.
5. **letters**: every letter is of an archived record; at most one per record (``strict``), or —
   the documented exception — at most one appended by a writer whose claim was still held, the
   others only by a writer whose claim had expired (``weak``, the default). Eventually every
   archived record has its letter.
6. **decodes**: ``SharePartitionState.decode(state.encode())`` gives the state back after every
   step, and the window is never wider than ``share.partition.max.record.locks``.
7. **no early redelivery**: a delayed record is promoted only by a clock that started after it
   was delayed.

States are canonical: tokens renumbered in order (``next_token`` the next free), a held token's
renewals reduced to "renewed since the decider's clock started or not", clocks of tokens and
delays that are gone dropped, and members (interchangeable: the rules compare holder names only)
sorted by trying every permutation.

:data:`MUTATIONS` are broken variants of the rules (patched in for one check); each must be caught.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from contextlib import contextmanager
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from coordinator import share_partition as rules
from coordinator.errors import CorruptZnode
from coordinator.protocol.share import (ACCEPTED, ACQUIRED, ARCHIVED, AVAILABLE, DEAD_LETTER, DELAYED, WRITING,
                                        ShareGroupConfig, SharePartitionState)

A = rules.AcknowledgeType
PATH = "/consumers/share-groups/model/partitions/t/0"
#: The delay a member's RELEASE may carry (ms; any value: the decider's clock is abstract).
RELEASE_DELAY_MS = 1000
#: Dead letters one claim takes (share_exchange.DEAD_LETTER_BATCH).
LETTER_BATCH = 500

OPEN, OK, AR, GAP = 0, 1, 2, 3
FATES = {OPEN: "open", OK: "accepted", AR: "archived", GAP: "gap"}


class ShareScope(NamedTuple):
    members: int = 2
    records: int = 3           # offsets 0..records-1 of one partition
    gap: int = -1              # an offset with no record (compacted, a marker); -1: none
    limit: int = 2             # share.delivery.count.limit
    window: int = 2            # share.partition.max.record.locks
    acquire: int = 2           # K: the most records one acquisition takes
    dlq: int = 1               # a dead-letter topic (1) or none (0)
    backoff: int = 0           # share.redelivery.backoff.ms (0: none)
    crashes: int = 1
    expiries: int = 1          # member session expiries (the zombie)
    failovers: int = 1         # decider failovers
    stalls: int = 1            # dead-letter claims whose lock runs out (a writer paused past the lock)
    letters: str = "weak"      # invariant 5: "strict" (one letter each) or "weak" (the documented exception)

    def config(self) -> ShareGroupConfig:
        return ShareGroupConfig(delivery_count_limit=self.limit, max_record_locks=self.window,
                                dead_letter_topic="dead" if self.dlq else "", backoff_ms=self.backoff)

    def log(self) -> Tuple[int, ...]:
        return tuple(o for o in range(self.records) if o != self.gap)


# (first, last, state, deliveries, token, extra)
Range = Tuple[int, int, str, int, int, int]


class Part(NamedTuple):
    start: int
    end: int
    ranges: Tuple[Range, ...]
    held: Tuple[Tuple[int, int, int], ...]    # (token, holder member, renewals), by token
    next_token: int
    dlq_scan: int


class Chunk(NamedTuple):
    token: int
    buffered: Tuple[int, ...]   # acquired, not handed out yet (oldest first)
    handed: Tuple[int, ...]     # handed to the application, not acknowledged


class Job(NamedTuple):
    """Dead letters a member claimed and is writing."""
    token: int
    letters: Tuple[int, ...]
    scan_from: int
    phase: str                  # claimed -> scanned -> appended
    found: Tuple[int, ...] = ()  # letters the scan found in the topic


class Member(NamedTuple):
    up: bool = True             # the process runs
    registered: bool = True     # its member znode exists
    chunks: Tuple[Chunk, ...] = ()
    job: Tuple = ()             # () or a Job


class Ghost(NamedTuple):
    fate: int = OPEN
    deliveries: int = 0
    holder: int = 0             # the token that should hold it (0: none)
    timed: bool = False         # the decider's clock for its delay started after it was delayed


class State(NamedTuple):
    part: Part
    members: Tuple[Member, ...]
    seen: Tuple[Tuple[int, int], ...]      # the decider's lock clocks: (token, renewals when started)
    delays: Tuple[Tuple[int, int], ...]    # the decider's delay clocks: (first, token)
    dlq: Tuple[Tuple[int, bool], ...]      # letters appended: (offset, the writer's claim had expired)
    ghost: Tuple[Ghost, ...]
    budget: Tuple[int, int, int, int]      # crashes, expiries, failovers, stalls left
    bad: Optional[str] = None


#: Broken variants of the rules, patched in for one check; each must be caught.
MUTATIONS = {
    "ack-ignores-token": "an acknowledgement is applied under any token its member holds, not the one it names",
    "expire-uncounted": "a lock that ended releases its records with the delivery uncounted",
    "limit-off-by-one": "a record is archived only once its deliveries pass the limit, not reach it",
    "accept-anything": "an ACCEPT is applied to records in any state (one accepted or archived already)",
    "undelivered-any-token": "records given back uncounted are released whatever token holds them",
    "scan-from-end": "every dead-letter claim moves the scan start to the topic's end (a writer taking over "
                     "does not see the letters of the claim it takes over)",
}

#: Mutations of the dead-letter rules: checked in a scope with a dead-letter topic.
LETTER_MUTATIONS = ("scan-from-end",)


def mutation_scope(scope: ShareScope, mutation: str) -> ShareScope:
    """The scope a mutation is checked in: ``scope``, or for a dead-letter one without a topic, one
    record dead-lettered by the same members with one claim that runs out."""
    if mutation in LETTER_MUTATIONS and not scope.dlq:
        return scope._replace(records=1, gap=-1, dlq=1, crashes=0, expiries=0, failovers=0, stalls=1)
    return scope


def name(i: int) -> str:
    return f"m{i}"


def initial(scope: ShareScope) -> State:
    part = Part(0, 0, (), (), 1, -1)
    return State(part, (Member(),) * scope.members, (), (), (), (Ghost(),) * scope.records,
                 (scope.crashes, scope.expiries, scope.failovers, scope.stalls))


# ---------------------------------------------------------------- the real state, to and fro

def real(p: Part) -> SharePartitionState:
    return SharePartitionState(p.start, p.end, [list(r) for r in p.ranges],
                               {t: [name(h), r] for t, h, r in p.held}, p.next_token, p.dlq_scan)


def back(s: SharePartitionState) -> Part:
    held = tuple(sorted((int(t), int(h[0][1:]), h[1]) for t, h in s.held.items()))
    return Part(s.start, s.end, tuple(tuple(r) for r in s.ranges), held, s.next_token, s.dlq_scan)


def state_at(p: Part, offset: int) -> Optional[Range]:
    for r in p.ranges:
        if r[0] <= offset <= r[1]:
            return r
    return None


def holder_of(p: Part, token: int) -> Optional[Tuple[int, int]]:
    for t, h, r in p.held:
        if t == token:
            return h, r
    return None


def runs(offsets) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] + 1 == o:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


# ---------------------------------------------------------------- invariants

def violations(s: State, scope: ShareScope) -> Optional[str]:
    """The first invariant ``s`` breaks, in words, or None."""
    if s.bad:
        return s.bad
    p, limit = s.part, scope.limit
    if p.end - p.start > scope.window:
        return f"6 window: [{p.start}, {p.end}) is wider than the lock limit {scope.window}"
    held = {t for t, _, _ in p.held}
    for o, g in enumerate(s.ghost):
        if g.deliveries > limit:
            return f"4 limit: offset {o} delivered {g.deliveries} times (limit {limit})"
        if o == scope.gap:
            if (g.fate == GAP) != (o < p.end):
                return f"1 gap: offset {o} (no record) is {FATES[g.fate]} with the window at [{p.start}, {p.end})"
            continue
        if o < p.start:
            if g.fate == OPEN:
                return f"1 done below start: offset {o} is below start {p.start} but was never accepted or archived"
            continue
        if o >= p.end:
            if g != Ghost():
                return f"1 beyond the window: offset {o} (from end {p.end}) has a history: {g}"
            continue
        first, last, st, deliveries, token, _ = state_at(p, o)
        want = {OPEN: (AVAILABLE, ACQUIRED, DELAYED), OK: (ACCEPTED,), AR: (ARCHIVED, DEAD_LETTER, WRITING)}[g.fate]
        if not scope.dlq and g.fate == AR:
            want = (ARCHIVED,)
        if st not in want:
            return f"1 lost: offset {o} is {FATES[g.fate]}, but its range [{first}, {last}] is {st!r}"
        if (st == ACQUIRED) != (g.holder != 0) or st == ACQUIRED and token != g.holder:
            return f"2 holder: offset {o} is {st!r} under token {token}, but should be held by {g.holder or 'none'}"
        if st == ACQUIRED and token not in held:
            return f"2 holder: offset {o} is acquired under token {token}, which is not held"
        if g.fate == OPEN and deliveries != g.deliveries:
            return f"4 count: offset {o} counts {deliveries} deliveries, {g.deliveries} were made"
    letters: Dict[int, List[bool]] = {}
    for o, stale in s.dlq:
        letters.setdefault(o, []).append(stale)
        if s.ghost[o].fate != AR:
            return f"5 letters: a letter of offset {o}, which is {FATES[s.ghost[o].fate]}"
    for o, stales in letters.items():
        if scope.letters == "strict" and len(stales) > 1:
            return f"5 letters: offset {o} has {len(stales)} letters in the dead-letter topic"
        if stales.count(False) > 1:
            return f"5 letters: offset {o} has {stales.count(False)} letters from writers holding their claim"
    return None


def goal(s: State, scope: ShareScope) -> bool:
    """Every record accepted or archived, nothing held, every archived record's letter written."""
    p = s.part
    if p.start < scope.records or p.ranges or p.held:
        return False
    written = {o for o, _ in s.dlq}
    return not scope.dlq or all(g.fate != AR or o in written for o, g in enumerate(s.ghost))


# ---------------------------------------------------------------- steps

#: (part, rule, arguments) -> (part after, the rule's answer, what the decoder said): the rules are
#: pure, so each is applied once per distinct state and arguments (cleared with each mutation).
_RULES: Dict[tuple, tuple] = {}


def apply(part: Part, rule: str, *args) -> Tuple[Part, object, Optional[str]]:
    """``rules.<rule>(state, *args)`` on the real state of ``part``: the part after, the rule's
    answer, and what is wrong with the state written (invariant 6), if anything."""
    key = (part, rule, args)
    hit = _RULES.get(key)
    if hit is None:
        st = real(part)
        answer = getattr(rules, rule)(st, *args)
        problem = None
        try:
            again = SharePartitionState.decode(st.encode(), PATH)
            if again != st:
                problem = f"6 decodes: the state read back differs: {st} -> {again}"
        except CorruptZnode as e:
            problem = f"6 decodes: {e}"
        hit = _RULES[key] = (back(st), answer, problem)
    return hit


class Step:
    """One step in the making: the rules applied to the state, the ghosts kept beside."""

    def __init__(self, s: State, scope: ShareScope):
        self.s, self.scope, self.config = s, scope, scope.config()
        self.part = s.part
        self.ghost = list(s.ghost)
        self.members = list(s.members)
        self.bad: Optional[str] = None

    def rule(self, rule: str, *args):
        self.part, answer, problem = apply(self.part, rule, *args)
        if problem:
            self.fail(problem)
        return answer

    def fail(self, why: str) -> None:
        self.bad = self.bad or why

    def g(self, o: int, **changes) -> None:
        self.ghost[o] = self.ghost[o]._replace(**changes)

    def released(self, token: int) -> None:
        """The ghosts of the records ``token`` held: released (archived at the limit)."""
        for o, gh in enumerate(self.ghost):
            if gh.holder == token:
                self.g(o, holder=0, fate=AR if gh.deliveries >= self.scope.limit else OPEN)

    def done(self, **changes) -> State:
        part, before = self.part, self.s.part
        ghost = []
        for o, gh in enumerate(self.ghost):   # a delay's clock counts only if it started after the delay
            if gh.timed:
                now, was = state_at(part, o), state_at(before, o)
                if not (now and now[2] == DELAYED and was and was[2] == DELAYED and now[4] == was[4]):
                    gh = gh._replace(timed=False)
            ghost.append(gh)
        return self.s._replace(part=part, members=tuple(self.members), ghost=tuple(ghost),
                               bad=self.s.bad or self.bad, **changes)


def successors(s: State, scope: ShareScope) -> Iterator[Tuple[str, bool, State]]:
    """Every (label, is a fault, next state) of one atomic step from ``s``, canonical (the rules
    as they are, or as :func:`mutated` patched them)."""
    for label, fault, nxt in _steps(s, scope):
        yield label, fault, canonical(nxt)


def _steps(s: State, scope: ShareScope) -> Iterator[Tuple[str, bool, State]]:
    crashes, expiries, failovers, stalls = s.budget
    p = s.part
    for i, m in enumerate(s.members):
        if m.up:
            yield from _member(s, scope, i, m)
    # ---- the decider
    seen = dict(s.seen)
    clocks = tuple((t, r) for t, _, r in p.held)
    new_delays = [(r[0], r[4]) for r in p.ranges if r[2] == DELAYED and (r[0], r[4]) not in s.delays]
    if clocks != s.seen or new_delays:
        ghost = list(s.ghost)
        for first, token in new_delays:
            r = state_at(p, first)
            for o in range(r[0], r[1] + 1):
                ghost[o] = ghost[o]._replace(timed=True)
        yield ("D ticks: clocks start for " + ", ".join(
            [f"token {t}" for t, r in clocks if seen.get(t) != r] + [f"the delay at {f} (token {t})"
                                                                     for f, t in new_delays]),
               False, s._replace(seen=clocks, delays=tuple(sorted(s.delays + tuple(new_delays))), ghost=tuple(ghost)))
    for token, holder, renewals in p.held:
        if not s.members[holder].registered:
            continue   # released below, with the rest of its holder's
        if seen.get(token) == renewals:
            claim = any(r[4] == token and r[2] == WRITING for r in p.ranges)
            if claim and not stalls:
                continue
            step = Step(s, scope)
            n = step.rule("expire", token, step.config)
            step.released(token)
            if claim:
                yield (f"D: the lock of token {token} (m{holder}'s dead-letter claim) ran out", True,
                       step.done(budget=(crashes, expiries, failovers, stalls - 1)))
            else:
                yield f"D: the lock of token {token} (m{holder}) ran out: {n} released", False, step.done()
    for h in sorted({h for _, h, _ in p.held if not s.members[h].registered}):
        step = Step(s, scope)
        tokens = [t for t, hh, _ in p.held if hh == h]
        n = step.rule("expire_holder", name(h), step.config)
        for t in tokens:
            step.released(t)
        yield f"D: m{h}'s member znode is gone: tokens {tokens} released ({n} records)", False, step.done()
    for first, token in s.delays:
        r = state_at(p, first)
        if r is None or r[0] != first or r[2] != DELAYED or r[4] != token:
            continue
        step = Step(s, scope)
        if not step.rule("promote", first, token):
            step.fail(f"7 promote: the delayed range at {first} (token {token}) was not promoted")
        early = [o for o in range(r[0], r[1] + 1) if not s.ghost[o].timed]
        if early:
            step.fail(f"7 early: offsets {early} promoted by the clock of the delay at {first} (token {token}), "
                      f"which started before they were delayed")
        yield f"D: the delay at {first} (token {token}) ended: [{r[0]}, {r[1]}] available", False, step.done()
    if failovers:
        yield ("D fails over: the new decider has no clocks", True,
               s._replace(seen=(), delays=(), budget=(crashes, expiries, failovers - 1, stalls),
                          ghost=tuple(g._replace(timed=False) for g in s.ghost)))


def _member(s: State, scope: ShareScope, i: int, m: Member) -> Iterator[Tuple[str, bool, State]]:
    crashes, expiries, failovers, stalls = s.budget
    p, me = s.part, name(i)
    config = scope.config()
    if crashes:
        yield (f"m{i} crashes (its member znode goes)", True,
               _put(s, i, Member(up=False, registered=False))._replace(budget=(crashes - 1, expiries, failovers, stalls)))
    if m.registered and expiries:
        yield (f"m{i}'s session expires (its znode goes; it runs on)", True,
               _put(s, i, m._replace(registered=False))._replace(budget=(crashes, expiries - 1, failovers, stalls)))
    if not m.registered:
        yield f"m{i} registers again", False, _put(s, i, m._replace(registered=True))
    # ---- acquire (the buffer empty, fewer than K records handed out)
    handed = sum(len(c.handed) for c in m.chunks)
    if not any(c.buffered for c in m.chunks) and handed < scope.acquire:
        for want in range(1, scope.acquire + 1):
            step = Step(s, scope)
            room = max(0, config.max_record_locks - (p.end - p.start))
            fresh = [o for o in scope.log() if o >= p.end][:max(0, min(want, room))]
            token, taken = step.rule("acquire", me, want, tuple(fresh), config)
            if not taken:
                continue
            got = []
            for first, last, deliveries in taken:
                for o in range(first, last + 1):
                    gh = step.ghost[o]
                    if gh.fate != OPEN or gh.holder:
                        step.fail(f"2 one holder: m{i} acquired offset {o}, which is {FATES[gh.fate]}"
                                  f"{f' and held by token {gh.holder}' if gh.holder else ''}")
                    step.g(o, holder=token, deliveries=gh.deliveries + 1)
                    if deliveries != gh.deliveries + 1:
                        step.fail(f"4 count: offset {o} acquired as delivery {deliveries}, "
                                  f"but it is delivery {gh.deliveries + 1}")
                    got.append(o)
            for o in range(p.end, step.part.end):
                if o == scope.gap:
                    step.g(o, fate=GAP)
            step.members[i] = m._replace(chunks=m.chunks + (Chunk(token, tuple(got), ()),))
            yield f"m{i} acquires {runs(got)} (want {want}) under token {token}", False, step.done()
    # ---- hand out the head of the buffer
    for c, chunk in enumerate(m.chunks):
        if chunk.buffered:
            o = chunk.buffered[0]
            chunks = _set(m.chunks, c, chunk._replace(buffered=chunk.buffered[1:], handed=chunk.handed + (o,)))
            yield f"m{i} hands out {o} (token {chunk.token})", False, _put(s, i, m._replace(chunks=chunks))
            # ---- give the oldest acquisition's buffered records back, uncounted
            step = Step(s, scope)
            mine = (holder_of(p, chunk.token) or (None,))[0] == i
            for first, last in runs(chunk.buffered):
                step.rule("release_undelivered", me, chunk.token, first, last)
            for o in chunk.buffered:
                gh = step.ghost[o]
                if mine and gh.holder == chunk.token:
                    step.g(o, holder=0, deliveries=gh.deliveries - 1)
            step.members[i] = m._replace(chunks=_drop(_set(m.chunks, c, chunk._replace(buffered=()))))
            yield (f"m{i} gives back {runs(chunk.buffered)} of token {chunk.token} uncounted", False, step.done())
            break
    # ---- acknowledge records handed out under one token
    kinds = [(A.ACCEPT, 0), (A.RELEASE, 0), (A.RELEASE, RELEASE_DELAY_MS), (A.REJECT, 0), (A.RENEW, 0)]
    for c, chunk in enumerate(m.chunks):
        for n in range(1, len(chunk.handed) + 1):
            for subset in itertools.combinations(chunk.handed, n):
                for kind, delay in kinds:
                    yield _acknowledge(s, scope, i, m, c, chunk, subset, kind, delay)
    # ---- dead letters: claim, scan, append, mark
    if scope.dlq and not m.job and any(r[2] == DEAD_LETTER for r in p.ranges):
        step = Step(s, scope)
        token, taken = step.rule("claim_dead_letters", me, LETTER_BATCH, len(s.dlq))
        offsets = tuple(o for first, last, _, _ in taken for o in range(first, last + 1))
        for o in offsets:
            if step.ghost[o].fate != AR:
                step.fail(f"5 letters: m{i} claimed the letter of offset {o}, which is {FATES[step.ghost[o].fate]}")
        scan = step.part.dlq_scan
        step.members[i] = m._replace(job=Job(token, offsets, scan, "claimed"))
        yield f"m{i} claims the letters of {runs(offsets)} under token {token} (scan from {scan})", False, step.done()
    if m.job:
        job = m.job
        if job.phase == "claimed":
            found = tuple(sorted({o for o, _ in s.dlq[job.scan_from:]})) if job.scan_from >= 0 else ()
            yield (f"m{i} scans the dead-letter topic from {job.scan_from}: finds {list(found)}", False,
                   _put(s, i, m._replace(job=job._replace(phase="scanned", found=found))))
        elif job.phase == "scanned":
            batch = [o for o in job.letters if o not in job.found]
            stale = (holder_of(p, job.token) or (None,))[0] != i
            yield (f"m{i} appends the letters of {batch}" + (" (its claim has expired)" if stale else ""), False,
                   _put(s, i, m._replace(job=job._replace(phase="appended")))._replace(
                       dlq=s.dlq + tuple((o, stale) for o in batch)))
        else:
            step = Step(s, scope)
            ok = step.rule("dead_letters_written", me, job.token)
            if ok:
                for o in job.letters:
                    if o not in {x for x, _ in s.dlq}:
                        step.fail(f"5 letters: offset {o} marked written, but its letter is not in the topic")
            step.members[i] = m._replace(job=())
            yield f"m{i} marks its letters written: " + ("done" if ok else "refused (its claim expired)"), False, \
                step.done()


def _acknowledge(s: State, scope: ShareScope, i: int, m: Member, c: int, chunk: Chunk, subset, kind, delay):
    step = Step(s, scope)
    token = chunk.token
    mine = (holder_of(s.part, token) or (None,))[0] == i
    acks = tuple((first, last, kind, delay) for first, last in runs(subset))
    refused = {o for a, b in step.rule("acknowledge", name(i), token, acks, step.config) for o in range(a, b + 1)}
    label = f"m{i} acknowledges {runs(subset)} {kind.name}{f' (delay {delay} ms)' if delay else ''} (token {token})"
    if kind is A.RENEW:
        expected = set() if mine else set(subset)
    else:
        expected = {o for o in subset if not mine or s.ghost[o].holder != token}
    if refused != expected:
        step.fail(f"3 refusal: the acknowledgement was refused for {sorted(refused)}, "
                  f"should have been for {sorted(expected)}")
    if not mine and step.part != s.part:
        step.fail("3 refusal: an acknowledgement under a token no longer held changed the state")
    for o in subset:
        if o in refused or kind is A.RENEW:
            continue
        gh = step.ghost[o]
        if kind is A.ACCEPT:
            if gh.fate == OK:
                step.fail(f"3 accept once: offset {o} accepted a second time")
            step.g(o, fate=OK, holder=0)
        elif kind is A.REJECT:
            step.g(o, fate=AR, holder=0)
        else:
            step.g(o, holder=0, fate=AR if gh.deliveries >= scope.limit else OPEN)
    gone = refused if kind is A.RENEW else set(subset)   # a RENEW keeps what it renewed handed out
    left = tuple(o for o in chunk.handed if o not in gone)
    step.members[i] = m._replace(chunks=_drop(_set(m.chunks, c, chunk._replace(handed=left))))
    if refused:
        label += f": refused for {runs(refused)}"
    return label, False, step.done()


def _put(s: State, i: int, m: Member) -> State:
    return s._replace(members=_set(s.members, i, m))


def _set(t: tuple, i: int, v) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def _drop(chunks: Tuple[Chunk, ...]) -> Tuple[Chunk, ...]:
    return tuple(c for c in chunks if c.buffered or c.handed)


# ---------------------------------------------------------------- canonical states

def canonical(s: State) -> State:
    """Tokens renumbered in order, renewals reduced, dead clocks dropped, members sorted."""
    hit = _CANONICAL.get(s)
    if hit is None:
        if len(_CANONICAL) > 2_000_000:
            _CANONICAL.clear()
        hit = _CANONICAL[s] = canonical_maps(s)[0]
    return hit


_CANONICAL: Dict[State, State] = {}


def canonical_maps(s: State) -> Tuple[State, Tuple[int, ...], Dict[int, int]]:
    """:func:`canonical`'s state, with the permutation of the members (old index -> new) and the
    renumbering of the tokens it made."""
    p = s.part
    held = {t: (h, r) for t, h, r in p.held}
    seen = {t: r for t, r in s.seen if t in held}
    delayed = {(r[0], r[4]) for r in p.ranges if r[2] == DELAYED}
    delays = [d for d in s.delays if d in delayed]
    tokens = {r[4] for r in p.ranges} | set(held) | {g.holder for g in s.ghost}
    for m in s.members:
        tokens |= {c.token for c in m.chunks}
        if m.job:
            tokens.add(m.job.token)
    tokens.discard(0)
    new = {t: k + 1 for k, t in enumerate(sorted(tokens))}
    new[0] = 0
    renewals = {}
    for t, (h, r) in held.items():
        if t in seen:
            renewals[t], seen[t] = (0, 0) if seen[t] == r else (1, 0)
        else:
            renewals[t] = 0
    ranges = tuple((a, b, st, d, new[t], x) for a, b, st, d, t, x in p.ranges)
    ghost = tuple(g._replace(holder=new[g.holder]) if g.fate == OPEN else Ghost(g.fate) for g in s.ghost)
    members = tuple(m._replace(chunks=tuple(c._replace(token=new[c.token]) for c in m.chunks),
                               job=m.job._replace(token=new[m.job.token]) if m.job else ()) for m in s.members)
    seen_t = tuple(sorted((new[t], r) for t, r in seen.items()))
    delays_t = tuple(sorted((f, new[t]) for f, t in delays))
    best = None
    n = len(members)
    for perm in itertools.permutations(range(n)) if n <= 3 else [tuple(range(n))]:
        # perm[old] = new index
        ms = [None] * n
        for old, nw in enumerate(perm):
            ms[nw] = members[old]
        hs = tuple(sorted((new[t], perm[h], renewals[t]) for t, (h, _) in held.items()))
        key = (tuple(ms), hs, perm)
        if best is None or key < best:
            best = key
    members, held_t, perm = best
    part = Part(p.start, p.end, ranges, held_t, len(tokens) + 1, p.dlq_scan)
    return State(part, members, seen_t, delays_t, s.dlq, ghost, s.budget, s.bad), perm, new


def readable(states: List[State], scope: ShareScope) -> List[str]:
    """The labels of the steps between consecutive canonical ``states``, with members and tokens
    named as in the first state all along (canonical states permute and renumber them)."""
    members = list(range(scope.members))   # canonical index -> name shown
    tokens: Dict[int, int] = {}            # canonical token -> number shown
    shown = 0
    out = []
    for before, after in zip(states, states[1:]):
        for label, _, raw in _steps(before, scope):
            nxt, perm, new = canonical_maps(raw)
            if nxt == after:
                break
        else:
            raise AssertionError("a trace's step is not a step of the model")

        def token(t: int) -> int:
            nonlocal shown
            if t not in tokens:
                shown += 1
                tokens[t] = shown
            return tokens[t]

        fresh = [t for t in sorted(new) if t and t >= before.part.next_token]
        for t in fresh:
            token(t)
        label = re.sub(r"\bm(\d)", lambda g: f"m{members[int(g.group(1))]}", label)
        label = re.sub(r"(tokens? \[?)(\d+(?:, \d+)*)", lambda g: g.group(1) + ", ".join(
            str(token(int(t))) for t in g.group(2).split(", ")), label)
        out.append(label)
        shown_members = [0] * len(members)
        for old, nw in enumerate(perm):
            shown_members[nw] = members[old]
        members = shown_members
        tokens = {new[t]: v for t, v in tokens.items() if t in new}
    return out


# ---------------------------------------------------------------- mutations

@contextmanager
def mutated(mutation: Optional[str]):
    """The rules with ``mutation`` patched in (none: as they are)."""
    if mutation is None:
        yield
        return
    if mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}")
    names = ("acknowledge", "expire", "_release", "release_undelivered", "claim_dead_letters",
             "dead_letters_written")
    original = {k: getattr(rules, k) for k in names}
    _RULES.clear()
    _CANONICAL.clear()
    patches = {}
    if mutation == "ack-ignores-token":
        def acknowledge(state, holder, token, acks, config):
            mine = [t for t, h in state.held.items() if h[0] == holder]
            return original["acknowledge"](state, holder, mine[-1] if mine else token, acks, config)
        patches["acknowledge"] = acknowledge
    elif mutation == "expire-uncounted":
        def expire(state, token, config):
            for r in state.ranges:
                if r[4] == token and r[2] == ACQUIRED:
                    r[3] -= 1
            return original["expire"](state, token, config)
        patches["expire"] = expire
    elif mutation == "limit-off-by-one":
        def _release(state, a, b, deliveries, token, delay_ms, config):
            lax = dataclasses.replace(config, delivery_count_limit=config.delivery_count_limit + 1)
            original["_release"](state, a, b, deliveries, token, delay_ms, lax)
        patches["_release"] = _release
    elif mutation == "accept-anything":
        def acknowledge(state, holder, token, acks, config):
            out = original["acknowledge"](state, holder, token, acks, config)
            for first, last, kind, _ in acks:
                if kind is A.ACCEPT and first >= state.start and last < state.end:
                    rules._set(state, first, last, ACCEPTED, 0, deliveries=0)
            rules._forget_tokens(state)
            rules._compact(state)
            return out
        patches["acknowledge"] = acknowledge
    elif mutation == "undelivered-any-token":
        def release_undelivered(state, holder, token, first, last):
            for a, b, s, deliveries, t, _ in rules._overlapping(state, first, last):
                if s == ACQUIRED:
                    rules._set(state, a, b, AVAILABLE, 0, deliveries=max(0, deliveries - 1))
            rules._forget_tokens(state)
            rules._compact(state)
        patches["release_undelivered"] = release_undelivered
    elif mutation == "scan-from-end":
        def claim_dead_letters(state, holder, max_records, dead_letter_end):
            state.dlq_scan = -1
            return original["claim_dead_letters"](state, holder, max_records, dead_letter_end)
        patches["claim_dead_letters"] = claim_dead_letters
    for k, fn in patches.items():
        setattr(rules, k, fn)
    try:
        yield
    finally:
        for k in patches:
            setattr(rules, k, original[k])
        _RULES.clear()
        _CANONICAL.clear()

