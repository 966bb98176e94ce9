"""A coordinator node's one HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and the console.

One port per node (``coordinatord --http-addr HOST:PORT``, or ``--metrics-port PORT`` as
before). Routes:

* ``GET /metrics``: the node's Prometheus registry (what ``--metrics-port`` always served).
* ``GET /healthz``: 200 while the process's threads run (Kubernetes liveness); 503 otherwise.
* ``GET /readyz``: 200 once the node's ZooKeeper session is connected and it has loaded what
  it leads (every shard placed on it verified, the console's snapshot read); 503 with the
  failing checks otherwise (Kubernetes readiness). Never a ZooKeeper call.
* ``GET /api/v1/...``, ``/ui/...``, ``/static/...``: the console (:mod:`coordinator.console`),
  read-only; ``/`` redirects to ``/ui/``.

Anything but GET and HEAD is 405: no route changes anything.

Who may see the console (``/metrics`` and the probes are answered to whoever reaches the port,
as before): bound to a loopback address (``--http-addr 127.0.0.1:9464``, or ``:9464``), only
requests whose ``Host`` header names the loopback (``localhost``, ``127.0.0.1``, ``[::1]``) or a
name given with ``--http-allowed-host`` are answered, so a web page elsewhere
cannot reach it through DNS rebinding. Bound to all interfaces by ``--metrics-port`` (as that
option always did), the console is answered only to loopback peers, with the same ``Host``
check. Bound to another address with ``--http-addr``, it is answered to everyone (a ``Host``
allow-list applies if given) and, without TLS, the node logs one warning line saying so.
TLS: ``--http-tls-cert`` and ``--http-tls-key`` (PEM files; TLS 1.2 at least). With
``--http-tls-client-ca FILE`` besides, a client must present a certificate signed by a CA in
that file: a connection without one, or with another CA's, is refused at the TLS handshake,
before any request is read — on every route of the port (``/metrics`` and the probes too: a
scraper or a probe then needs a client certificate as well).

Every answer carries ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and
``X-Frame-Options: DENY``; HTML answers a strict Content-Security-Policy (scripts, styles and
images from the node itself only: no inline script or style, no ``eval``).

Threads: ``ThreadingHTTPServer`` answers each connection on a daemon thread of its own; the
handlers only read what the node and the console keep in memory (each behind its own lock).
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from coordinator.errors import InvalidConfig

log = logging.getLogger("zkgroups.http")

MAX_PORT = 65535
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
COMMON_HEADERS = (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                  ("X-Frame-Options", "DENY"))
#: Seconds a connection may take to send its request (bounds a slow or silent client).
REQUEST_TIMEOUT_S = 10.0


@dataclass
class Response:
    """What a route answers: status, body, content type and extra headers."""
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: List[Tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, document, status: int = 200, compact: bool = False) -> "Response":
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":")) if compact else \
            json.dumps(document, indent=2, ensure_ascii=False)
        return cls(status, text.encode() + b"\n", "application/json; charset=utf-8")

    @classmethod
    def text(cls, text: str, status: int = 200) -> "Response":
        return cls(status, text.encode() + b"\n")

    @classmethod
    def html(cls, html: str, status: int = 200) -> "Response":
        return cls(status, html.encode(), "text/html; charset=utf-8", [("Content-Security-Policy", CSP)])

    @classmethod
    def redirect(cls, location: str) -> "Response":
        return cls(302, b"", headers=[("Location", location)])


#: A console: (path, query string) -> Response, or None for a path it does not serve.
App = Callable[[str, str], Optional[Response]]


# ---------------------------------------------------------------- addresses

def parse_http_addr(value: str, source: str = "--http-addr") -> Tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (the last two: 127.0.0.1). Port 0
    picks a free one. InvalidConfig, one line, otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfig(f"{source} must be HOST:PORT (or :PORT for 127.0.0.1), got {value!r}")
    text = value.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise InvalidConfig(f"{source} {value!r}: an IPv6 address is written [ADDRESS]:PORT")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    else:
        host, port = "", text
    host = host or "127.0.0.1"
    if not (port.isascii() and port.isdigit() and int(port) <= MAX_PORT):
        raise InvalidConfig(f"{source} {value!r}: the port must be a number from 0 to {MAX_PORT} (0: any free port)")
    if any(c.isspace() or c in "/?#@" for c in host):
        raise InvalidConfig(f"{source} {value!r}: {host!r} is not a host name or address")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a peer's) is the loopback."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def host_allowed(header: Optional[str], allowed: Iterable[str]) -> bool:
    """Whether a request's ``Host`` header names one of ``allowed`` (names or addresses, any
    port: behind a published or forwarded port the browser's differs from ours, and DNS
    rebinding is a matter of the name). A missing or malformed header is refused."""
    if not header:
        return False
    try:
        parts = urlsplit("//" + header.strip())
        name = (parts.hostname or "").lower()
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:
        return False
    return bool(name) and name in {a.lower().strip("[]") for a in allowed}


def _bind_family(host: str) -> int:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


# ---------------------------------------------------------------- the server

@dataclass
class HttpSettings:
    """Where and how a node serves HTTP (see the module docstring).

    ``console_open``: the console is answered to every peer (bound with ``--http-addr`` to a
    non-loopback address); otherwise only to loopback peers with an allowed ``Host``."""
    host: str
    port: int
    console_open: bool = False
    allowed_hosts: Tuple[str, ...] = ()
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_client_ca: Optional[str] = None  # clients must present a certificate this CA signed

    @classmethod
    def for_http_addr(cls, value: str, allowed_hosts=(), tls_cert=None, tls_key=None, tls_client_ca=None,
                      source="--http-addr"):
        host, port = parse_http_addr(value, source)
        return cls(host, port, not is_loopback(host), tuple(allowed_hosts), tls_cert, tls_key, tls_client_ca)

    @classmethod
    def for_metrics_port(cls, port: int, allowed_hosts=(), tls_cert=None, tls_key=None, tls_client_ca=None):
        """``--metrics-port``: every interface, as before; the console for loopback peers only."""
        return cls("0.0.0.0", port, False, tuple(allowed_hosts), tls_cert, tls_key, tls_client_ca)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)


class NodeHttpServer:
    """The node's HTTP server. ``start()`` binds (InvalidConfig, one line, when the address
    cannot be had or the TLS files cannot be loaded) and serves on a daemon thread;
    ``close()`` stops it. ``port`` is the port bound (the one picked when asked for 0).

    ``healthy()`` and ``ready()`` return (ok, {check: detail}); ``app`` serves the console's
    routes (None: no console)."""

    def __init__(self, settings: HttpSettings, registry: CollectorRegistry,
                 healthy: Callable[[], Tuple[bool, Dict[str, object]]],
                 ready: Callable[[], Tuple[bool, Dict[str, object]]], app: Optional[App] = None):
        self.settings, self.registry, self.healthy, self.ready, self.app = settings, registry, healthy, ready, app
        self.port: Optional[int] = None
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "NodeHttpServer":
        s = self.settings
        if s.tls_client_ca and not s.tls:
            raise InvalidConfig("--http-tls-client-ca needs HTTPS: give --http-tls-cert and --http-tls-key too")
        context = _tls_context(s.tls_cert, s.tls_key, s.tls_client_ca) if s.tls else None
        handler = type("Handler", (_Handler,), {"node_server": self})
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": _bind_family(s.host),
                                                               "daemon_threads": True, "handle_error": _quiet})
        try:
            server = server_class((s.host, s.port), handler)
        except (OSError, OverflowError) as e:
            raise InvalidConfig(f"cannot serve HTTP on {self._shown_addr(s.port)}: "
                                f"{getattr(e, 'strerror', None) or e}") from None
        if context is not None:
            # The handshake happens on the handler's thread (its first read), not in accept().
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, args=(0.1,), name="http", daemon=True)
        self._thread.start()
        if s.console_open and not s.tls and self.app is not None:
            log.warning("the console is served on %s without TLS: anyone who reaches it reads every group, member "
                        "and offset in clear text (give --http-tls-cert/--http-tls-key, or bind 127.0.0.1)",
                        self._shown_addr(self.port), extra={"port": self.port})
        return self

    def _shown_addr(self, port) -> str:
        host = self.settings.host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def base_url(self) -> str:
        host = self.settings.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else \
            f"[{host}]" if ":" in host else host
        return f"{'https' if self.settings.tls else 'http'}://{shown}:{self.port}"

    @property
    def url(self) -> str:
        """Where the metrics are (what the node's "metrics served at" line says)."""
        return self.base_url + "/metrics"

    @property
    def console_url(self) -> str:
        return self.base_url + "/ui/"

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    # ---- routing (handler threads)

    def allowed_hosts(self) -> List[str]:
        s = self.settings
        names = list(s.allowed_hosts)
        if not s.console_open or not names:
            names += list(LOOPBACK_NAMES)
        return names

    def console_visible(self, peer: str, host_header: Optional[str]) -> bool:
        s = self.settings
        if s.console_open:
            return not s.allowed_hosts or host_allowed(host_header, self.allowed_hosts())
        return is_loopback(peer) and host_allowed(host_header, self.allowed_hosts())

    def answer(self, path: str, query: str, peer: str, host_header: Optional[str]) -> Response:
        if path == "/metrics":
            return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if path in ("/healthz", "/readyz"):
            ok, checks = (self.healthy if path == "/healthz" else self.ready)()
            return Response.json({"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503)
        if self.app is None:
            return Response.text("not found", 404)
        if not self.console_visible(peer, host_header):
            return Response.text("the console is not served to this address or host name (see coordinatord "
                                 "--http-addr and --http-allowed-host)", 403)
        if path == "/":
            return Response.redirect("/ui/")
        answer = self.app(path, query)
        return answer if answer is not None else Response.text("not found", 404)


# ---------------------------------------------------------------- a node's probes

def node_health(node, console=None) -> Tuple[bool, Dict[str, object]]:
    """/healthz: the node's threads run (``node`` None: still waiting for ZooKeeper, alive)."""
    if node is None:
        return True, {"node": "waiting for ZooKeeper"}
    groups = node.groups
    checks: Dict[str, object] = {"event_thread": bool(groups and groups.event_thread_alive())}
    if console is not None:
        checks["console_snapshot"] = console.snapshot.alive
    return all(checks.values()), checks


def node_readiness(node, console=None) -> Tuple[bool, Dict[str, object]]:
    """/readyz: the ZooKeeper session is connected and the node has loaded what it leads
    (shards placed on it verified; the console's snapshot read, when it has one)."""
    if node is None:
        return False, {"zookeeper": "not connected yet"}
    client, groups = node.client, node.groups
    checks: Dict[str, object] = {"zookeeper_connected": bool(client and client.connected and not node.suspended),
                                 "shards_loaded": bool(groups and groups.loaded())}
    if console is not None:
        checks["console_loaded"] = console.snapshot.loaded
    return all(checks.values()), checks


def _tls_context(cert: Optional[str], key: Optional[str], client_ca: Optional[str] = None) -> ssl.SSLContext:
    if not cert or not key:
        raise InvalidConfig("TLS needs both --http-tls-cert and --http-tls-key")
    for path in (cert, key, *([client_ca] if client_ca else [])):
        if not os.path.isfile(path):
            raise InvalidConfig(f"TLS file {path} does not exist (or is not a file)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:  # the key's content is never shown
        raise InvalidConfig(f"cannot load the TLS certificate {cert} and key {key}: "
                            f"{getattr(e, 'reason', None) or getattr(e, 'strerror', None) or type(e).__name__}") from None
    if client_ca:
        try:
            context.load_verify_locations(client_ca)
        except (ssl.SSLError, OSError, ValueError):
            raise InvalidConfig(f"--http-tls-client-ca {client_ca} holds no PEM certificate") from None
        context.verify_mode = ssl.CERT_REQUIRED  # no certificate of that CA: the handshake fails
    return context


def _quiet(_server, request, client_address) -> None:
    """A connection that broke (a failed TLS handshake, a client gone): one debug line, no traceback."""
    log.debug("HTTP connection from %s failed", client_address[0], exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    node_server: NodeHttpServer
    server_version = "zkgroups"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _refuse(self) -> None:
        self.close_connection = True  # its body is not read
        self._send(Response(405, b"read-only: only GET and HEAD\n", headers=[("Allow", "GET, HEAD")]), head=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    def _serve(self, head: bool) -> None:
        parts = urlsplit(self.path)
        try:
            response = self.node_server.answer(parts.path, parts.query, self.client_address[0],
                                               self.headers.get("Host"))
        except Exception:  # a bug in a page must not take the server down: one line, a 500
            log.exception("HTTP %s failed", parts.path)
            response = Response.text("internal error (see the node's log)", 500)
        self._send(response, head)

    def _send(self, response: Response, head: bool) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in COMMON_HEADERS + tuple(response.headers):
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s %s", self.address_string(), format % args)
