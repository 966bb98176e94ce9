"""A node's rebalance handlers (:mod:`coordinator.rebalance_handlers`): what each way a run ends
leads to — a generation logged and recorded, a retry later, the term's end, a run again, a
group deleted said in one line. First against fakes of the run and its surroundings (no
server), then a group deleted during its rebalance on a real ZooKeeper."""
from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator import protocol
from coordinator.errors import ConsumerRebalanceFailedException
from coordinator.fencing import Deposed
from coordinator.rebalance import Abandoned, GroupDeleted, Outcome, Superseded
from coordinator.rebalance_handlers import PoolState, RebalanceHandlers
from coordinator.requests import RebalanceRequests
from coordinator.topics import TopicRegistry
from coordinator.zkclient import TransactionFailed, commit
from tests.support.groups import Cluster, read_state, wait_stable
from tests.support.helpers import wait_for

# ---------------------------------------------------------------- against fakes, no server

class Term:
    def __init__(self):
        self.active, self.fence, self.shard, self.ended = True, object(), 0, []

    def end(self, why):
        self.ended.append(why)
        self.active = False


class Terms:
    def __init__(self, term):
        self.term, self.retries = term, []

    def of(self, group):
        return self.term

    def retry_later(self, group, ms):
        self.retries.append((group, ms))


class Follower:
    def __init__(self):
        self.topics, self.group_watches, self.verifications, self.requests = {"t": 2}, {}, [], []

    def verified(self, group):
        self.verifications.append(group)

    def request(self, group):
        self.requests.append(group)


class Timeline:
    def __init__(self):
        self.records = []

    def record(self, group, fence, outcome=None, **how):
        self.records.append((group, outcome, how))


class Metrics:
    @contextlib.contextmanager
    def rebalance(self, group, generations):
        yield SimpleNamespace(outcome=None)


class Rebalancer:
    """A run that ends as told: raises ``ends`` if it is an exception, else returns it."""

    def __init__(self, ends):
        self.ends, self.generations = ends, {}

    def run(self, group, topics, fence, **kwargs):
        if isinstance(self.ends, BaseException):
            raise self.ends
        return self.ends


def handlers(ends, term=None):
    term = term or Term()
    config = SimpleNamespace(handler_threads=1, settle_ms=0, failed_retry_interval_ms=1000, rebalance_backoff_ms=50,
                             bootstrap_servers="")
    node = SimpleNamespace(node_id="n", config=config, metrics=Metrics())
    index = SimpleNamespace(update=lambda group, registrations: None)
    return RebalanceHandlers(node, Terms(term), Follower(), SimpleNamespace(changed=lambda group: False),
                             Rebalancer(ends), index, Timeline())


def generation(**fields):
    return Outcome(**{"group": "g", "changed": True, "state": protocol.STABLE, "generation": 4, **fields})


def test_a_generation_is_logged_recorded_and_verified(caplog):
    h = handlers(generation(reasons=["membership changed"], members=2, moved=1))
    with caplog.at_level(logging.INFO, logger="zkgroups.coordinator"):
        h._rebalance("g")
    line = next(r.getMessage() for r in caplog.records if "group g generation 4" in r.getMessage())
    assert "reason=membership changed members=2 moved=1" in line
    assert [(g, how) for g, _, how in h.timeline.records] == [("g", {})]
    assert h.follower.verifications == ["g"] and h.terms.retries == []


def test_ownership_already_right_is_verified_without_a_line_and_a_hold_or_a_squatter_is_looked_at_later(caplog):
    h = handlers(generation(changed=False))
    with caplog.at_level(logging.INFO, logger="zkgroups.coordinator"):
        h._rebalance("g")
    assert not caplog.records and h.timeline.records == [] and h.follower.verifications == ["g"]
    h = handlers(generation(changed=False, unavailable=1, recheck_ms=300))
    h._rebalance("g")
    assert h.terms.retries == [("g", 1000), ("g", 300)] and len(h.timeline.records) == 1


@pytest.mark.parametrize("ends, retry, recorded, verified, requested", [
    (ConsumerRebalanceFailedException("m did not ack"), 1000, {"failed": True}, True, False),
    (Superseded(), None, {"superseded": True}, False, False),
    (Abandoned(), None, None, False, True),
    (GroupDeleted("group g was deleted"), None, None, True, False),
    (ConnectionLoss(), 50, None, False, False),
    (RuntimeError("a bug"), 1000, None, False, False),
])
def test_how_a_run_ends_decides_what_comes_next(ends, retry, recorded, verified, requested):
    h = handlers(ends)
    h._rebalance("g")  # never raises: the handler thread goes on
    assert h.terms.retries == ([("g", retry)] if retry else [])
    assert [how for _, _, how in h.timeline.records] == ([recorded] if recorded else [])
    assert h.follower.verifications == (["g"] if verified else [])
    assert h.follower.requests == (["g"] if requested else [])


def test_a_deposed_run_ends_its_term_and_an_ended_term_runs_nothing():
    term = Term()
    h = handlers(Deposed("the shard epoch moved"), term)
    h._rebalance("g")
    assert term.ended == ["deposed: the shard epoch moved"] and not term.active
    h.rebalancer.ends = generation()
    h._rebalance("g")  # the term is over: no run
    assert h.follower.verifications == [] and h.timeline.records == []


def test_the_pool_starts_once_and_stops_every_handler():
    h = handlers(generation())
    h.requests = RebalanceRequests()
    h.start()
    h.start()  # a second start does nothing
    assert len(h._threads) == 1
    h.stop()
    assert h.state is PoolState.STOPPED and not any(t.is_alive() for t in h._threads)



def delete_subtree(zk, path: str) -> bool:
    """Delete ``path`` and everything under it in one transaction, children first (as
    ``groupctl groups delete`` does); False if something changed under it meanwhile (nothing
    was deleted)."""
    def subtree(p):
        return [q for child in zk.get_children(p) for q in subtree(f"{p}/{child}")] + [p]
    t = zk.transaction()
    for p in subtree(path):
        t.delete(p)
    try:
        commit(t)
        return True
    except TransactionFailed:
        return False


def test_a_group_deleted_during_its_rebalance_ends_it_with_one_line(zk_connect, zk, caplog):
    """An administrator deletes a group's znodes (all at once, a registration left by a member
    that never acks included) while the coordinator waits for that member's ack: the rebalance
    ends with one line saying the group was deleted, no error, no traceback, and nothing of the
    group is written again."""
    caplog.set_level(logging.INFO, logger="zkgroups.coordinator")
    cluster = Cluster(zk_connect, rebalance_timeout_ms=60000)
    try:
        TopicRegistry(zk).create("t", 2)
        cluster.node("n")
        cluster.member("g", ["t"])
        wait_stable(zk, "g", 1)
        mute = cluster.client()  # registers, never reads its channel
        mute.ensure_path(protocol.channel_path("g", "g_mute-1-0"))
        mute.create(protocol.ids_path("g", "g_mute-1-0"), protocol.Registration({"t": 1}).encode(), ephemeral=True)
        for m in cluster.members:
            m.close(timeout=5)
        cluster.members.clear()
        wait_for(lambda: (lambda st: st.state == protocol.REBALANCING and st.members == ["g_mute-1-0"])(
            read_state(zk, "g")), message="a rebalance waiting for the mute member")
        wait_for(lambda: delete_subtree(zk, protocol.group_path("g")), message="the group deleted")
        wait_for(lambda: [r for r in caplog.records if "was deleted" in r.getMessage()], 15,
                 message="the line saying the group is gone")
        assert not zk.exists(protocol.group_path("g"))
        deleted = [r for r in caplog.records if "was deleted" in r.getMessage()]
        assert len(deleted) == 1 and deleted[0].levelno == logging.INFO, [r.getMessage() for r in deleted]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
            [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    finally:
        cluster.close()
