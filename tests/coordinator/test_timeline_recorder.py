"""The timeline recorder (:class:`coordinator.timeline.TimelineRecorder`) on a real ZooKeeper:
a node that wrote a group's ring appends the next entry in one write, reading nothing; when
another node wrote the ring meanwhile, its entries are kept and the new one follows them.
(What an entry says is tested without a server in ``tests/unit/test_timeline.py``.)"""
from __future__ import annotations

from coordinator import protocol
from coordinator.fencing import Fence
from coordinator.protocol import GroupState
from coordinator.rebalance import Outcome
from coordinator.timeline import TimelineRecorder


def _fence(zk) -> Fence:
    path = protocol.shard_epoch_path(0)
    zk.ensure_path(path)
    return Fence(path, zk.exists(path).version)


def _stable(zk, group: str, generation: int) -> Outcome:
    state = GroupState(generation=generation, state=protocol.STABLE, members=["c-1"])
    zk.ensure_path(protocol.state_path(group))
    zk.set(protocol.state_path(group), state.encode())
    return Outcome(group, True, protocol.STABLE, generation, ["a member joined"], members=1, final_state=state)


def _ring(zk, group: str):
    return protocol.decode_timeline(zk.get(protocol.timeline_path(group))[0], "timeline")


def _counting_reads(zk, monkeypatch) -> list:
    reads = []
    get_async = zk.get_async
    monkeypatch.setattr(zk, "get_async", lambda path, *a, **kw: (reads.append(path), get_async(path, *a, **kw))[1])
    return reads


def test_the_next_entry_of_a_ring_the_node_wrote_costs_one_write_and_no_read(zk, monkeypatch):
    fence, recorder = _fence(zk), TimelineRecorder(zk, "n1")
    recorder.record("g", fence, _stable(zk, "g", 1))
    reads = _counting_reads(zk, monkeypatch)
    recorder.record("g", fence, _stable(zk, "g", 2))
    assert reads == []
    assert [e.generation for e in _ring(zk, "g")] == [1, 2]


def test_a_ring_another_node_wrote_meanwhile_is_read_and_its_entries_kept(zk, monkeypatch, caplog):
    fence = _fence(zk)
    ours, theirs = TimelineRecorder(zk, "n1"), TimelineRecorder(zk, "n2")
    ours.record("g", fence, _stable(zk, "g", 1))
    theirs.record("g", fence, _stable(zk, "g", 2))  # the shard moved away and back: n1's ring is stale
    reads = _counting_reads(zk, monkeypatch)
    ours.record("g", fence, _stable(zk, "g", 3))
    assert reads == [protocol.timeline_path("g")]  # the state came with the outcome
    assert [(e.generation, e.node) for e in _ring(zk, "g")] == [(1, "n1"), (2, "n2"), (3, "n1")]
    assert "not updated" not in caplog.text
