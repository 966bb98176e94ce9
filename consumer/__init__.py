"""zkgroups' client side: group members, the Consumer API, the producer, the data plane,
Spark, and the client-side tools.

Modules, from the bottom up (each imports only those above it; ``tests/project/test_layering.py``
checks the order):

* :mod:`~consumer.compiled` — whether the compiled ``consumer._speedups`` (C: the Kafka
  records' per-record steps, the producer's send fast path) or their pure-Python code runs.
* :mod:`~consumer.records` — value types (``TopicPartition``, ``ConsumerRecord``, ...).
* :mod:`~consumer.kafka_python` — kafka-python's keywords zkgroups does not take, and what instead.
* :mod:`~consumer.deserializers` — kafka-python's key and value deserializers, applied.
* :mod:`~consumer.iteration` — what ``for record in consumer`` holds between records.
* :mod:`~consumer.hashing` — Kafka's murmur2 key partitioner.
* :mod:`~consumer.log` — the embedded, durable, partitioned log (the default data plane).
* :mod:`~consumer.partition_buffer` — one partition's positions and buffered records in a
  fetcher.
* :mod:`~consumer.fetch_buffers` — a fetcher's partitions, buffers and fair round-robin, under one lock.
* :mod:`~consumer.fetcher` — prefetching and fair ``max_poll_records`` hand-out.
* :mod:`~consumer.dataplane` — where records live, behind one interface: the embedded log or Kafka.
* :mod:`~consumer.commands` — which channel commands a member applies (pure).
* :mod:`~consumer.channel` — reading a member's command channel.
* :mod:`~consumer.registration` — a member's registration and static membership.
* :mod:`~consumer.ownership` — the claim and release transactions (pure builders).
* :mod:`~consumer.offsets` — offsets with their znode versions, fenced commits, commits of an
  outside reader.
* :mod:`~consumer.lease` — whether a member may hand out records now.
* :mod:`~consumer.claims` — how a member claims and releases partitions.
* :mod:`~consumer.joining` — how a member joins: the group's directories, a lost connection waited out.
* :mod:`~consumer.member` — the member's state machine: registration, commands, claims and
  releases.
* :mod:`~consumer.handoff` — what the member thread and the fetcher leave for the poll
  thread.
* :mod:`~consumer.partition_changes` — how a revocation, an assignment or a loss reaches a
  consumer's fetcher, its poll thread and its rebalance listener.
* :mod:`~consumer.streams` — the streams of a ``{topic: n}`` subscription.
* :mod:`~consumer.metrics` — a consumer's Prometheus metrics (opt-in).
* :mod:`~consumer.config` — the consumer's configuration and subscription.
* :mod:`~consumer.poll_interval` — ``max_poll_interval_ms``: the watchdog that makes a member
  leave when the application stops calling ``poll()``.
* :mod:`~consumer.commits` — a consumer's commits: fenced writes, auto-commit, ``commit_async``.
* :mod:`~consumer.hand_out` — the heart of ``poll()``: records only within the member's lease.
* :mod:`~consumer.lookups` — what a consumer may ask of its topics outside the group (offsets,
  times, topics).
* :mod:`~consumer.consumer` — the kafka-python-style ``Consumer``.
* :mod:`~consumer.futures` — what became of a sent record: ``FutureRecordMetadata``,
  ``DeliveryFailed``.
* :mod:`~consumer.send_path` — what ``send`` checks, and the Kafka producer's send path.
* :mod:`~consumer.producer` — the ``Producer``.
* :mod:`~consumer.parallel_state` — a parallel consumer's progress per partition and its lanes
  of records in key order.
* :mod:`~consumer.parallel` — the ``ParallelConsumer``: many records of a partition in flight,
  in key order, with the completed offsets committed.
* :mod:`~consumer.aio` — the ``AsyncConsumer``: the consumer for asyncio, its calls awaited.
* :mod:`~consumer.share_exchange` — a share member's one write per partition: acknowledgements,
  acquisition and dead letters in one compare-and-set.
* :mod:`~consumer.share_buffer` — what a share member acquired and has not handed out yet.
* :mod:`~consumer.share` — the ``ShareConsumer``: a member of a share group (a queue: records
  locked one by one, acknowledged, redelivered, dead-lettered).
* :mod:`~consumer.spark` — consumer groups inside Spark ``foreachPartition`` workers.
* :mod:`~consumer.cli` — ``groupctl``, ``pipeline`` and the live demo.

It builds on :mod:`coordinator`'s contract layer (the clients' API: the layer table in
:mod:`coordinator`'s docstring), never on its node, and never the other way round; its tools
(``consumer.cli``, ``consumer.spark.cluster``) may also use the coordinator's tools;
runtime code never imports ``tests``. Imports are lazy so that ``import consumer.log`` stays
light and ``consumer.spark`` never pulls in pyspark unless it is used.

Safe imports for applications: the packages are called ``coordinator`` and ``consumer``, so a
script of your own named ``consumer.py`` (or a ``consumer/`` directory) next to where Python
starts would shadow this one; name yours differently (``billing_consumer.py``).

The package is typed (``py.typed``); the names below are imported lazily at run time and
eagerly for type checkers.
"""
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from consumer.config import ConsumerConfig
    from consumer.consumer import Consumer, ConsumerRebalanceListener
    from consumer.hand_out import WakeupException
    from consumer.log import Log
    from consumer.futures import DeliveryFailed, FutureRecordMetadata
    from consumer.producer import Producer
    from consumer.parallel import ParallelConsumer, ProcessingFailed
    from consumer.aio import AsyncConsumer
    from consumer.share import ShareConsumer, configure_share_group
    from coordinator.share_partition import AcknowledgeType
    from consumer.records import (ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, RecordMetadata,
                                  ShareRecord, TopicPartition)
    from coordinator.errors import (AcknowledgementRefused, CommitFailedError, FetchFailed, IllegalStateError,
                                    InvalidConfig, LogCorrupted, NoOffsetForPartition, OffsetOutOfRange,
                                    RecordDeserializationError,
                                    ZkGroupsError, ZooKeeperUnavailable)
    from coordinator.zkclient import close_client, start_client

_EXPORTS = {
    "Consumer": "consumer.consumer", "ConsumerConfig": "consumer.config",
    "ConsumerRebalanceListener": "consumer.consumer", "WakeupException": "consumer.hand_out",
    "Producer": "consumer.producer", "FutureRecordMetadata": "consumer.futures",
    "ParallelConsumer": "consumer.parallel", "ProcessingFailed": "consumer.parallel",
    "AsyncConsumer": "consumer.aio",
    "ShareConsumer": "consumer.share", "AcknowledgeType": "coordinator.share_partition",
    "configure_share_group": "consumer.share",
    "ShareRecord": "consumer.records", "AcknowledgementRefused": "coordinator.errors",
    "DeliveryFailed": "consumer.futures", "Log": "consumer.log",
    "TopicPartition": "consumer.records", "ConsumerRecord": "consumer.records",
    "RecordMetadata": "consumer.records", "OffsetAndTimestamp": "consumer.records",
    "OffsetAndMetadata": "consumer.records", "RecordDeserializationError": "coordinator.errors",
    "CommitFailedError": "coordinator.errors", "NoOffsetForPartition": "coordinator.errors",
    "OffsetOutOfRange": "coordinator.errors", "IllegalStateError": "coordinator.errors",
    "ZkGroupsError": "coordinator.errors", "InvalidConfig": "coordinator.errors",
    "ZooKeeperUnavailable": "coordinator.errors", "LogCorrupted": "coordinator.errors",
    "FetchFailed": "coordinator.errors",
    "start_client": "coordinator.zkclient", "close_client": "coordinator.zkclient",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'consumer' has no attribute {name!r}")
