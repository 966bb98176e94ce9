"""The share-group model (:mod:`tests.model.share_protocol`) over the real rules of
``coordinator/share_partition.py``, checked exhaustively in small scopes, and every broken
variant of the rules caught. ``bin/model share`` runs a larger scope
(docs/concepts/verification.md has the figures); ``ZKGROUPS_SHARE_MODEL=big`` runs it here."""
from __future__ import annotations

import os

import pytest

from tests.model.check import check_share
from tests.model.share_protocol import MUTATIONS, ShareScope, mutation_scope

pytestmark = pytest.mark.model

#: Two members, two records, one crash and locks that run out, no dead-letter topic.
SMALL = ShareScope(members=2, records=2, dlq=0, crashes=1, expiries=0, failovers=0, stalls=0)
#: One record dead-lettered by three members, one of whose claims runs out.
LETTERS = ShareScope(members=3, records=1, dlq=1, crashes=0, expiries=0, failovers=0, stalls=1)
#: The mutations' scope (the dead-letter ones in LETTERS's: mutation_scope).
QUICK = ShareScope(members=2, records=2, dlq=0, crashes=0, expiries=0, failovers=0, stalls=0)
#: With a session expiry (the zombie) and a decider failover: minutes.
BIG = ShareScope(members=2, records=2, dlq=0, crashes=0, expiries=1, failovers=1, stalls=0)


@pytest.mark.parametrize("scope", [SMALL, LETTERS], ids=["records", "letters"])
def test_no_schedule_of_the_small_scope_breaks_an_invariant_or_loses_a_record(scope):
    result = check_share(scope, max_states=200_000)
    print(result.summary())
    assert result.violation is None, result.readable_trace()
    assert result.states > 1_000   # the search really ran


@pytest.mark.skipif(os.environ.get("ZKGROUPS_SHARE_MODEL") != "big", reason="ZKGROUPS_SHARE_MODEL=big runs it")
def test_the_bigger_scope():
    result = check_share(BIG, max_states=2_000_000)
    print(result.summary())
    assert result.violation is None, result.readable_trace()


def test_the_letters_invariant_strictly_finds_the_documented_duplicate():
    """Exactly once is not promised: a writer whose claim ran out between its scan and its
    append adds a second letter (share_exchange's docstring); the strict invariant finds it."""
    result = check_share(LETTERS._replace(letters="strict"), max_states=200_000, liveness=False)
    print(result.summary())
    print(result.readable_trace())
    assert result.violation and result.violation.startswith("5 letters")
    assert any("its claim has expired" in step for step in result.trace)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_broken_rule_is_caught_with_a_short_trace(mutation):
    result = check_share(mutation_scope(QUICK, mutation), mutation, max_states=200_000)
    print(result.summary())
    print(result.readable_trace())
    assert result.violation is not None, f"not caught: {MUTATIONS[mutation]}"
    assert len(result.trace) <= 40
