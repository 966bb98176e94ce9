"""The streams of a ``{topic: n}`` subscription (:mod:`consumer.streams`): n iterators over
disjoint partitions, fed by one polling thread, ended by ``close()``. A Consumer on a real
ZooKeeper with a coordinator."""
from __future__ import annotations

import threading

from consumer import TopicPartition
from tests.support.consumers import make_consumer  # noqa: F401 (a fixture)
from tests.support.helpers import fill, wait_for


def test_streams_split_partitions_across_threads(cluster, zk, data_dir, make_consumer):
    cluster.node("n")
    fill(data_dir, "t", [100] * 4, zk=zk)
    c = make_consumer(topics={"t": 2})
    streams = c.streams()
    assert len(streams) == 2
    got = [[], []]

    def drain(i):
        for record in streams[i]:
            got[i].append(record)
            if sum(map(len, got)) >= 400:
                break
    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: sum(map(len, got)) >= 400, 20, message="400 records through 2 streams")
    parts = [{r.partition for r in g} for g in got]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    c.commit()
    assert sum(c.committed(TopicPartition("t", p)) for p in range(4)) == 400
    c.close()
    for t in threads:
        t.join(5)
        assert not t.is_alive()
