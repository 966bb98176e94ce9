"""A member's registration (:mod:`consumer.registration`): made with its command channel in one
transaction, found ours when a create's answer was lost, a dynamic member's left by another
session replaced; a static member waits for another live session's registration and is fenced
if it stays. Real ZooKeeper for the writes; the static member's wait against a fake clock."""
from __future__ import annotations

import logging

import pytest

from consumer import registration
from consumer.registration import Registrar
from coordinator import protocol
from coordinator.errors import FencedInstanceIdError
from coordinator.protocol import Registration
from coordinator.zkclient import WAIT, Holder, close_client, session_id, start_client
from tests.support.fakes import Clock


def registrar(client, registration=None, stopped=lambda: False):
    return Registrar(client, "g", "m", registration or Registration({"t": 1}), 2.0, stopped)


def test_a_registration_is_made_with_its_channel_and_a_second_register_finds_it_ours(zk):
    zk.ensure_path(protocol.ids_path("g"))
    zk.ensure_path(protocol.channel_path("g"))
    r = registrar(zk)
    r.register(session_id(zk), create_channel=True)
    stat = zk.exists(protocol.ids_path("g", "m"))
    assert stat.ephemeralOwner == session_id(zk) and zk.exists(protocol.channel_path("g", "m"))
    r.register(session_id(zk), create_channel=True)  # as after a create whose answer was lost
    assert zk.exists(protocol.ids_path("g", "m")).czxid == stat.czxid and r.registered_session == session_id(zk)


def test_a_dynamic_members_registration_left_by_another_session_is_replaced(zk, zk_connect, caplog):
    """KAFKA-1387: the registration of our own session that ended stays for a session timeout;
    a dynamic member does not wait for it."""
    old = start_client(zk_connect, 4000)
    try:
        old.create(protocol.ids_path("g", "m"), b"{}", ephemeral=True, makepath=True)
        zk.ensure_path(protocol.channel_path("g", "m"))  # the channel exists: registered alone
        with caplog.at_level(logging.INFO, logger="zkgroups.member"):
            registrar(zk).register(session_id(zk), create_channel=True)
        raw, stat = zk.get(protocol.ids_path("g", "m"))
        assert stat.ephemeralOwner == session_id(zk) and Registration.decode(raw, "ids/m").subscription == {"t": 1}
        assert any("replacing registration left by an expired session" in r.getMessage() for r in caplog.records)
    finally:
        close_client(old)


def test_a_static_member_waits_twice_the_holders_session_timeout_then_is_fenced(monkeypatch):
    clock = Clock(50.0)
    monkeypatch.setattr(registration, "time", clock)
    static = Registration({"t": 1}, group_instance_id="i1", session_timeout_ms=2000)
    held = Registration({"t": 1}, host="h2", group_instance_id="i1", session_timeout_ms=1500,
                        static_grace_ms=5000).encode()
    r, waits = registrar(None, static), {}
    holder = Holder(0xab, held, 0)
    assert r._wait_for_holder(holder, waits) == WAIT
    clock.now += 2.9  # twice the holder's 1.5 s, not ours
    assert r._wait_for_holder(holder, waits) == WAIT
    clock.now += 0.2
    with pytest.raises(FencedInstanceIdError, match=r"'i1' of group g is in use by another live consumer "
                                                     r"\(host h2, ZooKeeper session 0xab\)"):
        r._wait_for_holder(holder, waits)


def test_a_static_member_closed_while_it_waits_stops_waiting_and_a_damaged_holder_is_waited_for_by_our_timeout(
        monkeypatch):
    clock = Clock(50.0)
    monkeypatch.setattr(registration, "time", clock)
    static = Registration({"t": 1}, group_instance_id="i1", session_timeout_ms=2000)
    closed = [False]
    r, waits = registrar(None, static, stopped=lambda: closed[0]), {}
    damaged = Holder(0xcd, b"{not json", 0)
    assert r._wait_for_holder(damaged, waits) == WAIT and waits[0xcd] == pytest.approx(50.0 + 2 * 2.0)
    closed[0] = True
    with pytest.raises(FencedInstanceIdError, match=r"host \?"):
        r._wait_for_holder(damaged, waits)
