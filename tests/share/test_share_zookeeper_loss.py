"""A share group through the loss of ZooKeeper's leader (a 3-server ensemble, the leader
SIGKILLed mid-flight, then restarted): every record is accepted, exactly one acceptance of each
takes effect, and none is delivered past the limit."""
from __future__ import annotations

import threading

import pytest

from consumer import ShareConsumer, configure_share_group
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.protocol.share import SharePartitionState, share_partitions_path
from coordinator.testing.zkserver import Ensemble, four_letter
from coordinator.zkclient import close_client, start_client
from tests.support.helpers import fill, wait_for

pytestmark = pytest.mark.zk

RECORDS = 3000


def _leader(ensemble):
    return next((s for s in ensemble.servers
                 if s.running and "Mode: leader" in four_letter("127.0.0.1", s.client_port, "srvr")), None)


class Worker(threading.Thread):
    """A member in a thread of its own: polls, keeps what each poll returned and what was refused."""

    def __init__(self, connect, data_dir):
        super().__init__(daemon=True)
        self.refused, self.given, self.stop = set(), [], threading.Event()
        self.consumer = ShareConsumer("q", ["t"], zk=connect, data_dir=data_dir, max_poll_records=50,
                                      session_timeout_ms=6000, acknowledgement_commit_callback=self.result)
        self.error = None

    def result(self, offsets, error):
        if error is not None:
            self.refused |= {(error.partition.partition, o) for o in error.offsets}

    def run(self):
        try:
            while not self.stop.is_set():
                self.given += [(r.partition, r.offset, r.delivery_count) for r in self.consumer.poll(100)]
            self.consumer.close()
        except Exception as e:  # the test says what it was
            self.error = e


def test_a_share_group_rides_out_the_loss_of_zookeepers_leader(tmp_path):
    data_dir = str(tmp_path / "data")
    with Ensemble(3, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")) as ens:
        zk = start_client(ens.connect, 6000)
        node = Coordinator(ens.connect, "n1", CoordinatorConfig()).start()
        workers = []
        try:
            fill(data_dir, "t", [RECORDS // 2] * 2, zk=zk)
            configure_share_group(zk, "q", {"share.auto.offset.reset": "earliest",
                                            "share.record.lock.duration.ms": 3000})
            workers = [Worker(ens.connect, data_dir) for _ in range(2)]
            for w in workers:
                w.start()
            wait_for(lambda: sum(len(w.given) for w in workers) > RECORDS // 4, 30, message="a quarter given")
            leader = wait_for(lambda: _leader(ens), 30, message="the ensemble's leader")
            leader.kill()
            ens.wait_serving(30, [s for s in ens.servers if s.running])
            ens.restart(ens.servers.index(leader))

            def done(p):
                path = share_partitions_path("q", "t", p)
                return SharePartitionState.decode(zk.get(path)[0], path).start == RECORDS // 2
            wait_for(lambda: done(0) and done(1), 90, message="every record accepted")
        finally:
            for w in workers:
                w.stop.set()
            for w in workers:
                w.join(30)
            node.close()
            close_client(zk)
    assert all(w.error is None for w in workers), [w.error for w in workers]
    accepted = [(p, o) for w in workers for p, o, _ in w.given if (p, o) not in w.refused]
    assert len(accepted) == len(set(accepted)) == RECORDS   # each accepted once, none lost
    assert max(n for w in workers for *_, n in w.given) <= 5
