"""A member's lease (:mod:`consumer.lease`): records of owned partitions are handed out only
within ``LEASE_FRACTION`` of the session timeout after a round trip proved the owning session
alive; past half of it a renewal goes out in the background; an answer from another session
proves nothing. Against a fake client and clock: no server."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from consumer import TopicPartition, lease
from consumer.lease import LEASE_FRACTION, Lease
from consumer.offsets import Holdings
from tests.support.fakes import Clock

TP = TopicPartition("t", 0)
SESSION = 7


class Pending:
    """An exists_async answer: a stat whose ephemeral owner is ``owner`` (None: no znode)."""

    def __init__(self, owner):
        self.stat = SimpleNamespace(ephemeralOwner=owner) if owner is not None else None
        self.linked = []

    def get(self, timeout=None):
        return self.stat

    def rawlink(self, callback):
        self.linked.append(callback)

    def answer(self):  # kazoo's thread delivers a background answer
        for callback in self.linked:
            callback(SimpleNamespace(successful=lambda: True, value=self.stat))


class Client:
    def __init__(self, session=SESSION, owner=SESSION):
        self.client_id = (session, b"") if session is not None else None
        self.owner, self.sent = owner, []

    def exists_async(self, path):
        self.sent.append(Pending(self.owner))
        return self.sent[-1]


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(lease, "time", c)
    return c


def lease_of(client, owned=True, timeout_s=2.0):
    holdings = Holdings(client, "g", "m", timeout_s, threading.Event())
    the_lease = Lease(client, "/ids/m", holdings, timeout_s)
    if owned:
        with holdings.lock:
            holdings.add_locked({TP: "m-0"}, {TP: 0})
    return the_lease, holdings


def test_without_partitions_there_is_nothing_to_protect():
    the_lease, _ = lease_of(Client(session=None), owned=False)
    assert the_lease.holds()


def test_a_claim_proves_the_session_for_a_fraction_of_its_timeout(clock):
    client = Client()
    the_lease, holdings = lease_of(client)
    assert not the_lease.holds()  # owned, never proved
    with holdings.lock:
        the_lease.proved_locked(SESSION, clock.now)
    assert the_lease.length_s == 2.0 * LEASE_FRACTION
    clock.now += the_lease.length_s / 2 - 0.01
    assert the_lease.holds() and client.sent == []  # young: no renewal
    clock.now += the_lease.length_s / 2 + 0.02
    assert not the_lease.holds()  # lapsed (a process frozen that long finds out here)


def test_past_half_the_lease_one_renewal_goes_out_in_the_background_and_extends_it(clock):
    client = Client()
    the_lease, holdings = lease_of(client)
    with holdings.lock:
        the_lease.proved_locked(SESSION, clock.now)
    clock.now += the_lease.length_s * 0.6
    assert the_lease.holds() and the_lease.holds()
    assert len(client.sent) == 1  # one renewal in flight at a time
    client.sent[0].answer()
    clock.now += the_lease.length_s * 0.6  # past the first lease, within the renewed one
    assert the_lease.holds()


def test_only_an_answer_naming_the_owning_session_renews_the_lease(clock):
    the_lease, holdings = lease_of(Client(owner=99))  # the registration is another session's
    with holdings.lock:
        holdings.session = SESSION
    assert not the_lease.renew(timeout=0.1)
    the_lease, holdings = lease_of(Client())
    with holdings.lock:
        holdings.session = SESSION
    assert the_lease.renew(timeout=0.1) and the_lease.holds()


def test_a_session_that_is_not_the_owning_one_never_holds_the_lease(clock):
    the_lease, holdings = lease_of(Client(session=8))  # reconnected on a new session
    with holdings.lock:
        the_lease.proved_locked(SESSION, clock.now)
    assert not the_lease.holds()
    with holdings.lock:
        the_lease.proved_locked(8, clock.now)  # a claim on the new session: the lease starts over
    assert the_lease.holds()
