"""What a worker task is made of (:mod:`consumer.spark.executor`) without a Spark session: its
member id (a valid znode name whatever the application and run ids), a batch of records read
by partition and by range, the committed offsets it reads (a damaged one logged, read as
none). The last on a real ZooKeeper. (Worker tasks on Spark: ``test_spark.py``.)"""
from __future__ import annotations

import logging

from consumer.records import ConsumerRecord, TopicPartition
from consumer.spark.executor import Batch, WorkerContext, read_committed, sanitize_id, worker_consumer_id
from coordinator import protocol

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_a_workers_member_id_is_a_valid_name_whatever_the_ids_it_is_made_of():
    cid = worker_consumer_id("g", "app/1 x", "run:2", index=3, attempt=1, restart=2)
    assert cid == "g_spark-app_1_x-run_2-p3-r2-a1"
    protocol.validate_name(cid, "consumer id")
    assert sanitize_id("..") == "_" and sanitize_id("") == "_" and len(sanitize_id("x" * 1000)) <= protocol.MAX_NAME_LENGTH


def test_a_batch_is_read_by_partition_and_by_range():
    records = {tp: [ConsumerRecord(tp.topic, tp.partition, o, 0, None, b"v") for o in range(first, first + n)]
               for tp, first, n in ((T0, 5, 3), (T1, 0, 2))}
    batch = Batch(records, WorkerContext("g", "app", "run", 0, 0, "g_spark-x"))
    assert len(batch) == 5 and batch.columns is None  # records, not the log's columns
    assert batch.ranges == {T0: (5, 8), T1: (0, 2)} and repr(batch) == "Batch(t-0[5:8), t-1[0:2))"
    assert [(r.partition, r.offset) for r in batch] == [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1)]


def test_the_committed_offsets_are_read_and_a_damaged_one_is_logged_as_none(zk, caplog):
    zk.create(protocol.offsets_path("g", "t", 0), b"12", makepath=True)
    zk.create(protocol.offsets_path("g", "t", 1), b"twelve")
    with caplog.at_level(logging.ERROR, logger="zkgroups.spark"):
        assert read_committed(zk, "g", [T0, T1, TopicPartition("t", 2)]) == {T0: 12, T1: None,
                                                                           TopicPartition("t", 2): None}
    assert any(protocol.offsets_path("g", "t", 1) in r.getMessage() for r in caplog.records)
