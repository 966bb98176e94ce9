"""The console's share groups (:mod:`coordinator.console.share_snapshot`): a new share group read
whole (settings, members, share-partitions' states, a damaged znode in its problems), a deleted
one dropped, and a busy one read again at most once per interval. The reads on a real
ZooKeeper, the snapshot around them a fake (its lock, watchers and version), the clock moved by
hand."""
from __future__ import annotations

import threading

from kazoo.exceptions import NoNodeError

from coordinator.console import share_snapshot
from coordinator.console.share_snapshot import ShareGroupsReader
from coordinator.protocol.share import SHARE_GROUPS, ShareGroupConfig, ShareMember
from coordinator.share_partition import initial
from tests.support.fakes import Clock


class Snapshot:
    """What the reader uses of a ClusterSnapshot: its client, lock, watchers and version."""

    def __init__(self, client):
        self.client, self._lock, self.version = client, threading.Lock(), 0

    def _watch(self, *key):
        return lambda event: None  # the events are the snapshot's business

    def _children(self, pending, path, watcher):
        try:
            return sorted(pending.get())
        except NoNodeError:
            return None

    def _changed(self):
        self.version += 1


def make_group(zk, group="q"):
    base = f"{SHARE_GROUPS}/{group}"
    zk.create(base, ShareGroupConfig(delivery_count_limit=4).encode(), makepath=True)
    zk.create(f"{base}/members/m1", ShareMember(["t"], host="h1").encode(), makepath=True)
    zk.create(f"{base}/members/m2", b"not json")
    zk.create(f"{base}/partitions/t/0", initial(5).encode(), makepath=True)


def test_a_new_share_group_is_read_whole_and_a_deleted_one_dropped(zk):
    make_group(zk)
    snapshot = Snapshot(zk)
    reader = ShareGroupsReader(snapshot)
    assert reader.read_names() == ["q"]
    view = reader.views["q"]
    assert view.config.delivery_count_limit == 4 and list(view.members) == ["m1"]
    assert list(view.partitions) == [("t", 0)] and view.partitions[("t", 0)].start == 5
    assert list(view.problems) == [f"{SHARE_GROUPS}/q/members/m2"]
    assert snapshot.version == 1
    zk.delete(f"{SHARE_GROUPS}/q", recursive=True)
    assert reader.read_names() == [] and reader.views == {} and snapshot.version == 2


def test_a_busy_group_is_read_again_at_most_once_per_interval(zk, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(share_snapshot, "time", clock)
    make_group(zk)
    snapshot = Snapshot(zk)
    reader = ShareGroupsReader(snapshot, interval_s=1.0)
    reader.read_names()
    clock.now += 0.4
    reader.read_when_due(["q", "q"])  # its watches fired again at once: deferred to the interval's end
    assert snapshot.version == 1 and reader.due_keys() == [] and abs(reader.wait_s() - 0.6) < 1e-6
    clock.now += 0.6
    assert reader.due_keys() == [("share", "q")] and reader.due_keys() == []  # due once
    reader.read_when_due(["q"])
    assert snapshot.version == 2
