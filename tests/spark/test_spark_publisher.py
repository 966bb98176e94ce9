"""A worker attempt's progress znode (:mod:`consumer.spark.publisher`): updates between two
writes are coalesced into the latest, a flush writes what is pending at once, a znode an
earlier create left is written over. Real ZooKeeper, no Spark."""
from __future__ import annotations

from coordinator import protocol
from consumer.spark.publisher import ProgressPublisher
from tests.support.helpers import wait_for

PATH = protocol.spark_progress_path("run") + "/m-1"


def progress(zk):
    return protocol.decode_spark_progress(zk.get(PATH)[0], PATH)


def test_updates_between_two_writes_are_coalesced_into_the_latest(zk):
    publisher = ProgressPublisher(zk, PATH, interval_s=0.2)
    for n in range(1, 6):  # before its thread runs: one write, of the latest
        publisher.update(records=10 * n, batches=n, lag=5 - n)
    publisher.start()
    try:
        wait_for(lambda: zk.exists(PATH), message="the first write")
        assert progress(zk)[:3] == (50, 5, 0) and zk.exists(PATH).version == 0
        publisher.update(records=60, batches=6, lag=0)
        publisher.update(records=70, batches=7, lag=0)  # within the interval: one write for both
        wait_for(lambda: progress(zk).batches == 7, message="the latest counts written")
        assert zk.exists(PATH).version == 1
    finally:
        publisher.close()


def test_a_flush_writes_what_is_pending_now_and_over_a_znode_left_by_an_earlier_create(zk):
    zk.create(PATH, b"{}", makepath=True)  # a create that timed out did happen
    publisher = ProgressPublisher(zk, PATH, interval_s=60)  # its thread would wait a minute
    publisher.update(records=7, batches=1, lag=None)
    publisher.flush()
    assert progress(zk)[:3] == (7, 1, None)
    publisher.close()


def test_progress_is_published_within_its_interval_while_the_loop_is_busy(zk):
    """Counts handed over while the caller never comes back reach ZooKeeper within the interval;
    a flush writes the latest at once and an older write never lands over it."""
    from consumer.spark.publisher import ProgressPublisher

    path = "/progress/a"
    publisher = ProgressPublisher(zk, path, 0.2).start()
    try:
        def reported():
            return zk.exists(path) and protocol.decode_spark_progress(zk.get(path)[0], path)

        for n in range(1, 4):
            publisher.update(n * 100, n, None)
            wait_for(lambda: reported() and reported().records == n * 100, 10, message=f"update {n} published")
        publisher.update(400, 4, 7)
        publisher.flush()
        assert reported()[:3] == (400, 4, 7)
    finally:
        publisher.close()
    assert reported()[:3] == (400, 4, 7)
