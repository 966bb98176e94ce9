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
