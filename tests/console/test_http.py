"""The node's HTTP server (:mod:`coordinator.http`) without ZooKeeper: addresses, who sees the
console (loopback peers, the Host allow-list against DNS rebinding), read-only methods, the
security headers, TLS and the one-line warning for a console served in clear on a non-loopback
address."""
import http.client
import logging
import shutil
import ssl
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Counter

from coordinator.errors import InvalidConfig
from coordinator.http import (CSP, HttpSettings, NodeHttpServer, Response, host_allowed, is_loopback,
                              parse_http_addr)


@pytest.mark.parametrize("value, expected", [
    (":9464", ("127.0.0.1", 9464)), ("9464", ("127.0.0.1", 9464)), ("0.0.0.0:0", ("0.0.0.0", 0)),
    ("[::1]:80", ("::1", 80)), ("node-1.example:8080", ("node-1.example", 8080)),
])
def test_http_addresses(value, expected):
    assert parse_http_addr(value) == expected


@pytest.mark.parametrize("value, problem", [
    ("", "HOST:PORT"), ("host:", "port must be"), ("host:70000", "port must be"), ("host:x", "port must be"),
    ("[::1]80", "IPv6"), ("a b:80", "not a host"),
])
def test_bad_http_addresses_are_one_line(value, problem):
    with pytest.raises(InvalidConfig, match=problem):
        parse_http_addr(value)


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
                                            ("localhost", True), ("::ffff:127.0.0.1", True), ("0.0.0.0", False),
                                            ("10.1.2.3", False), ("example.com", False)])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("header, allowed", [
    ("localhost:8000", True), ("127.0.0.1:8000", True), ("[::1]:8000", True), ("LOCALHOST", True),
    ("localhost:9465", True), ("evil.example:8000", False), ("127.0.0.1.evil.example:8000", False), (None, False),
    ("", False), ("localhost:notaport", False),
])
def test_host_allow_list(header, allowed):
    assert host_allowed(header, ("localhost", "127.0.0.1", "::1")) is allowed


def _app(path, query):
    if path == "/ui/echo":
        return Response.html(f"<p>{query}</p>")
    return None


@pytest.fixture
def server():
    registry = CollectorRegistry()
    Counter("zkgroups_test", "a test counter", registry=registry).inc()
    s = NodeHttpServer(HttpSettings.for_http_addr("127.0.0.1:0"), registry, lambda: (True, {"threads": True}),
                       lambda: (False, {"zookeeper_connected": False}), _app).start()
    yield s
    s.close()


def request(port, method, path, host=None, tls_context=None):
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=tls_context, timeout=5) if tls_context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=5))
    conn.putrequest(method, path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_routes_probes_and_headers(server):
    r, body = request(server.port, "GET", "/metrics")
    assert r.status == 200 and b"zkgroups_test_total 1.0" in body
    r, body = request(server.port, "GET", "/healthz")
    assert r.status == 200 and b'"status": "ok"' in body
    r, body = request(server.port, "GET", "/readyz")
    assert r.status == 503 and b'"zookeeper_connected": false' in body
    r, body = request(server.port, "GET", "/ui/echo?x")
    assert r.status == 200 and r.getheader("Content-Security-Policy") == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
    for name, value in (("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                        ("X-Frame-Options", "DENY"), ("Cache-Control", "no-store")):
        assert r.getheader(name) == value
    assert r.getheader("Server") == "zkgroups"
    r, _ = request(server.port, "GET", "/")
    assert r.status == 302 and r.getheader("Location") == "/ui/"
    r, _ = request(server.port, "GET", "/nothing")
    assert r.status == 404
    r, body = request(server.port, "HEAD", "/metrics")
    assert r.status == 200 and body == b""


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_nothing_but_get_and_head(server, method):
    r, _ = request(server.port, method, "/api/v1/groups")
    assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"


def test_a_foreign_host_name_gets_no_console(server):
    """DNS rebinding: a page of evil.example resolving to 127.0.0.1 sends its own Host."""
    r, _ = request(server.port, "GET", "/ui/echo", host=f"evil.example:{server.port}")
    assert r.status == 403
    r, _ = request(server.port, "GET", "/ui/echo", host=f"localhost:{server.port}")
    assert r.status == 200
    r, body = request(server.port, "GET", "/metrics", host=f"prometheus.example:{server.port}")
    assert r.status == 200  # metrics and probes answer whoever reaches the port, as before


def test_metrics_port_serves_every_interface_but_the_console_to_loopback_peers_only():
    s = NodeHttpServer(HttpSettings.for_metrics_port(0), CollectorRegistry(), lambda: (True, {}),
                       lambda: (True, {}), _app).start()
    try:
        assert s.settings.host == "0.0.0.0" and not s.settings.console_open
        assert s.console_visible("127.0.0.1", f"127.0.0.1:{s.port}")
        assert not s.console_visible("10.0.0.5", f"10.0.0.5:{s.port}")
        r, _ = request(s.port, "GET", "/ui/echo")
        assert r.status == 200
    finally:
        s.close()


def test_an_open_console_without_tls_is_one_warning_line(caplog):
    caplog.set_level(logging.WARNING, "zkgroups.http")
    s = NodeHttpServer(HttpSettings.for_http_addr("0.0.0.0:0"), CollectorRegistry(), lambda: (True, {}),
                       lambda: (True, {}), _app).start()
    try:
        assert s.settings.console_open and s.console_visible("10.0.0.5", "anything")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "without TLS" in lines[0]
    finally:
        s.close()


def test_a_port_in_use_is_one_line():
    s = NodeHttpServer(HttpSettings.for_http_addr("127.0.0.1:0"), CollectorRegistry(), lambda: (True, {}),
                       lambda: (True, {})).start()
    try:
        with pytest.raises(InvalidConfig, match=f"cannot serve HTTP on 127.0.0.1:{s.port}"):
            NodeHttpServer(HttpSettings.for_http_addr(f"127.0.0.1:{s.port}"), CollectorRegistry(),
                           lambda: (True, {}), lambda: (True, {})).start()
    finally:
        s.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls(tmp_path, caplog):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    caplog.set_level(logging.WARNING, "zkgroups.http")
    s = NodeHttpServer(HttpSettings.for_http_addr("0.0.0.0:0", tls_cert=str(cert), tls_key=str(key)),
                       CollectorRegistry(), lambda: (True, {}), lambda: (True, {}), _app).start()
    try:
        assert s.base_url.startswith("https://") and not caplog.records  # TLS: no clear-text warning
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        r, body = request(s.port, "GET", "/healthz", tls_context=context)
        assert r.status == 200
        with pytest.raises((ConnectionError, http.client.HTTPException)):  # plain HTTP to a TLS port: refused
            request(s.port, "GET", "/healthz")
    finally:
        s.close()
    with pytest.raises(InvalidConfig, match="cannot load the TLS certificate") as e:
        NodeHttpServer(HttpSettings.for_http_addr(":0", tls_cert=str(key), tls_key=str(cert)), CollectorRegistry(),
                       lambda: (True, {}), lambda: (True, {})).start()
    assert "PRIVATE KEY" not in str(e.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
def test_client_certificates_required_by_http_tls_client_ca(tmp_path):
    """--http-tls-client-ca: a client with a certificate of that CA is answered; one without a
    certificate, or with another CA's, is refused at the handshake (no request read)."""
    from coordinator.testing.pki import ThrowawayCa
    ca, other = ThrowawayCa(str(tmp_path / "ca")), ThrowawayCa(str(tmp_path / "other"))
    server = ca.issue("console", ips=["127.0.0.1"])
    operator, stranger = ca.issue("operator"), other.issue("stranger")
    s = NodeHttpServer(HttpSettings.for_http_addr("127.0.0.1:0", tls_cert=server.cert, tls_key=server.key,
                                                  tls_client_ca=ca.cert),
                       CollectorRegistry(), lambda: (True, {}), lambda: (True, {}), _app).start()

    def client(issued=None):
        context = ssl.create_default_context(cafile=ca.cert)
        if issued is not None:
            context.load_cert_chain(issued.cert, issued.key)
        return context
    try:
        r, body = request(s.port, "GET", "/healthz", tls_context=client(operator))
        assert r.status == 200
        r, body = request(s.port, "GET", "/ui/echo?x", host="127.0.0.1", tls_context=client(operator))
        assert r.status == 200 and b"<p>x</p>" in body, body
        for refused in (client(), client(stranger)):  # TLS 1.3: the client hears of it on its first read
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                request(s.port, "GET", "/healthz", tls_context=refused)
    finally:
        s.close()
    with pytest.raises(InvalidConfig, match="needs HTTPS"):
        NodeHttpServer(HttpSettings.for_http_addr(":0", tls_client_ca=ca.cert), CollectorRegistry(),
                       lambda: (True, {}), lambda: (True, {})).start()
    with pytest.raises(InvalidConfig, match=f"--http-tls-client-ca {server.key} holds no PEM certificate"):
        NodeHttpServer(HttpSettings.for_http_addr(":0", tls_cert=server.cert, tls_key=server.key,
                                                  tls_client_ca=server.key), CollectorRegistry(),
                       lambda: (True, {}), lambda: (True, {})).start()
