"""The ZooKeeper client's select: one C call on low descriptors, a poll() selector past
select()'s limit; the same answers either way."""
from __future__ import annotations

import os
import resource
import socket

import pytest

from coordinator.zkclient import PollHandler


def test_select_reports_what_is_readable():
    a, b = socket.socketpair()
    with a, b:
        handler = PollHandler()
        assert handler.select([a], [], [], 0) == ([], [], [])
        b.send(b"x")
        assert handler.select([a, b], [b], [], 0) == ([a], [b], [])


def test_a_descriptor_past_fd_setsize_falls_back_to_poll():
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= 1500:
        pytest.skip("this process may not open descriptor 1500")
    a, b = socket.socketpair()
    high = socket.socket(fileno=os.dup2(a.fileno(), 1500))
    with a, b, high:
        handler = PollHandler()
        assert handler.select([high], [], [], 0) == ([], [], [])
        b.send(b"x")
        assert handler.select([high], [], [], 0) == ([high], [], [])
