"""What the share-group tests share: ShareConsumers closed at the end, the group's settings, its state."""
from __future__ import annotations

import pytest

from consumer import ShareConsumer
from coordinator.protocol.share import SharePartitionState, ShareGroupConfig, share_group_path, share_partitions_path
from tests.support.helpers import wait_for


@pytest.fixture
def make(zk_connect, data_dir):
    """make(group="q", topics=("t",), **ShareConsumer keywords): a ShareConsumer on the embedded log."""
    made = []

    def make(group="q", topics=("t",), **config):
        config.setdefault("session_timeout_ms", 2000)
        c = ShareConsumer(group, list(topics), zk=zk_connect, data_dir=data_dir, **config)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def configure(zk, group="q", **settings):
    """Set the share group's settings (keys with _ for .: share_delivery_count_limit=3)."""
    config = ShareGroupConfig().with_settings({k.replace("_", "."): str(v) for k, v in settings.items()})
    zk.ensure_path(share_group_path(group))
    zk.set(share_group_path(group), config.encode())


def state(zk, group="q", topic="t", partition=0) -> SharePartitionState:
    path = share_partitions_path(group, topic, partition)
    return SharePartitionState.decode(zk.get(path)[0], path)


def drain(consumer, n, timeout=10.0):
    """Poll until ``n`` records came."""
    got = []
    wait_for(lambda: got.extend(consumer.poll(100)) or len(got) >= n, timeout, message=f"{n} records")
    return got
