"""Our kazoo client: requests made while ZooKeeper is away fail on close instead of hanging."""
import threading

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator.zkclient import close_client, start_client, wait_in_order
from coordinator.testing.zkserver import Ensemble, local_classpath
from tests.helpers import wait_for

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
