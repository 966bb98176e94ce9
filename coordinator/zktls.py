"""TLS to ZooKeeper: one setting for every client zkgroups makes.

:class:`ZkTls` is the setting (a CA file, a client certificate and its key, the key's password,
whether the server's host name is checked); :func:`parse_tls` takes it from code
(``zk_tls={"ca": ..., "cert": ..., "key": ...}``), a TOML ``[zookeeper.tls]`` table, the CLIs'
``--zk-tls-*`` options or the environment (:func:`from_environment`, ``ZK_TLS_CA`` ...), and
checks its files at once: every problem (a file missing or unreadable, not PEM, a key that does
not match its certificate or cannot be decrypted, a client certificate expired or not yet
valid) is one :class:`~coordinator.errors.InvalidConfig` line naming the file and the check.

:mod:`coordinator.zkclient`'s clients build a TLS context from the files on every connection
attempt (:meth:`ZkTls.connect`): certificates replaced on disk are used by the next
connection, with no restart. Only ``ca`` is trusted when given. What the server says during a connection attempt is noted by
:class:`TlsFailures` and explained in one line by :func:`explain` (an untrusted server
certificate, a wrong host name, this client's certificate refused, a plaintext port).

Guaranteed: the server's certificate is verified against ``ca`` (the system's CAs without
one), its host name too unless ``verify_hostname`` is False, which every client made with it
says in a WARNING line. A key password is never shown (``repr``, errors, logs); give it as
``@/path/to/file`` (or ``ZK_TLS_KEY_PASSWORD_FILE``) to keep it out of process listings and
pickled jobs. Not provided: revocation lists, or a private key kept from anyone who can read
the key file or the process's memory.
"""
from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from typing import Dict, Mapping, Optional, Sequence, Tuple

from coordinator.config import read_small_file, refuse_unknown
from coordinator.errors import InvalidConfig, ZkGroupsError

#: The environment the CLIs read when no option gives a value (the library reads it only
#: through :func:`from_environment`).
ENV = {"ca": "ZK_TLS_CA", "cert": "ZK_TLS_CERT", "key": "ZK_TLS_KEY",
       "key_password": "ZK_TLS_KEY_PASSWORD", "key_password_file": "ZK_TLS_KEY_PASSWORD_FILE",
       "verify_hostname": "ZK_TLS_VERIFY_HOSTNAME"}
KEYS = ("ca", "cert", "key", "key_password", "verify_hostname")
MAX_PEM_BYTES = 1024 * 1024
MAX_PASSWORD_BYTES = 4096


class TlsFailed(ZkGroupsError):
    """ZooKeeper and this client could not agree on TLS (a certificate refused by either side,
    a TLS client on a plaintext port or the reverse): fixing a setting is the cure."""


class ZkTls:
    """A checked TLS setting. ``key_password`` is the text (never shown) or ``@file``;
    ``password_file`` is that file (worth carrying to another process; a literal is not)."""
    __slots__ = ("ca", "cert", "key", "_password", "password_file", "verify_hostname")

    def __init__(self, ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None,
                 key_password: Optional[str] = None, verify_hostname: bool = True, source: str = "zk_tls"):
        self.ca, self.cert, self.key, self.verify_hostname = ca or None, cert or None, key or None, verify_hostname
        self.password_file = key_password[1:] if key_password and key_password.startswith("@") else None
        self._password = _password(key_password, source)
        self._check(source)

    @property
    def identity(self) -> Optional[str]:
        """The x509 identity of the client certificate (``x509:CN=...,O=...``); None without one."""
        return certificate_identity(self.cert, "zk_tls") if self.cert else None

    def context(self) -> ssl.SSLContext:
        """A TLS context from the files as they are now: built again when one of them changed
        on disk (so a rotation reaches the next connection), else the one built before. Only
        ``ca`` is trusted when given — kazoo's own context would add the system's CAs to it,
        and load them at ~100 ms a connection."""
        key = (self.ca, self.cert, self.key, self.verify_hostname, self._password)
        stamp = tuple(_stamp(path) for path in (self.ca, self.cert, self.key))
        with _CONTEXTS_LOCK:
            cached = _CONTEXTS.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        context = self._new_context()
        with _CONTEXTS_LOCK:
            _CONTEXTS[key] = (stamp, context)
        return context

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca:
            context.load_verify_locations(self.ca)
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.verify_hostname
        if self.cert:
            context.load_cert_chain(self.cert, self.key, password=self._password or (lambda: b""))
        return context

    def connect(self, address: Tuple[str, int], hostname: str, timeout: Optional[float]) -> ssl.SSLSocket:
        """A TCP connection to ``address``, its TLS handshake done (``hostname`` checked)."""
        context = self.context()
        raw = socket.create_connection(address, timeout)
        try:
            return context.wrap_socket(raw, server_hostname=hostname)
        except BaseException:
            raw.close()
            raise

    def kazoo_options(self) -> dict:
        """The keyword arguments of ``KazooClient`` for this setting."""
        return {"use_ssl": True, "ca": self.ca, "certfile": self.cert, "keyfile": self.key,
                "keyfile_password": self._password, "verify_certs": True, "check_hostname": self.verify_hostname}

    def as_dict(self) -> dict:
        """The setting as ``zk_tls`` takes it, with the key password only as its ``@file``
        (for another process: a literal password is left out, and that process must be given it)."""
        found = {"ca": self.ca, "cert": self.cert, "key": self.key, "verify_hostname": self.verify_hostname}
        if self.password_file:
            found["key_password"] = "@" + self.password_file
        return {k: v for k, v in found.items() if v is not None}

    def carried(self, source: str = "zk_tls") -> dict:
        """The setting for processes started elsewhere (Spark executors): :meth:`as_dict`, file
        names only. A literal key password is refused (InvalidConfig): it would travel in the
        pickled job; give it as ``@file``, which each process reads itself."""
        if self._password and not self.password_file:
            raise InvalidConfig(f"{source}: workers in other processes need the key password as @FILE "
                                "(key_password='@/path/to/file', --zk-tls-key-password-file): a literal one would "
                                "travel in the pickled job (the value is not shown)")
        return self.as_dict()

    def __repr__(self) -> str:
        return (f"ZkTls(ca={self.ca!r}, cert={self.cert!r}, key={self.key!r}, "
                f"key_password={'***' if self._password else None}, verify_hostname={self.verify_hostname})")

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, ZkTls) and self.kazoo_options() == other.kazoo_options()

    def __hash__(self) -> int:
        return hash((self.ca, self.cert, self.key))

    def _check(self, source: str) -> None:
        """Load every file as kazoo will, so each problem is one line now, not a connection
        loop retrying forever."""
        if bool(self.cert) != bool(self.key):
            raise InvalidConfig(f"{source}: a client certificate needs both cert and key "
                                f"(--zk-tls-cert and --zk-tls-key), got only {'cert' if self.cert else 'key'}")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca:
            _readable(self.ca, f"{source}: CA file")
            try:
                context.load_verify_locations(self.ca)
            except (ssl.SSLError, ValueError):
                raise InvalidConfig(f"{source}: CA file {self.ca} holds no PEM certificate") from None
        if self.cert:
            self._check_pair(context, source)

    def _check_pair(self, context: ssl.SSLContext, source: str) -> None:
        _readable(self.cert, f"{source}: certificate file")
        _readable(self.key, f"{source}: key file")
        try:
            context.load_cert_chain(self.cert, self.key, password=self._password or (lambda: b""))
        except ssl.SSLError as e:
            raise InvalidConfig(f"{source}: {_pair_problem(e, self.cert, self.key)}") from None
        _check_validity(self.cert, source)


#: The contexts built, by setting: (the files' stamps when built, the context).
_CONTEXTS: Dict[tuple, Tuple[tuple, ssl.SSLContext]] = {}
_CONTEXTS_LOCK = threading.Lock()


def _stamp(path: Optional[str]) -> Optional[tuple]:
    """What tells a file replaced (``mv`` over it) or rewritten from the one read before."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ("missing",)  # the load that follows says why
    return st.st_ino, st.st_mtime_ns, st.st_size


def _readable(path: str, what: str) -> None:
    read_small_file(path, what, MAX_PEM_BYTES)


def _password(value: Optional[str], source: str) -> Optional[str]:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidConfig(f"{source}: key_password must be text or @file (the value is not shown)")
    if value.startswith("@"):
        raw = read_small_file(value[1:], f"{source}: key password file", MAX_PASSWORD_BYTES)
        try:
            return raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise InvalidConfig(f"{source}: key password file {value[1:]} is not UTF-8 text") from None
    return value


def _pair_problem(error: ssl.SSLError, cert: str, key: str) -> str:
    reason = (error.reason or str(error)).upper()
    if "KEY_VALUES_MISMATCH" in reason:
        return f"key {key} does not match certificate {cert}"
    if "BAD_DECRYPT" in reason or "BAD PASSWORD" in reason or "PROBLEMS GETTING PASSWORD" in reason or _encrypted(key):
        return f"key {key} cannot be decrypted: wrong or missing key password (key_password, ZK_TLS_KEY_PASSWORD_FILE)"
    return f"certificate {cert} or key {key} is not PEM that TLS can load ({error.reason or 'unreadable'})"


def _encrypted(key: str) -> bool:
    """Whether a PEM key file is encrypted (OpenSSL reports a wrong password as a bare "PEM lib")."""
    head = read_small_file(key, "key file", MAX_PEM_BYTES)
    return b"ENCRYPTED" in head


def _check_validity(cert: str, source: str) -> None:
    # The ssl module reads a certificate's dates only through this (CPython's own test hook);
    # without it the server's refusal is still explained, later.
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return
    try:
        info = decode(cert)
        not_before, not_after = (ssl.cert_time_to_seconds(info[k]) for k in ("notBefore", "notAfter"))
    except (ssl.SSLError, ValueError, KeyError, OSError):
        return
    now = time.time()
    if now >= not_after:
        raise InvalidConfig(f"{source}: client certificate {cert} expired on {info['notAfter']}")
    if now < not_before:
        raise InvalidConfig(f"{source}: client certificate {cert} is not valid before {info['notBefore']}")


def parse_tls(value, source: str = "zk_tls") -> Optional[ZkTls]:
    """A :class:`ZkTls` from ``value``: None (plaintext), a ZkTls, or a mapping of
    ``ca``, ``cert``, ``key``, ``key_password`` (text or ``@file``), ``verify_hostname``."""
    if value is None or isinstance(value, ZkTls):
        return value
    if not isinstance(value, Mapping):
        raise InvalidConfig(f"{source} must be a table of {', '.join(KEYS)}, got {type(value).__name__}")
    for key in value:
        if key not in KEYS:
            refuse_unknown(source, key, KEYS)
    for key in ("ca", "cert", "key"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise InvalidConfig(f"{source}: {key} must be a file name, got {type(value[key]).__name__}")
    verify = value.get("verify_hostname", True)
    if not isinstance(verify, bool):
        raise InvalidConfig(f"{source}: verify_hostname must be true or false")
    if not any(value.get(k) for k in ("ca", "cert", "key")):
        raise InvalidConfig(f"{source}: TLS needs at least a CA file (ca) or a client certificate (cert and key)")
    return ZkTls(value.get("ca"), value.get("cert"), value.get("key"), value.get("key_password"), verify, source)


def from_options(ca: Optional[str], cert: Optional[str], key: Optional[str], password_file: Optional[str],
                 no_verify_hostname: bool = False, environ: Optional[Mapping[str, str]] = None) -> Optional[ZkTls]:
    """The CLIs' setting: their ``--zk-tls-*`` options, else the environment's ``ZK_TLS_*``
    (``environ``, by default the process's; a key password only from a file or
    ``ZK_TLS_KEY_PASSWORD``: never a command line)."""
    environ = os.environ if environ is None else environ
    given = {"ca": ca or environ.get(ENV["ca"]), "cert": cert or environ.get(ENV["cert"]),
             "key": key or environ.get(ENV["key"])}
    if not any(given.values()):
        if password_file:
            raise InvalidConfig("--zk-tls-key-password-file needs --zk-tls-cert and --zk-tls-key")
        return None
    password_file = password_file or environ.get(ENV["key_password_file"])
    given["key_password"] = "@" + password_file if password_file else environ.get(ENV["key_password"])
    env_verify = environ.get(ENV["verify_hostname"], "").strip().lower()
    given["verify_hostname"] = not (no_verify_hostname or env_verify in ("0", "false", "no"))
    return parse_tls(given, "--zk-tls")


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[ZkTls]:
    """The setting the environment gives (``ZK_TLS_CA``, ``ZK_TLS_CERT``, ``ZK_TLS_KEY``,
    ``ZK_TLS_KEY_PASSWORD_FILE`` or ``ZK_TLS_KEY_PASSWORD``, ``ZK_TLS_VERIFY_HOSTNAME=false``)."""
    return from_options(None, None, None, None, False, environ)


# ---------------------------------------------------------------- the identity a certificate gives

#: RFC 2253's keywords, which Java's X500Principal.getName() (ZooKeeper's x509 id) uses.
_RFC2253 = {"commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
            "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
            "domainComponent": "DC", "userId": "UID"}


def _escaped(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


def certificate_identity(cert: str, source: str = "certificate") -> str:
    """``x509:<subject>``: the id ZooKeeper's X509AuthenticationProvider gives a client with
    the PEM certificate ``cert`` (the subject in RFC 2253 form, last RDN first:
    ``/O=zkgroups/CN=billing`` is ``x509:CN=billing,O=zkgroups``)."""
    read_small_file(cert, f"{source}: certificate file", MAX_PEM_BYTES)
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    try:
        subject = decode(cert)["subject"] if decode else None
    except (ssl.SSLError, OSError, KeyError):
        raise InvalidConfig(f"{source}: certificate file {cert} holds no PEM certificate") from None
    if not subject:
        raise InvalidConfig(f"{source}: cannot read the subject of {cert}: give the identity as x509:SUBJECT")
    rdns = []
    for rdn in reversed(subject):
        names = []
        for name, value in rdn:
            if name not in _RFC2253:
                raise InvalidConfig(f"{source}: {cert}'s subject has {name}, which ZooKeeper writes as an OID: "
                                    "give the identity as x509:SUBJECT")
            names.append(f"{_RFC2253[name]}={_escaped(value)}")
        rdns.append("+".join(names))
    return "x509:" + ",".join(rdns)


# ---------------------------------------------------------------- what the server said

#: OpenSSL's verify codes of a name the certificate does not carry (X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH).
_NAME_MISMATCH = (62, 64)
_REFUSED_ALERTS = ("ALERT_CERTIFICATE_REQUIRED", "ALERT_BAD_CERTIFICATE", "ALERT_UNKNOWN_CA",
                   "ALERT_CERTIFICATE_EXPIRED", "ALERT_CERTIFICATE_UNKNOWN", "ALERT_HANDSHAKE_FAILURE",
                   "ALERT_ACCESS_DENIED", "ALERT_CERTIFICATE_REVOKED", "ALERT_DECRYPT_ERROR")


def explain(error: BaseException, address: str, tls: Optional[ZkTls]) -> Optional[str]:
    """One line for a TLS failure of a connection to ``address``; None when ``error`` says
    nothing about TLS (the server down, a network fault)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        host = address.rsplit(":", 1)[0]
        if error.verify_code in _NAME_MISMATCH:
            return (f"ZooKeeper at {address} presents a certificate not valid for {host!r} (host name check): "
                    "connect by a name or address its certificate carries")
        trusted = f"the CA in {tls.ca}" if tls and tls.ca else "the system's CAs"
        return (f"ZooKeeper at {address} presents a certificate {trusted} does not trust "
                f"({error.verify_message})")
    text = str(error).upper()
    alert = next((a for a in _REFUSED_ALERTS if a in text), None)
    if alert == "ALERT_CERTIFICATE_REQUIRED" or (alert and tls is not None and not tls.cert):
        return (f"ZooKeeper at {address} requires a client certificate: give --zk-tls-cert and --zk-tls-key "
                "(zk_tls cert and key)")
    if alert:
        return (f"ZooKeeper at {address} refused this client's certificate {tls.cert if tls else ''} "
                f"({alert.replace('ALERT_', '').lower().replace('_', ' ')}): is it signed by the CA the server trusts?")
    return None


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> Optional[bool]:
    """Whether the server at ``host:port`` answers a TLS handshake (a server that then asks
    for a certificate still counts); None when nothing accepts a connection there.
    Certificates are not checked: this only tells a client why it cannot connect."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    try:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.do_handshake()
        return True
    except ssl.SSLError as e:
        text = str(e).upper()
        return not (isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError)) or "WRONG_VERSION_NUMBER" in text
                    or "UNEXPECTED_EOF" in text or "RECORD_LAYER_FAILURE" in text)
    except OSError:  # reset or timed out mid-handshake: not a TLS server
        return False
    finally:
        raw.close()


class TlsFailures:
    """What went wrong with the connection attempts of one client, per server address, as
    kazoo's connection thread reports it (recorded only; read by the thread that waits for the
    connection, which also probes the ports whose connections were cut off)."""

    def __init__(self, tls: Optional[ZkTls]):
        self.tls = tls
        self._lock = threading.Lock()
        self.failures: Dict[str, str] = {}
        self._cut: Dict[str, int] = {}      # connections cut without a TLS reason, per address
        self._probed: Dict[str, int] = {}   # how many cuts the last probe of an address had seen

    def note(self, error: BaseException, address: str) -> None:
        line = explain(error, address, self.tls)
        with self._lock:
            if line:
                self.failures[address] = line
            elif not isinstance(error, ConnectionRefusedError):
                self._cut[address] = self._cut.get(address, 0) + 1

    def verdict(self, addresses: Sequence[Tuple[str, int]]) -> Optional[str]:
        """The line to fail with when every server of ``addresses`` failed on TLS (one
        server with a bad certificate among good ones is not the client's fault)."""
        names = [f"{h}:{p}" for h, p in addresses]
        with self._lock:
            failures, cut = dict(self.failures), dict(self._cut)
        for (host, port), name in zip(addresses, names):
            if name not in failures and cut.get(name, 0) > self._probed.get(name, 0):
                self._probed[name] = cut[name]
                line = self._probe(host, port, name)
                if line:
                    with self._lock:
                        failures[name] = self.failures[name] = line
        if names and all(n in failures for n in names):
            return failures[names[-1]]
        return None

    def _probe(self, host: str, port: int, name: str) -> Optional[str]:
        tls = speaks_tls(host, port)
        if self.tls is None and tls:
            return (f"ZooKeeper at {name} speaks TLS only (a secureClientPort): give --zk-tls-ca and a "
                    "client certificate (zk_tls)")
        if self.tls is not None and tls is False:
            return (f"ZooKeeper at {name} does not speak TLS on this port: is it its plaintext clientPort "
                    "rather than its secureClientPort?")
        return None

    def last(self) -> Optional[str]:
        with self._lock:
            return next(reversed(self.failures.values()), None)
