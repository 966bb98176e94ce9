"""The ZooKeeper harness itself: a 3-server ensemble that survives losing one server."""
import pytest

from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client
from coordinator.testing.zkserver import Ensemble, four_letter, local_classpath

pytestmark = pytest.mark.zk  # starts ZooKeeper servers of its own


@pytest.mark.skipif(local_classpath() is None, reason="needs a local ZooKeeper install")
def test_three_server_ensemble_keeps_quorum_when_one_is_killed(tmp_path):
    with Ensemble(3, tick_ms=200, fsync=False, workdir=str(tmp_path)) as ens:
        modes = sorted(four_letter("127.0.0.1", s.client_port, "srvr").split("Mode: ")[1].split()[0]
                       for s in ens.servers)
        assert modes == ["follower", "follower", "leader"]
        client = start_client(ens.connect, 4000)
        try:
            TopicRegistry(client).create("t", 2)
            leader = next(s for s in ens.servers if "Mode: leader" in four_letter("127.0.0.1", s.client_port, "srvr"))
            leader.kill()
            TopicRegistry(client).add_partitions("t", 3)  # the other two still form a quorum
            assert TopicRegistry(client).partitions("t") == 3
            ens.restart(ens.servers.index(leader))
            assert leader.serving()
        finally:
            close_client(client)
