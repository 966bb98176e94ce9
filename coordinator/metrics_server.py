"""Serving a Prometheus registry over HTTP (:class:`MetricsServer`) and checking a metrics port
(:func:`check_port`): what every process with a ``--metrics-port`` shares — a node, a consumer,
``groupctl exporter``, a Spark driver — apart from the node's own metrics
(:mod:`coordinator.metrics`), so a client serving its metrics loads nothing of the node.
"""
from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, start_http_server

from coordinator.errors import InvalidConfig

MAX_PORT = 65535


def check_port(port, source: str = "--metrics-port") -> int:
    """A metrics port: a whole number 0..65535 (0: any free port). InvalidConfig otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise InvalidConfig(f"{source} must be a port number from 0 to {MAX_PORT} (0: any free port), got {port!r}")
    return port


class MetricsServer:
    """``registry`` served at ``http://<addr>:<port>/metrics`` by a daemon thread (prometheus_client's).
    ``start()`` binds (InvalidConfig, one line, when the port cannot be had); ``close()``
    stops it; ``port`` is the port bound (the one picked when asked for 0)."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "0.0.0.0"):
        self.registry, self.requested, self.addr = registry, check_port(port), addr
        self.port: Optional[int] = None
        self._server = None

    def start(self) -> "MetricsServer":
        try:
            self._server, _thread = start_http_server(self.requested, addr=self.addr, registry=self.registry)
        except OSError as e:
            raise InvalidConfig(f"cannot serve metrics on {self.addr}:{self.requested}: "
                                f"{e.strerror or e}") from None
        self.port = self._server.server_port
        return self

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "", "::") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
