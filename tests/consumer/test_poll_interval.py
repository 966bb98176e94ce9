"""``max_poll_interval_ms`` (:mod:`consumer.poll_interval`): the clock of the application's calls
to ``poll()`` and the watchdog that evicts a member that stopped calling it. First the clock and
the watchdog alone (no server), then a Consumer evicted and rejoining on a real ZooKeeper."""
from __future__ import annotations

import threading

import pytest

from coordinator import protocol
from consumer import poll_interval
from consumer.poll_interval import PollInterval
from tests.support.consumers import consume_until, make_consumer, polled, polling  # noqa: F401
from tests.support.fakes import Clock
from tests.support.helpers import fill, wait_for

def test_poll_is_overdue_only_past_the_interval_and_never_while_the_application_is_in_it(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(poll_interval, "time", clock)
    p = PollInterval(1000, evict=lambda: None, running=lambda: True)
    clock.now += 0.9
    assert not p.overdue() and p.seconds_since_poll() == pytest.approx(0.9)
    clock.now += 0.2
    assert p.overdue()
    p.entered()
    clock.now += 5  # a poll() that takes long: the application is still calling it
    assert p.in_poll and not p.overdue() and p.seconds_since_poll() == 0.0
    p.left()
    assert not p.in_poll and not p.overdue()  # the interval counts from when poll() returned
    clock.now += 1.1
    assert p.overdue()


def test_the_watchdog_evicts_once_poll_is_overdue_and_stops_with_the_member():
    evicted, running = threading.Event(), [True]

    def evict():
        running[0] = False  # the member leaves: the watchdog's loop ends
        evicted.set()
    p = PollInterval(20, evict, lambda: running[0])
    p.entered()
    p.start()
    assert not evicted.wait(0.08)  # inside poll(): never evicted
    p.left()
    assert evicted.wait(2)



def test_max_poll_interval_evicts_and_rejoins(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [10] * 2, zk=zk)
    slow = make_consumer(max_poll_interval_ms=800)
    consume_until(slow, 20)
    other = make_consumer()
    with polling(other):
        # slow stops polling: it leaves the group, other takes everything.
        wait_for(lambda: len(other.assignment()) == 2, 15, message="other owns all after eviction")
        assert not zk.exists(protocol.ids_path("g", slow.consumer_id))
        slow.poll(100)  # rejoins
        wait_for(lambda: polled(slow) and len(slow.assignment()) == 1, 15, message="slow rejoined")
