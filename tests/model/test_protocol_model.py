"""The protocol model checked exhaustively in a small scope, and every mutation caught.

The full scope runs as ``bin/model`` (docs/concepts/verification.md has its figures)."""
from __future__ import annotations

import pytest

from tests.model.check import check
from tests.model.protocol import MUTATIONS, Scope

pytestmark = pytest.mark.model

SMALL = Scope(members=2, partitions=1, records=2, expiries=1, failovers=1, lost_answers=1)



def test_no_schedule_of_the_small_scope_breaks_an_invariant():
    result = check(SMALL, max_states=200_000)
    print(result.summary())
    assert result.violation is None, result.readable_trace()
    assert result.states > 10_000  # the search really ran (a model that deadlocks early proves nothing)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught_with_a_short_trace(mutation):
    result = check(SMALL, mutation, max_states=2_000_000)
    print(result.summary())
    print(result.readable_trace())
    assert result.violation is not None, f"not caught: {MUTATIONS[mutation]}"
    assert len(result.trace) <= 40
