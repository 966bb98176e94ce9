"""zkgroups' client library: consumers, the producer and the embedded partitioned log.

Imports are lazy so that ``import consumer.log`` stays light and ``consumer.spark`` never
pulls in pyspark unless it is used.
"""
from importlib import import_module

_EXPORTS = {
    "Consumer": "consumer.consumer", "ConsumerConfig": "consumer.consumer",
    "ConsumerRebalanceListener": "consumer.consumer", "WakeupException": "consumer.consumer",
    "Producer": "consumer.producer", "Log": "consumer.log",
    "TopicPartition": "consumer.records", "ConsumerRecord": "consumer.records",
    "RecordMetadata": "consumer.records", "OffsetAndTimestamp": "consumer.records",
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
