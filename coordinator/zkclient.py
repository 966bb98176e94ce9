"""Creating kazoo clients the way zkgroups wants them.

kazoo's default ``KazooRetry`` retries forever; here ``client.retry`` (used by kazoo's
recipes) gives up after five tries, reconnecting backs off to at most 1 s between attempts
for as long as the client is open, and connecting waits at most ``connect_timeout``
(ENGINEERING.md §2.8). Our own retries are explicit: :func:`riding_out_failover`.
A connect string may carry a chroot (``127.0.0.1:2181/app``); it is created if missing.
"""
from __future__ import annotations

import logging
import selectors
import types
from typing import Optional

import tenacity
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.retry import KazooRetry

from coordinator.errors import ZooKeeperUnavailable

log = logging.getLogger(__name__)

DEFAULT_CONNECT = "127.0.0.1:2181"


_POLL = types.SimpleNamespace(DefaultSelector=selectors.PollSelector, EVENT_READ=selectors.EVENT_READ,
                              EVENT_WRITE=selectors.EVENT_WRITE)


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with a cheaper ``select``: kazoo builds a selector for every
    wait of its connection loop, and an epoll one costs three system calls (create, register,
    close) each time; a poll() selector costs none beyond the wait itself."""

    def select(self, *args, **kwargs):
        return selector_select(*args, selectors_module=_POLL, **kwargs)


def riding_out_failover(deadline_s: float = 15.0):
    """Decorate an idempotent ZooKeeper call to retry a lost connection (a server failing
    over: electing a new ZooKeeper leader takes seconds) with backoff, for ``deadline_s``."""
    return tenacity.retry(
        retry=tenacity.retry_if_exception_type((ConnectionLoss, OperationTimeoutError)),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
        stop=tenacity.stop_after_delay(deadline_s),
        before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
        reraise=True)


def make_client(connect: str = DEFAULT_CONNECT, session_timeout_ms: int = 6000,
                read_only: bool = False) -> KazooClient:
    """A started-later client with bounded retries (call :func:`start_client`)."""
    return KazooClient(
        hosts=connect,
        timeout=session_timeout_ms / 1000.0,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        command_retry=KazooRetry(max_tries=5, delay=0.05, backoff=2, max_delay=1.0, deadline=30),
        read_only=read_only,
        handler=PollHandler(),
    )


def start_client(connect: str = DEFAULT_CONNECT, session_timeout_ms: int = 6000,
                 connect_timeout: float = 10.0) -> KazooClient:
    """Connect, or raise :class:`ZooKeeperUnavailable` after ``connect_timeout`` seconds."""
    if "/" in connect:
        # kazoo does not create a chroot itself; create it through an unrooted client first.
        hosts, chroot = connect.split("/", 1)
        _ensure_path(hosts, "/" + chroot, connect_timeout)
    return _start(make_client(connect, session_timeout_ms), connect, connect_timeout)


def _start(client: KazooClient, connect: str, connect_timeout: float) -> KazooClient:
    try:
        client.start(timeout=connect_timeout)
    except KazooTimeoutError:
        close_client(client)
        raise ZooKeeperUnavailable(
            f"ZooKeeper at {connect} did not answer within {connect_timeout:g}s") from None
    return client


def _ensure_path(hosts: str, path: str, connect_timeout: float) -> None:
    root = _start(make_client(hosts), hosts, connect_timeout)
    try:
        root.ensure_path(path.rstrip("/") or "/")
    finally:
        close_client(root)


def close_client(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


class TransactionFailed(Exception):
    """A multi-op did not apply; ``error`` is the operation that caused it, ``index`` its place."""

    def __init__(self, index: int, error: Exception):
        super().__init__(f"transaction operation {index} failed: {type(error).__name__}")
        self.index, self.error = index, error


#: What a call raises when ZooKeeper did not answer: a lost connection or session, a closed
#: client, or no answer within the caller's timeout.
UNREACHABLE = (KazooException, KazooTimeoutError)


def session_id(client: KazooClient) -> Optional[int]:
    """The client's session id while it is connected; None while it is not (kazoo's
    ``client_id`` is None then, so never index it blindly)."""
    ids = client.client_id
    return ids[0] if ids else None


def commit(transaction, timeout: Optional[float] = None) -> list:
    """Commit a kazoo transaction and raise :class:`TransactionFailed` if it was rolled back.

    kazoo returns failures as exception objects in the result list instead of raising; the
    operation that failed carries a real error, the others ``RolledBackError``. With
    ``timeout``, waiting for the answer is bounded (``KazooTimeoutError``; the transaction may
    still apply later).
    """
    from kazoo.exceptions import RolledBackError, RuntimeInconsistency

    results = transaction.commit_async().get(timeout=timeout)
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            raise TransactionFailed(i, result)
    return results
