"""Creating kazoo clients the way zkgroups wants them.

kazoo's default ``KazooRetry`` retries forever; here ``client.retry`` (used by kazoo's
recipes) gives up after five tries, reconnecting backs off to at most 1 s between attempts
for as long as the client is open, and connecting waits at most ``connect_timeout``
(ENGINEERING.md §2.8). Our own retries are explicit: :func:`riding_out_failover`.

Connect strings are checked up front by :func:`parse_connect` (every client made here, and
the CLIs' ``--zk``): ``host:port[,host:port...][/chroot]``, ports 1-65535, a chroot that is a
valid ZooKeeper path (no empty, ``.`` or ``..`` component, no trailing ``/``). A bad one is an
:class:`InvalidConfig` with one line; kazoo would raise a bare ValueError or quietly use a
chroot ZooKeeper cannot create. The chroot is created if missing (a connection lost meanwhile
is tried again within the connect timeout).

With a credential (``auth``), the client authenticates with it, reads the installation's ACL
policy and creates every znode with the ACL :func:`coordinator.acl.acl_for` gives its path
(:class:`PolicyClient`); a credential the policy does not know is an :class:`AuthFailed`.

With a TLS setting (``tls``, a :class:`coordinator.zktls.ZkTls`), every connection is TLS with
the server's certificate verified; a connection that cannot be made for a TLS reason on every
server of the connect string (a certificate refused by either side, a plaintext port) is a
:class:`~coordinator.zktls.TlsFailed` at once, not a timeout.
"""
from __future__ import annotations

import logging
import re
import select
import selectors
import socket
import threading
import time
import types
from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional, Tuple

import tenacity
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (AuthFailedError, ConnectionLoss, KazooException, NodeExistsError, NoNodeError, OperationTimeoutError,
                              SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import selector_select
from kazoo.protocol.states import KeeperState
from kazoo.retry import KazooRetry

from coordinator.config import DEFAULT_CONNECT, DEFAULT_SESSION_TIMEOUT_MS
from coordinator import acl, protocol, zktls
from coordinator.errors import AuthFailed, InvalidConfig, ZkGroupsError, ZooKeeperUnavailable

log = logging.getLogger("zkgroups.zookeeper")



# ---------------------------------------------------------------- connect strings

_HOSTNAME = re.compile(r"^[A-Za-z0-9._-]+$")
_IPV6 = re.compile(r"^\[[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?\]$")
# Characters ZooKeeper refuses in a path (PathUtils.validatePath), besides NUL.
_BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


@dataclass(frozen=True)
class ConnectString:
    """A checked connect string: ``hosts`` as ``host:port,...`` and ``chroot`` ("" for none)."""
    hosts: str
    chroot: str = ""

    def __str__(self) -> str:
        return self.hosts + self.chroot


def parse_connect(connect) -> ConnectString:
    """Check ``host:port[,host:port...][/chroot]``; raise :class:`InvalidConfig` (one line).

    A chroot of ``/`` alone means none, as for ZooKeeper's own client."""
    def bad(problem: str) -> InvalidConfig:
        shown = connect if len(connect) <= 100 else connect[:100] + "..."
        return InvalidConfig(f"bad ZooKeeper connect string {shown!r}: {problem}")

    if not isinstance(connect, str):
        raise InvalidConfig(f"a ZooKeeper connect string must be text, got {type(connect).__name__}")
    if not connect.strip():
        raise bad("it is empty (expected host:port[,host:port...][/chroot])")
    hosts_part, slash, chroot = connect.partition("/")
    hosts = []
    for entry in hosts_part.split(","):
        entry = entry.strip()
        if not entry:
            raise bad("an empty host entry (expected host:port[,host:port...])")
        host, colon, port = entry.rpartition(":")
        if not colon:
            raise bad(f"{entry!r} has no port (expected host:port)")
        if not host:
            raise bad(f"{entry!r} has no host")
        if not (_HOSTNAME.match(host) or _IPV6.match(host)):
            raise bad(f"{host!r} is not a host name or address")
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise bad(f"port {port!r} is not a number from 1 to 65535")
        hosts.append(f"{host}:{int(port)}")
    chroot = slash + chroot
    if chroot == "/":
        chroot = ""
    if chroot:
        problem = _chroot_problem(chroot)
        if problem:
            raise bad(f"chroot {chroot!r} {problem}")
    return ConnectString(",".join(hosts), chroot)


def _chroot_problem(path: str) -> Optional[str]:
    if path.endswith("/"):
        return "ends with '/'"
    parts = path[1:].split("/")
    if any(part == "" for part in parts):
        return "has an empty component ('//')"
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' component"
    if _BAD_PATH_CHARS.search(path):
        return "has a character ZooKeeper does not allow in a path"
    if parts[0] == "zookeeper":
        return "is inside /zookeeper, which ZooKeeper reserves"
    return None


_POLL = types.SimpleNamespace(DefaultSelector=selectors.PollSelector, EVENT_READ=selectors.EVENT_READ,
                              EVENT_WRITE=selectors.EVENT_WRITE)


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with a cheaper ``select``. kazoo builds a selector for every
    wait of its connection loop (an epoll one: three system calls and a few Python objects),
    and its connection thread waits once for every message, so that cost is paid per request
    and per answer. ``select.select`` on the two descriptors it watches is one C call: a
    pipelined read costs the client ~45% less CPU (measured: 22,000 gets, 2.7 – 3.2 s → 1.5 –
    1.6 s). A descriptor beyond select()'s limit (FD_SETSIZE, 1,024: a process with many open
    files) falls back to a poll() selector, which has no such limit."""

    def __init__(self, failures: Optional["zktls.TlsFailures"] = None):
        super().__init__()
        self.failures = failures or zktls.TlsFailures(None)
        self.address = ""  # the server the connection thread is connecting to (its own writes only)

    def create_connection(self, address, *args, **kwargs):
        hostname = kwargs.get("hostname") or address[0]
        self.address = f"{hostname}:{address[1]}"
        tls = self.failures.tls
        try:
            if tls is None or not kwargs.get("use_ssl"):
                return super().create_connection(address, *args, **kwargs)
            sock = tls.connect(address, hostname, kwargs.get("timeout"))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as kazoo's own sockets
            return sock
        except OSError as e:  # ssl.SSLError included: note why, kazoo retries
            self.failures.note(e, self.address)
            raise

    def select(self, rlist, wlist, xlist, timeout=None):
        try:
            return select.select(rlist, wlist, xlist, timeout)
        except ValueError:  # a descriptor past FD_SETSIZE (or a closed one: the fallback says which)
            return selector_select(rlist, wlist, xlist, timeout, selectors_module=_POLL)


def riding_out_failover(deadline_s: float = 15.0):
    """Decorate an idempotent ZooKeeper call to retry a lost connection (a server failing
    over: electing a new ZooKeeper leader takes seconds) with backoff, for ``deadline_s``."""
    return tenacity.retry(
        retry=tenacity.retry_if_exception_type((ConnectionLoss, OperationTimeoutError)),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
        stop=tenacity.stop_after_delay(deadline_s),
        before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
        reraise=True)


class _RedactAuth(logging.Filter):
    """kazoo logs every request it sends at debug level, the credential's ``Auth`` packet
    included: show it without its secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        from kazoo.protocol.serialization import Auth
        if isinstance(record.args, tuple) and any(isinstance(a, Auth) for a in record.args):
            record.args = tuple(Auth(a.auth_type, a.scheme, "<redacted>") if isinstance(a, Auth) else a
                                for a in record.args)
        return True


logging.getLogger("kazoo.client").addFilter(_RedactAuth())  # the logger kazoo's connection writes to


class _ClientLog(logging.Logger):
    """kazoo's logger for one client: everything goes on to ``kazoo.client`` as before, and a
    connection cut after its handshake (a TLS 1.3 server refuses a client's certificate only
    then) is noted for the thread waiting to connect."""

    def __init__(self, handler: PollHandler):
        super().__init__("kazoo.client")
        self.parent, self.handler = logging.getLogger("kazoo.client"), handler
        self.addFilter(_RedactAuth())

    def isEnabledFor(self, level: int) -> bool:  # the parent's level, never a stale cache of it
        return self.parent.isEnabledFor(level)

    def warning(self, msg, *args, **kwargs):
        from kazoo.exceptions import ConnectionDropped
        for arg in args:
            if isinstance(arg, ConnectionDropped):
                self.handler.failures.note(arg, self.handler.address)
        super().warning(msg, *args, **kwargs)


class _PolicyTransaction(TransactionRequest):
    def create(self, path, value=b"", acl=None, ephemeral=False, sequence=False):
        if acl is None and self.client.acl_policy is not None:
            acl = _acl_of(self.client.acl_policy, path)
        return super().create(path, value, acl, ephemeral, sequence)


def _acl_of(policy: "protocol.AclPolicy", path: str):
    return acl.acl_for(policy, path.rstrip("/") if path != "/" else path)


class PolicyClient(KazooClient):
    """A KazooClient whose creates without an explicit ACL (``create``, ``ensure_path`` and its
    intermediate nodes, ``makepath``, transactions, kazoo's recipes) get the ACL the
    installation's policy gives their path. ``acl_policy`` None: open ACLs, as kazoo does.
    The policy is replaced as a whole (one reference) when its znode changes."""

    acl_policy: Optional["protocol.AclPolicy"] = None
    sasl_user: Optional[str] = None  # the SASL user it authenticates as (shown when refused)

    def create_async(self, path, value=b"", acl=None, ephemeral=False, sequence=False, makepath=False,
                     include_data=False):
        if acl is None and self.acl_policy is not None and isinstance(path, str):
            acl = _acl_of(self.acl_policy, path)
            if makepath:  # kazoo would give missing parents this node's ACL: make them first, each its own
                parent = path.rsplit("/", 1)[0]
                if parent:
                    self.ensure_path(parent)
        return super().create_async(path, value, acl, ephemeral, sequence, makepath, include_data)

    def transaction(self):
        return _PolicyTransaction(self)


def make_client(connect: str = DEFAULT_CONNECT, session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
                read_only: bool = False, auth: Optional["acl.Credential"] = None,
                tls: Optional["zktls.ZkTls"] = None, sasl: Optional["acl.Credential"] = None) -> KazooClient:
    """A started-later client with bounded retries (call :func:`start_client`)."""
    handler = PollHandler(zktls.TlsFailures(tls))
    if tls is not None and not tls.verify_hostname:
        log.warning("TLS to ZooKeeper at %s: the server's host name is NOT checked (verify_hostname off): any "
                    "server with a certificate from the CA can pose as this ZooKeeper", connect)
    client = PolicyClient(
        **(tls.kazoo_options() if tls is not None else {}),
        sasl_options=sasl.sasl_options() if sasl is not None else None,
        logger=_ClientLog(handler),
        auth_data=auth.auth_data() if auth else None,
        hosts=str(parse_connect(connect)),
        timeout=session_timeout_ms / 1000.0,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
        command_retry=KazooRetry(max_tries=5, delay=0.05, backoff=2, max_delay=1.0, deadline=30),
        read_only=read_only,
        handler=handler,
    )
    client.sasl_user = sasl.user if sasl is not None else None
    return client


def start_client(connect: str = DEFAULT_CONNECT, session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
                 connect_timeout: float = 10.0, auth: "acl.Credential | str | None" = None, require_policy: bool = True,
                 roles: Optional[tuple] = None, tls: "zktls.ZkTls | dict | None" = None,
                 sasl: "acl.Credential | str | None" = None) -> KazooClient:
    """Connect, or raise :class:`ZooKeeperUnavailable` after ``connect_timeout`` seconds (also
    when a connection lost while creating the chroot is not back by then; :class:`InvalidConfig`
    for a bad connect string, :class:`ZkGroupsError` for a chroot ZooKeeper refuses).

    ``auth`` (a :class:`coordinator.acl.Credential` or its text, ``user:password`` or ``@file``):
    authenticate, read the ACL policy and create znodes by it; :class:`AuthFailed` when the
    policy does not know the credential, or gives it none of ``roles`` (None: any), or
    (``require_policy``) when there is no policy.

    ``tls`` (a :class:`coordinator.zktls.ZkTls` or its mapping): connect over TLS;
    :class:`~coordinator.zktls.TlsFailed` when no server takes the connection for a TLS reason.

    ``sasl`` (``user:password`` or ``@file``): authenticate as that SASL user (DIGEST-MD5);
    :class:`AuthFailed` at once when the server refuses it."""
    parsed = parse_connect(connect)
    auth, sasl = acl.parse_auth(auth), acl.parse_auth(sasl, "--zk-sasl")
    tls = zktls.parse_tls(tls)
    client = _start(make_client(str(parsed), session_timeout_ms, auth=auth, tls=tls, sasl=sasl), str(parsed),
                    connect_timeout)
    identity = _identity(auth, tls, sasl)
    try:
        if parsed.chroot:
            _chroot_exists(client, parsed, session_timeout_ms, connect_timeout, tls)
        if identity is not None:  # a certificate alone on an installation without a policy: open ACLs
            _follow_policy(client, identity, parsed, connect_timeout, require_policy and auth is not None, roles)
    except BaseException:
        close_client(client)
        raise
    return client


def _chroot_exists(client: KazooClient, parsed: ConnectString, session_timeout_ms: int, timeout: float,
                   tls: Optional["zktls.ZkTls"]) -> None:
    """Create a missing chroot. kazoo does not, and a client inside it cannot: an unrooted
    client does, only when needed (a second connection, a second TLS handshake, is not free)."""
    try:
        if client.exists_async("/").get(timeout=timeout) is not None:
            return
    except KazooTimeoutError:
        raise ZooKeeperUnavailable(f"ZooKeeper at {parsed} did not answer within {timeout:g}s") from None
    except LOST_CONNECTION:
        pass  # the unrooted client below tries again within the timeout
    root = _start(make_client(parsed.hosts, session_timeout_ms, tls=tls), parsed.hosts, timeout)
    try:
        ensure_chroot(root, parsed, timeout)
    finally:
        close_client(root)


class _Identity(NamedTuple):
    """Who a client is to the policy: its id there, how errors name it, a digest's user name."""
    id: str
    shown: str
    user: Optional[str] = None


def _identity(auth: Optional["acl.Credential"], tls: Optional["zktls.ZkTls"],
              sasl: Optional["acl.Credential"] = None) -> Optional[_Identity]:
    """A digest credential, else a SASL user, else the client certificate's x509 identity, else None."""
    if auth is not None:
        return _Identity(auth.digest_id, f"identity {auth.user!r}", auth.user)
    if sasl is not None:  # the server checked its password: nothing for a policy to tell apart
        return _Identity(acl.SASL_PREFIX + sasl.user, f"SASL identity {sasl.user!r}")
    ident = tls.identity if tls is not None else None
    return _Identity(ident, f"x509 identity {ident[len(acl.X509_PREFIX):]!r}") if ident else None


def _follow_policy(client: PolicyClient, auth: _Identity, parsed: ConnectString, timeout: float,
                   require_policy: bool, roles: Optional[tuple]) -> None:
    """Check the credential against the installation's policy and keep the client's copy of
    the policy current (a data watch: the kazoo thread only decodes and swaps a reference)."""
    from kazoo.exceptions import NoAuthError, NoNodeError
    from kazoo.recipe.watchers import DataWatch
    try:
        raw, _ = client.get_async(protocol.ACL_POLICY).get(timeout=timeout)
    except NoNodeError:
        if require_policy:
            raise AuthFailed(f"ZooKeeper at {parsed} has no ACL policy ({protocol.ACL_POLICY}) for {auth.shown}: "
                             "an admin creates it with 'groupctl acl apply'") from None
        return
    except NoAuthError:
        if auth.user is None:  # a certificate has no password to get wrong
            raise AuthFailed(f"ZooKeeper {auth.shown} is not in this installation's ACL policy (it may not read "
                             f"{protocol.ACL_POLICY} at ZooKeeper {parsed})") from None
        raise AuthFailed(f"{auth.shown} may not read the ACL policy at ZooKeeper {parsed}: wrong "
                         "password, or an identity this installation does not know") from None
    except KazooTimeoutError:
        raise ZooKeeperUnavailable(f"ZooKeeper at {parsed} did not answer within {timeout:g}s") from None
    except LOST_CONNECTION as e:
        raise ZooKeeperUnavailable(f"cannot read the ACL policy at ZooKeeper {parsed}: {type(e).__name__}") from None
    policy = protocol.AclPolicy.decode(raw, protocol.ACL_POLICY)
    if policy.role_of(auth.id) is None:
        if auth.user is not None and policy.user_known(auth.user):
            raise AuthFailed(f"wrong password for ZooKeeper identity {auth.user!r}")
        raise AuthFailed(f"ZooKeeper {auth.shown} is not in this installation's ACL policy "
                         "(an admin adds it with 'groupctl acl apply')")
    role = policy.role_of(auth.id)
    if roles and role not in roles:
        owner = "a group" if role == "group" else f"the {role}s"
        raise AuthFailed(f"ZooKeeper {auth.shown} belongs to {owner} here, not to the "
                         f"{' or '.join(r + 's' for r in roles)}")
    client.acl_policy = policy

    def changed(data, _stat):
        if data:
            try:
                client.acl_policy = protocol.AclPolicy.decode(data, protocol.ACL_POLICY)
            except ZkGroupsError as e:
                log.error("ignoring an unreadable ACL policy: %s", e)
    DataWatch(client, protocol.ACL_POLICY, changed)


def ensure_chroot(root: KazooClient, parsed: ConnectString, timeout: float) -> None:
    """Create ``parsed.chroot`` through ``root``, a client without a chroot. A connection lost
    meanwhile is tried again (the client reconnects by itself) for ``timeout`` seconds in all,
    then :class:`ZooKeeperUnavailable`; a chroot ZooKeeper refuses is a :class:`ZkGroupsError`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            root.ensure_path_async(parsed.chroot).get(timeout=max(deadline - time.monotonic(), 0.001))
            return
        except LOST_CONNECTION + (KazooTimeoutError,) as e:
            if time.monotonic() >= deadline:
                cause = f"no answer within {timeout:g}s" if isinstance(e, KazooTimeoutError) else type(e).__name__
                raise ZooKeeperUnavailable(f"cannot create the chroot {parsed.chroot} on ZooKeeper at {parsed.hosts}: "
                                           f"{cause}") from None
            time.sleep(0.1)  # a lost connection fails at once: wait for the reconnect, bounded
        except KazooException as e:
            raise ZkGroupsError(f"cannot create the chroot {parsed.chroot} on ZooKeeper at {parsed.hosts}: "
                                f"{type(e).__name__}") from None


def wait_for_zookeeper(connect: str, timeout: Optional[float], stop: threading.Event,
                       still_waiting: Callable[[float], None], report_every: float = 10.0,
                       tls: "zktls.ZkTls | dict | None" = None) -> bool:
    """Wait until ZooKeeper at ``connect`` answers and its chroot exists.

    ``timeout`` None waits for as long as it takes, calling ``still_waiting(seconds so far)``
    every ``report_every`` seconds; otherwise raises :class:`ZooKeeperUnavailable` after
    ``timeout`` seconds. Returns False if ``stop`` was set meanwhile. One client keeps trying
    (kazoo's reconnect backs off to 1 s), so ZooKeeper is used as soon as it is up; a TLS
    failure on every server is a :class:`~coordinator.zktls.TlsFailed` at once (a setting to fix).
    """
    parsed = parse_connect(connect)
    client = make_client(parsed.hosts, tls=zktls.parse_tls(tls))
    started = time.monotonic()
    next_report = started + report_every
    try:
        connected = client.start_async()
        while not connected.wait(0.1):
            if stop.is_set():
                return False
            _raise_tls_failure(client)
            now = time.monotonic()
            if timeout is not None and now - started >= timeout:
                raise ZooKeeperUnavailable(f"ZooKeeper at {parsed} did not answer within {timeout:g}s")
            if timeout is None and now >= next_report:
                still_waiting(now - started)
                next_report = now + report_every
        while parsed.chroot:
            left = report_every if timeout is None else max(started + timeout - time.monotonic(), 0.001)
            try:
                ensure_chroot(client, parsed, left)
                break
            except ZooKeeperUnavailable:
                if timeout is not None:
                    raise
                if stop.is_set():
                    return False
                still_waiting(time.monotonic() - started)
        return True
    finally:
        close_client(client)


def _start(client: KazooClient, connect: str, connect_timeout: float) -> KazooClient:
    """Connect within ``connect_timeout``; a TLS failure on every server ends the wait at once."""
    connected, deadline = client.start_async(), time.monotonic() + connect_timeout
    try:
        while not client.connected:
            connected.wait(0.05)
            _raise_tls_failure(client)
            if client.client_state == KeeperState.AUTH_FAILED:  # kazoo stops trying: say whom it refused
                raise _refused(client, connect)
            if time.monotonic() >= deadline:
                tls = client.handler.failures.last()
                raise ZooKeeperUnavailable(f"ZooKeeper at {connect} did not answer within {connect_timeout:g}s"
                                           + (f" (last TLS failure: {tls})" if tls else ""))
        if client.sasl_user is not None:  # kazoo reports CONNECTED before SASL is done: one round trip after it
            try:
                client.exists_async("/").get(timeout=max(deadline - time.monotonic(), 0.001))
            except AuthFailedError:
                raise _refused(client, connect) from None
            except (KazooTimeoutError,) + LOST_CONNECTION:
                pass  # the caller's first request says it
    except BaseException:
        close_client(client)
        raise
    return client


def _refused(client: KazooClient, connect: str) -> AuthFailed:
    user = getattr(client, "sasl_user", None)
    return AuthFailed(f"ZooKeeper at {connect} refused " + (
        f"SASL identity {user!r}: wrong password or unknown user" if user else "this client's credentials"))


def _raise_tls_failure(client: KazooClient) -> None:
    verdict = client.handler.failures.verdict(client.hosts)
    if verdict:
        raise zktls.TlsFailed(verdict)


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
#: What a request raises when the connection was lost under it; the client reconnects by
#: itself (to a new session if the old one expired), so the request may be tried again.
LOST_CONNECTION = (ConnectionLoss, SessionExpiredError, OperationTimeoutError)


def session_id(client: KazooClient) -> Optional[int]:
    """The client's session id while it is connected; None while it is not (kazoo's
    ``client_id`` is None then, so never index it blindly)."""
    ids = client.client_id
    return ids[0] if ids else None


class Holder(NamedTuple):
    """Who holds an ephemeral znode another session created: that session, the znode's data
    and version (see :func:`create_ephemeral`)."""
    session: int
    data: bytes
    version: int


#: What :func:`create_ephemeral` does with a znode another session holds.
REPLACE, WAIT = "replace", "wait"


def create_ephemeral(client: KazooClient, path: str, data: bytes, when_held: Callable[[Holder], str],
                     stopped: Callable[[], bool] = lambda: False, create: Optional[Callable[[], None]] = None,
                     poll_s: float = 0.5) -> bool:
    """Make the ephemeral znode ``path`` this session's: create it (``create()``, by default a
    plain create of ``data``), or find it ours already (a create whose answer was lost). While
    another session holds it, ``when_held(holder)`` decides, each time it is found so:
    :data:`REPLACE` deletes it at the version seen (our own dead session's, which ZooKeeper
    keeps for a session timeout: KAFKA-1387) and creates again; :data:`WAIT` waits for it to go
    (a watch on it, looked at again at least every ``poll_s``); raising gives up. Disconnected,
    it waits as for a holder. True once the znode is ours; False if ``stopped()`` first.
    Never for kazoo's threads: it calls ZooKeeper and waits."""
    create = create or (lambda: client.create(path, data, ephemeral=True))
    while not stopped():
        session = session_id(client)
        if session is not None:
            try:
                create()
                return True
            except NodeExistsError:
                try:
                    raw, stat = client.get(path)
                except NoNodeError:
                    continue  # it just went: create again
                if stat.ephemeralOwner == session:
                    return True
                if when_held(Holder(stat.ephemeralOwner, raw, stat.version)) == REPLACE:
                    try:
                        client.delete(path, version=stat.version)
                    except NoNodeError:
                        pass
                    continue
        gone = threading.Event()
        if client.exists(path, watch=lambda _event: gone.set()) is None:  # (kazoo's thread: record only)
            continue
        gone.wait(poll_s)
    return False


def wait_in_order(answers, timeout: Optional[float] = None):
    """``answers``: kazoo async results of pipelined requests, in the order they were sent.
    Wait until the last is answered and return ``answers``. ZooKeeper answers one session's
    requests in order, so all of them are answered then and the caller's gets return at once:
    the waiting thread wakes once instead of once per answer (a pipelined read costs the client
    ~20% less CPU). Only a hint: an answer still missing (say, a lost connection) is waited
    for by its own get."""
    if answers:
        answers[-1].wait(timeout)
    return answers


def children_and_pzxid(pending) -> Tuple[List[str], int]:
    """A ``get_children_async(path, include_data=True)`` answer: the sorted children and the
    parent's pzxid (the zxid of its last child change); [] and -1 if the parent is missing."""
    try:
        children, stat = pending.get()
    except NoNodeError:
        return [], -1
    return sorted(children), stat.pzxid


#: The largest request a ZooKeeper server takes by default (its ``jute.maxbuffer``, 1 MiB less
#: one byte); a bigger one makes the server drop the connection. A transaction of about 5,000
#: small writes is near it.
MAX_REQUEST_BYTES = 0xFFFFF


def transaction_bytes(transaction) -> int:
    """The size of a kazoo transaction as ZooKeeper receives it (the request header and its
    operations, serialized as a multi request): at most :data:`MAX_REQUEST_BYTES` fits."""
    from kazoo.protocol.serialization import Transaction
    return 8 + len(Transaction(transaction.operations).serialize())


def commit(transaction, timeout: Optional[float] = None) -> list:
    """Commit a kazoo transaction and raise :class:`TransactionFailed` if it was rolled back.

    kazoo returns failures as exception objects in the result list instead of raising; the
    operation that failed carries a real error, the others ``RolledBackError``. With
    ``timeout``, waiting for the answer is bounded (``KazooTimeoutError``; the transaction may
    still apply later). An operation the znodes' ACLs refuse raises kazoo's ``NoAuthError``.
    """
    return transaction_results(transaction.commit_async().get(timeout=timeout))


def transaction_results(results: list) -> list:
    """``results``, the answer of a committed transaction (say, one of several pipelined with
    ``commit_async``); raise :class:`TransactionFailed` or ``NoAuthError`` as :func:`commit`."""
    from kazoo.exceptions import NoAuthError, RolledBackError, RuntimeInconsistency

    for result in results:
        if isinstance(result, NoAuthError):
            raise result  # not a conflict with another writer: this identity may not do that (ACLs)
    for i, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            raise TransactionFailed(i, result)
    return results
