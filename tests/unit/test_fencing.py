"""Terms of leadership (coordinator.fencing): one end with one reason, active only while not
ended and not suspended, each with the fence of its epoch. No ZooKeeper."""
import threading

from coordinator import protocol
from coordinator.fencing import Fence, Leadership, ShardTerm, TermState


def test_a_term_ends_once_and_keeps_the_first_reason():
    term = ShardTerm(3, 7)
    assert term.state is TermState.ACTIVE and term.active and not term.ended
    ends = [threading.Thread(target=term.end, args=(f"reason {i}",)) for i in range(8)]
    for t in ends:
        t.start()
    for t in ends:
        t.join(5)
    assert term.ended and not term.active and term.reason.startswith("reason ")
    term.end("later")
    assert term.reason != "later"


def test_a_term_is_not_active_while_its_node_is_suspended():
    suspended = [True]
    term = Leadership(5, suspended=lambda: suspended[0])
    assert not term.active and not term.ended
    suspended[0] = False
    assert term.active


def test_each_term_carries_the_fence_of_its_epoch():
    assert ShardTerm(3, 7).fence == Fence(protocol.shard_epoch_path(3), 7)
    assert Leadership(5).fence == Fence(protocol.EPOCH, 5) and Leadership(5).epoch == 5
