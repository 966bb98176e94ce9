"""Breadth-first explicit-state search of :mod:`tests.model.protocol`: every reachable state of
a scope, each checked against the invariants; a violation comes with a shortest trace.

Symmetry: members are not interchangeable (the coordinator's round-robin orders them by
consumer id), so no reduction is applied; every state is counted.

Run: ``bin/model`` (the full scope and every mutation), or ``python -m tests.model.check
--members 2 --partitions 1``; ``--mutation NAME`` checks one broken variant.

The share-group model (:mod:`tests.model.share_protocol`): ``bin/model share`` (or ``python -m
tests.model.check --protocol share``), searched by :func:`check_share`, which also checks that
from every reachable state the steps without faults still lead to the end (every record
accepted or archived, every letter written). Members there are interchangeable: each state is
stored once for all orders of its members.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from tests.model.protocol import MUTATIONS, Scope, initial, successors, violations


@dataclass
class Result:
    scope: Scope
    mutation: Optional[str]
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    violation: Optional[str] = None
    trace: List[str] = field(default_factory=list)

    def summary(self) -> str:
        what = f"mutation {self.mutation}" if self.mutation else "protocol"
        outcome = f"VIOLATION in {len(self.trace)} steps: {self.violation}" if self.violation else "no violation"
        return (f"{what}: {self.states:,} states, {self.transitions:,} transitions, depth {self.depth}, "
                f"{self.seconds:.1f} s: {outcome}")

    def readable_trace(self) -> str:
        return "\n".join(f"  {k + 1:2}. {step}" for k, step in enumerate(self.trace))


def check(scope: Scope, mutation: Optional[str] = None, max_states: Optional[int] = None) -> Result:
    """Explore every state of ``scope`` reachable from the initial one (stopping at the first
    violation, or after ``max_states``, which then raises: a bound must never pass silently)."""
    if mutation is not None and mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}")
    started = time.monotonic()
    result = Result(scope, mutation)
    start = initial(scope)
    parent = {start: None}   # state -> (previous state, label): the trace back
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        result.depth = max(result.depth, depth)
        problem = violations(state)
        if problem:
            result.violation, result.trace = problem, _trace(parent, state)
            break
        for label, nxt in successors(state, scope, mutation):
            result.transitions += 1
            if nxt not in parent:
                parent[nxt] = (state, label)
                frontier.append((nxt, depth + 1))
        if max_states is not None and len(parent) > max_states:
            raise RuntimeError(f"more than {max_states:,} states: the scope is larger than expected")
    result.states = len(parent)
    result.seconds = time.monotonic() - started
    return result


def check_share(scope, mutation: Optional[str] = None, max_states: Optional[int] = None,
                liveness: bool = True) -> Result:
    """Every state of the share-group model's ``scope`` (a
    :class:`~tests.model.share_protocol.ShareScope`) reachable from the initial one, each checked
    against the invariants (stopping at the first violation); then, if ``liveness``, that the
    steps without faults lead every reachable state to a goal state (the trace then ends in a
    state from which none can be reached). ``max_states`` as for :func:`check`."""
    from tests.model import share_protocol as sp
    started = time.monotonic()
    result = Result(scope, mutation)
    start = sp.initial(scope)
    ids = {start: 0}
    states = [start]
    parent: List[Optional[Tuple[int, str]]] = [None]
    depths = [0]
    back: List[List[int]] = [[]]   # predecessors by steps that are not faults
    goals = []
    with sp.mutated(mutation):
        k = 0
        while k < len(states):
            state = states[k]
            problem = sp.violations(state, scope)
            if problem:
                result.violation, result.trace = problem, _share_trace(parent, states, k, scope)
                break
            if sp.goal(state, scope):
                goals.append(k)
            for label, fault, nxt in sp.successors(state, scope):
                result.transitions += 1
                j = ids.get(nxt)
                if j is None:
                    j = ids[nxt] = len(states)
                    states.append(nxt)
                    parent.append((k, label))
                    depths.append(depths[k] + 1)
                    back.append([])
                if not fault:
                    back[j].append(k)
            if max_states is not None and len(states) > max_states:
                raise RuntimeError(f"more than {max_states:,} states: the scope is larger than expected")
            k += 1
    result.states = len(states)
    result.depth = max(depths)
    if liveness and result.violation is None:
        reaches = bytearray(len(states))
        todo = list(goals)
        for g in goals:
            reaches[g] = 1
        while todo:
            j = todo.pop()
            for i in back[j]:
                if not reaches[i]:
                    reaches[i] = 1
                    todo.append(i)
        stuck = reaches.find(0)
        if stuck >= 0:
            s = states[stuck]
            result.violation = (f"1 eventually: from this state no steps without faults accept or archive every "
                                f"record (and write every letter): window [{s.part.start}, {s.part.end}) "
                                f"{list(s.part.ranges)}, held {list(s.part.held)}, letters {list(s.dlq)}")
            result.trace = _share_trace(parent, states, stuck, scope)
    result.seconds = time.monotonic() - started
    return result


def _share_trace(parent, states, k: int, scope) -> List[str]:
    from tests.model.share_protocol import readable
    path = [k]
    while parent[k] is not None:
        k = parent[k][0]
        path.append(k)
    return readable([states[j] for j in reversed(path)], scope)


def _trace(parent, state) -> List[str]:
    steps = []
    while parent[state] is not None:
        state, label = parent[state]
        steps.append(label)
    return steps[::-1]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["share"]:
        argv[:1] = ["--protocol", "share"]
    if "--protocol" in argv and argv[argv.index("--protocol") + 1:][:1] == ["share"]:
        i = argv.index("--protocol")
        return share_main(argv[:i] + argv[i + 2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=("groups", "share"), default="groups",
                    help="the consumer-group protocol (default) or the share-group one")
    for name, default in Scope._field_defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    ap.add_argument("--mutation", choices=sorted(MUTATIONS), help="check one broken variant")
    ap.add_argument("--all-mutations", action="store_true", help="then check every broken variant")
    args = ap.parse_args(argv)
    scope = Scope(*(getattr(args, n) for n in Scope._fields))
    print(f"scope: {scope}", flush=True)
    return _run(lambda: check(scope), args, MUTATIONS, lambda name: check(scope, name))


def share_main(argv) -> int:
    """``bin/model share``: the share-group model, then (``--all-mutations``) every broken rule."""
    from tests.model.share_protocol import MUTATIONS as SHARE_MUTATIONS, ShareScope, mutation_scope
    ap = argparse.ArgumentParser(prog="bin/model share", description="the share-group protocol's model check")
    for name, default in ShareScope._field_defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    ap.add_argument("--mutation", choices=sorted(SHARE_MUTATIONS), help="check one broken variant of the rules")
    ap.add_argument("--all-mutations", action="store_true", help="then check every broken variant")
    ap.add_argument("--no-liveness", action="store_true", help="check the invariants only")
    args = ap.parse_args(argv)
    scope = ShareScope(*(getattr(args, n) for n in ShareScope._fields))
    print(f"share scope: {scope}", flush=True)
    return _run(lambda: check_share(scope, liveness=not args.no_liveness), args, SHARE_MUTATIONS,
                lambda name: check_share(mutation_scope(scope, name), name, liveness=not args.no_liveness))


def _run(protocol, args, mutations, mutant) -> int:
    """Check the protocol (unless one mutation is asked for), then the mutations asked for,
    printing each result; 1 if the protocol broke an invariant or a mutation was not caught."""
    failed = False
    if not args.mutation:
        r = protocol()
        print(r.summary(), flush=True)
        if r.violation:
            print(r.readable_trace())
            failed = True
    names = sorted(mutations) if args.all_mutations else [args.mutation] if args.mutation else []
    for name in names:
        r = mutant(name)
        print(r.summary(), flush=True)
        if r.violation:
            print(r.readable_trace(), flush=True)
        else:
            failed = True
            print(f"  NOT CAUGHT: {mutations[name]}", flush=True)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
