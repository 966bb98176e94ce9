"""Consumers in a test: the ``make_consumer`` fixture (closed at the end), ways to keep them
polling, and a ZooKeeper of a test's own to kill (``own_zookeeper``). Shared by the Consumer's
test files: ``tests/consumer/test_consumer.py`` and the files named after its parts
(``test_hand_out.py``, ``test_commits.py``, ``test_partition_changes.py``, ``test_poll_interval.py``,
``test_streams.py``)."""
from __future__ import annotations

import contextlib
import threading
import time

import pytest

from consumer import Consumer, ConsumerRebalanceListener


def polled(*consumers) -> bool:
    """Poll each consumer once (so it takes part in rebalances); always true, for use in conditions."""
    for c in consumers:
        c.poll(50)
    return True


def consume_until(consumer, count, timeout=30.0, **poll):
    """Poll ``consumer`` until ``count`` records came or ``timeout`` passed; the records."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=100, **poll).values():
            got.extend(recs)
    return got


@contextlib.contextmanager
def polling(consumer):
    """Keep ``consumer`` polling on a thread of its own (so it takes part in rebalances)."""
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [consumer.poll(50) for _ in iter(stop.is_set, True)])
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def make_consumer(zk_connect, data_dir):
    made = []

    def make(group="g", topics=("t",), **config):
        config.setdefault("auto_offset_reset", "earliest")
        c = Consumer(group, list(topics) if not isinstance(topics, dict) else topics, zk=zk_connect,
                     data_dir=data_dir, session_timeout_ms=2000, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


class LostRecorder(ConsumerRebalanceListener):
    def __init__(self):
        self.lost = []

    def on_partitions_lost(self, partitions):
        self.lost.append(partitions)


@pytest.fixture
def own_zookeeper(zk_server, tmp_path):
    """A ZooKeeper of this test's own to kill and restart, a client and a coordinator on it."""
    if not zk_server.local:
        pytest.skip("needs a local ZooKeeper to kill and restart")
    from coordinator.zkclient import close_client, start_client
    from coordinator.testing.zkserver import Ensemble
    from tests.support.groups import Cluster
    ens = Ensemble(1, tick_ms=200, fsync=False, workdir=str(tmp_path / "zk")).start()
    zk = start_client(ens.connect, 2000)
    cluster = Cluster(ens.connect, session_timeout_ms=2000)
    cluster.node("a")
    try:
        yield ens, zk, cluster
    finally:
        if not ens.servers[0].running:
            ens.restart(0)  # so that the clean-up does not wait for a dead server
        cluster.close()
        close_client(zk)
        ens.close()
