"""coordinator.shard_terms.ShardTerms: what a node's event thread and its handlers share (pure:
terms are never ended against ZooKeeper here)."""
import time

from coordinator import protocol
from coordinator.fencing import ShardTerm
from coordinator.shard_terms import ShardTerms


def terms_with(count=4):
    terms = ShardTerms()
    terms.count = count
    return terms


def group_in(shard, count=4):
    return next(f"g{i}" for i in range(1000) if protocol.shard_of(f"g{i}", count) == shard)


def test_a_group_is_led_under_its_shards_term_until_it_ends():
    terms, g = terms_with(), group_in(1)
    assert terms.of(g) is None
    term = ShardTerm(1, epoch=3)
    terms.begin(term, [g])
    assert terms.of(g) is term and terms.held() == {1: 3}
    term.end("moved")
    assert terms.of(g) is None and terms.get(1) is term and terms.held() == {}
    terms.drop(1)
    assert terms.get(1) is None


def test_a_shard_is_verified_once_each_of_its_groups_is():
    terms = terms_with()
    a, b = group_in(2), next(f"h{i}" for i in range(1000) if protocol.shard_of(f"h{i}", 4) == 2)
    term = ShardTerm(2, epoch=1)
    terms.begin(term, [a, b])
    assert terms.report() == {2: {"epoch": 1, "verified": False}} and not terms.all_verified()
    assert terms.verified(a) is None
    assert terms.verified(b) is term  # the last one: the shard is verified
    assert terms.verified(b) is None  # not waiting any more
    assert terms.report() == {2: {"epoch": 1, "verified": True}} and terms.all_verified()


def test_retries_come_due_once():
    terms = terms_with()
    now = time.monotonic()
    terms.retry_later("g", 0)
    terms.retry_later("h", 60_000)
    assert terms.due_retries(now + 1) == ["g"]
    assert terms.due_retries(now + 1) == []
    assert terms.due_retries(now + 61) == ["h"]


def test_no_shard_count_no_shard():
    assert ShardTerms().shard_of("g") is None and ShardTerms().of("g") is None
