"""Breadth-first explicit-state search of :mod:`tests.model.protocol`: every reachable state of
a scope, each checked against the invariants; a violation comes with a shortest trace.

Symmetry: members are not interchangeable (the coordinator's round-robin orders them by
consumer id), so no reduction is applied; every state is counted.

Run: ``bin/model`` (the full scope and every mutation), or ``python -m tests.model.check
--members 2 --partitions 1``; ``--mutation NAME`` checks one broken variant.
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


def _trace(parent, state) -> List[str]:
    steps = []
    while parent[state] is not None:
        state, label = parent[state]
        steps.append(label)
    return steps[::-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in Scope._field_defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    ap.add_argument("--mutation", choices=sorted(MUTATIONS), help="check one broken variant")
    ap.add_argument("--all-mutations", action="store_true", help="then check every broken variant")
    args = ap.parse_args(argv)
    scope = Scope(*(getattr(args, n) for n in Scope._fields))
    print(f"scope: {scope}", flush=True)
    failed = False
    if not args.mutation:
        r = check(scope)
        print(r.summary(), flush=True)
        if r.violation:
            print(r.readable_trace())
            failed = True
    names = sorted(MUTATIONS) if args.all_mutations else [args.mutation] if args.mutation else []
    for name in names:
        r = check(scope, name)
        print(r.summary(), flush=True)
        if r.violation:
            print(r.readable_trace(), flush=True)
        else:
            failed = True
            print(f"  NOT CAUGHT: {MUTATIONS[name]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
