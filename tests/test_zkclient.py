"""Our kazoo client: requests made while ZooKeeper is away fail on close instead of hanging; a
connection lost while the chroot is created is waited out."""
import threading

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator.zkclient import PolicyClient, close_client, start_client, wait_in_order
from coordinator.testing.zkserver import Ensemble, local_classpath
from tests.helpers import freeze_until_dropped, wait_for

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
