"""What the console reads of the cluster (:mod:`coordinator.console.snapshot`): the election's
order. Fast; no ZooKeeper."""
from coordinator.console.snapshot import contender_order


def test_contenders_in_the_election_order():
    children = ["b0__lock__0000000012", "a1__lock__0000000003", "zz", "c2__lock__0000000007"]
    assert contender_order(children) == ["a1__lock__0000000003", "c2__lock__0000000007", "b0__lock__0000000012"]
