"""The coordinator's request queue (:mod:`coordinator.requests`): each group queued once, changes during a run
noticed."""
from coordinator.requests import RebalanceRequests


def test_a_group_is_queued_once():
    q = RebalanceRequests()
    q.request("g")
    q.request("g")
    q.request("h")
    assert [q.take(0.1), q.take(0.1), q.take(0.01)] == ["g", "h", None]


def test_a_change_during_a_run_marks_it_changed_and_queues_it_again():
    q = RebalanceRequests()
    q.request("g")
    q.begin(q.take(0.1))
    assert not q.changed("g")
    q.request("g")
    assert q.changed("g") and q.take(0.01) is None  # not queued while it runs
    q.done("g")
    assert q.take(0.1) == "g"
    q.begin("g")
    assert not q.changed("g")


def test_a_routine_check_does_not_supersede_a_run():
    q = RebalanceRequests()
    q.request("g")
    q.begin(q.take(0.1))
    q.request("g", changed=False)
    assert not q.changed("g")
    q.done("g")
    assert q.take(0.01) is None


def test_closed_queue_takes_no_more_requests():
    q = RebalanceRequests()
    q.close(handlers=1)
    q.request("g")
    assert q.take(0.1) is None  # the handler's stop sentinel
    assert q.take(0.01) is None
