"""How a member joins (:mod:`consumer.joining`): the group's directories made where missing in one
round trip, the offsets directories listed for a first claim, and a join that waits out a lost
connection. Against a fake client: fast, no server."""
from __future__ import annotations

import logging

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError, NoNodeError, NodeExistsError

from coordinator import protocol
from coordinator.errors import AuthFailed, ZooKeeperUnavailable
from consumer import joining
from consumer.joining import GroupDirectories, join_waiting_out_lost_connections


class Answer:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def wait(self, timeout=None):
        return True

    def get(self):
        if self.error is not None:
            raise self.error
        return self.value


class FakeClient:
    """Directories as a dict {path: children}; counts the round trips (requests sent together)
    and the paths made."""

    def __init__(self, existing=None):
        self.tree = dict(existing or {})
        self.looked, self.listed, self.made = [], [], []
        self.connected = True

    def exists_async(self, path):
        self.looked.append(path)
        return Answer(object() if path in self.tree else None)

    def get_children_async(self, path):
        self.listed.append(path)
        return Answer(self.tree[path]) if path in self.tree else Answer(error=NoNodeError())

    def ensure_path(self, path):
        self.made.append(path)
        self.tree[path] = []


def group_dirs(g="g"):
    return [protocol.ids_path(g), protocol.channel_path(g), protocol.owners_path(g), protocol.offsets_path(g)]


def test_a_join_makes_only_the_missing_directories_and_lists_the_topics_offsets():
    existing = {path: [] for path in group_dirs()}
    existing[protocol.offsets_path("g", "t")] = ["0", "2", "lock"]  # not a partition: left out
    client, listed = FakeClient(existing), {}
    GroupDirectories(client, "g", listed).make_for_join(["t", "u"])
    assert client.made == [protocol.owners_path("g", "t"), protocol.owners_path("g", "u"),
                           protocol.offsets_path("g", "u")]
    assert client.listed == [protocol.offsets_path("g", "t"), protocol.offsets_path("g", "u")]
    assert listed == {"t": {0, 2}}  # u's directory was missing: nothing listed, now made empty


def test_a_topics_directories_are_made_once_per_member():
    client = FakeClient()
    dirs = GroupDirectories(client, "g", {})
    dirs.make_for_join(["t"])
    looked = len(client.looked) + len(client.listed)
    dirs.make_for_claim("t")
    dirs.make_for_claim("v")
    dirs.make_for_claim("v")
    assert client.listed[-1] == protocol.offsets_path("g", "v")
    assert len(client.looked) + len(client.listed) == looked + 2  # v's two directories, once


def test_a_first_claim_lists_the_offsets_directory_for_the_partitions_with_offsets():
    client = FakeClient({protocol.owners_path("g", "t"): [], protocol.offsets_path("g", "t"): ["1"]})
    listed = {}
    GroupDirectories(client, "g", listed).make_for_claim("t")
    assert (client.made, listed) == ([], {"t": {1}})


def test_a_join_is_done_at_the_first_attempt_that_succeeds(monkeypatch):
    monkeypatch.setattr(joining, "RETRY_S", 0.0)
    client, attempts = FakeClient(), []

    def join_once():
        attempts.append(client.connected)
        if len(attempts) < 3:
            raise ConnectionLoss()
    join_waiting_out_lost_connections(client, "g", "m", join_once, report_every=60)
    assert attempts == [True, True, True]


class Reconnecting(FakeClient):
    """Not connected for the first ``n`` looks at ``connected``."""

    def __init__(self, n):
        super().__init__()
        self.looks, self.n = 0, n

    @property
    def connected(self):
        self.looks += 1
        return self.looks > self.n

    @connected.setter
    def connected(self, _value):
        pass


def test_a_join_waits_while_not_connected_and_says_so_once_per_interval(monkeypatch, caplog):
    monkeypatch.setattr(joining, "RETRY_S", 0.0)
    client, joined = Reconnecting(5), []
    with caplog.at_level(logging.WARNING, logger="zkgroups.member"):
        join_waiting_out_lost_connections(client, "g", "m", lambda: joined.append(client.looks), report_every=60)
    assert joined == [6]
    waits = [r.getMessage() for r in caplog.records if "cannot join group g yet" in r.getMessage()]
    assert len(waits) == 1 and "not connected" in waits[0]


@pytest.mark.parametrize("error, raised, message", [
    (NoAuthError(), AuthFailed, "refused this identity"),
    (NodeExistsError(), ZooKeeperUnavailable, "cannot join group g: NodeExistsError"),
])
def test_anything_else_zookeeper_answers_ends_the_join(error, raised, message):
    def join_once():
        raise error
    with pytest.raises(raised, match=message):
        join_waiting_out_lost_connections(FakeClient(), "g", "m", join_once, report_every=60)
