"""Our kazoo client: requests made while ZooKeeper is away fail on close instead of hanging; a
connection lost while the chroot is created is waited out; one way to make an ephemeral znode
ours whoever holds it."""
import threading

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator.zkclient import (REPLACE, WAIT, PolicyClient, close_client, create_ephemeral, session_id,
                                  start_client, wait_in_order)
from coordinator.testing.zkserver import Ensemble, local_classpath
from tests.support.helpers import freeze_until_dropped, wait_for

pytestmark = pytest.mark.zk  # starts ZooKeeper servers of its own


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_a_request_queued_while_disconnected_fails_when_the_client_closes(tmp_path):
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path)) as ens:
        client = start_client(ens.connect, 2000)
        ens.servers[0].kill()
        wait_for(lambda: not client.connected, message="the client notices")
        queued = client.get_async("/")  # waits for a reconnect that will not come
        closing = threading.Thread(target=close_client, args=(client,), daemon=True)
        closing.start()
        closing.join(20)
        assert not closing.is_alive(), "stop() hangs"
        with pytest.raises(ConnectionLoss):
            queued.get(timeout=5)


def test_waiting_for_the_last_of_pipelined_requests_waits_for_all(zk):
    """ZooKeeper answers one session's requests in order: once the last is in, all are."""
    zk.ensure_path("/pipelined")
    for _ in range(20):
        answers = [zk.get_async("/pipelined") for _ in range(50)] + [zk.get_children_async("/pipelined")]
        assert wait_in_order(answers, timeout=10) is answers
        assert all(a.ready() for a in answers)
    assert wait_in_order([]) == []


def _holder(zk_connect, path):
    """Another session holding the ephemeral ``path``."""
    other = start_client(zk_connect, 2000)
    other.create(path, b"theirs", ephemeral=True, makepath=True)
    return other


def test_create_ephemeral_creates_it_or_finds_it_ours(zk):
    zk.ensure_path("/eph")
    assert create_ephemeral(zk, "/eph/a", b"x", lambda h: pytest.fail("not held"))
    assert zk.exists("/eph/a").ephemeralOwner == session_id(zk)
    assert create_ephemeral(zk, "/eph/a", b"y", lambda h: pytest.fail("ours already"))  # a lost answer's create
    assert zk.get("/eph/a")[0] == b"x"


def test_create_ephemeral_waits_for_another_sessions_znode_to_go(zk, zk_connect):
    other = _holder(zk_connect, "/eph/b")
    seen = []

    def held(holder):
        seen.append(holder)
        if len(seen) == 1:
            threading.Timer(0.2, close_client, args=(other,)).start()  # the holder goes, later
        return WAIT

    assert create_ephemeral(zk, "/eph/b", b"mine", held, poll_s=0.1)
    assert seen[0].data == b"theirs" and seen[0].session != session_id(zk)
    assert zk.get("/eph/b")[0] == b"mine"


def test_create_ephemeral_replaces_a_znode_it_is_told_is_its_own_dead_sessions(zk, zk_connect):
    other = _holder(zk_connect, "/eph/c")
    try:
        assert create_ephemeral(zk, "/eph/c", b"mine", lambda holder: REPLACE)
        assert zk.exists("/eph/c").ephemeralOwner == session_id(zk)
    finally:
        close_client(other)


def test_create_ephemeral_gives_up_when_stopped_or_when_told_to(zk, zk_connect):
    other = _holder(zk_connect, "/eph/d")
    stop = threading.Event()
    try:
        threading.Timer(0.2, stop.set).start()
        assert create_ephemeral(zk, "/eph/d", b"mine", lambda holder: WAIT, stopped=stop.is_set, poll_s=0.1) is False

        def refuse(holder):
            raise RuntimeError("fenced")
        with pytest.raises(RuntimeError, match="fenced"):
            create_ephemeral(zk, "/eph/d", b"mine", refuse)
    finally:
        close_client(other)


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_a_connection_lost_while_the_chroot_is_created_is_waited_out(tmp_path, monkeypatch):
    """start_client has connected; then, as it creates its chroot, ZooKeeper stops answering
    until the client drops the connection (as when it loses its quorum). It waits for the
    connection, within its connect timeout, and returns a client under the chroot. Before, a
    lost connection there was a ZkGroupsError ('cannot create the chroot /app: ConnectionLoss',
    exit 1: seen in bin/chaos)."""
    with Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path)) as ens:
        real = PolicyClient.create_async

        def frozen_first(client, path, *args, **kwargs):
            if path == "/app":
                monkeypatch.setattr(PolicyClient, "create_async", real)
                freeze_until_dropped(ens.servers[0].proc.pid, client)
            return real(client, path, *args, **kwargs)
        monkeypatch.setattr(PolicyClient, "create_async", frozen_first)
        client = start_client(ens.connect + "/app", 2000, connect_timeout=30)
        try:
            assert client.exists("/") is not None and client.chroot == "/app"
        finally:
            close_client(client)
