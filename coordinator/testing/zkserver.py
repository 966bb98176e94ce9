"""A real ZooKeeper on demand, for tests, the quickstart and benchmarks.

:func:`provide_zookeeper` picks, in order: ``ZK_CONNECT`` (an external server, used as is);
a local install (``ZOOKEEPER_HOME``, else Debian's ``zookeeper`` package) started as a child
process on a free loopback port; else testcontainers, where a Docker engine answers
(:func:`start_container`; the image from ``ZKGROUPS_ZK_IMAGE``, else ``zookeeper:3.8``).

:class:`Ensemble` runs 1 or 3 local servers and can stop, SIGKILL and restart single
servers, which the fault tests need; by default on free loopback ports, or each server on an
address of its own (``hosts``) and started by a ``preexec`` of its own, e.g. one that enters a
network namespace (``bin/chaos`` cuts links between them). Children die with their parent
(PR_SET_PDEATHSIG), so a killed test run leaves no JVM behind.

``Ensemble(tls=True)`` serves TLS only: a ``secureClientPort`` on Netty (no plaintext port),
certificates from a throwaway CA (:class:`~coordinator.testing.pki.ThrowawayCa`), client
certificates required and mapped to x509 identities; :meth:`Ensemble.client_tls` issues a
client's certificate and returns its ``zk_tls`` setting.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import ssl
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from coordinator.testing.pki import ThrowawayCa

log = logging.getLogger("zkgroups.testing.zookeeper")

DEBIAN_CLASSPATH = ["/etc/zookeeper/conf", "/usr/share/java/zookeeper.jar"]
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: Netty's jars, which a TLS server needs and zookeeper.jar's manifest leaves out (without
#: netty-codec every handshake fails: NoClassDefFoundError io/netty/handler/codec/ByteToMessageDecoder).
NETTY_JARS = [f"/usr/share/java/netty-{name}.jar" for name in
              ("codec", "handler", "buffer", "common", "transport", "resolver", "transport-native-unix-common",
               "transport-native-epoll")]
#: A TLS-only server's settings (the port and the key store are the server's own).
TLS_SETTINGS = ["serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory", "ssl.keyStore.type=PEM",
                "ssl.trustStore.type=PEM", "ssl.clientAuth=need", "ssl.hostnameVerification=false",
                "authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider"]
INSTALL_HINT = ("no ZooKeeper found: install Debian's package (apt-get install zookeeper), "
                "set ZOOKEEPER_HOME to a ZooKeeper install, or set ZK_CONNECT=host:port")


class ZooKeeperNotFound(RuntimeError):
    pass


#: Where :func:`free_port` looks: below Linux's default ephemeral range (32768–60999), so that
#: no outgoing connection's source port and no ``bind(0)`` can take a server's port while the
#: server is down for a restart; each pytest-xdist worker has a slice of its own.
PORT_RANGE = (20000, 32000)
_ports_lock = threading.Lock()
_ports_handed_out: set = set()


def _port_slice() -> Tuple[int, int]:
    low, high = PORT_RANGE
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 0:
        width = (high - low) // int(workers)
        low += int(worker[2:]) % int(workers) * width
        high = low + width
    return low, high


def free_port() -> int:
    """A loopback port free now, never handed out before by this process, from this worker's
    slice of :data:`PORT_RANGE` (processes of one worker start at different places in it)."""
    low, high = _port_slice()
    start = low + os.getpid() * 7919 % (high - low)
    with _ports_lock:
        for i in range(high - low):
            port = low + (start - low + i) % (high - low)
            if port in _ports_handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _ports_handed_out.add(port)
            return port
    raise OSError(f"no free port left in {low}-{high}")


def four_letter(host: str, port: int, word: str, timeout: float = 1.0,
                context: Optional[ssl.SSLContext] = None) -> str:
    """Send a four-letter word (ruok, srvr, stat) and return the reply ('' if unreachable);
    over TLS with ``context``."""
    try:
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if context is not None:
                s = stack.enter_context(context.wrap_socket(s, server_hostname=host))
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def local_classpath() -> Optional[str]:
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = glob.glob(os.path.join(home, "lib", "*.jar")) + glob.glob(os.path.join(home, "*.jar"))
        conf = os.path.join(home, "conf")
        return os.pathsep.join([conf] + jars) if jars else None
    if os.path.exists(DEBIAN_CLASSPATH[1]):
        return os.pathsep.join(DEBIAN_CLASSPATH)
    return None


def die_with_parent(sig: int = signal.SIGKILL):
    """``preexec_fn`` for children that must not outlive their parent: PR_SET_PDEATHSIG sends
    the child ``sig`` (SIGKILL unless given) when the process that started it dies; a session
    of its own keeps a terminal's Ctrl-C from reaching it directly."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(1, int(sig))
    os.setsid()


#: JVM options of a test server: tests start many short-lived servers, and a small heap, the
#: serial collector and the C1 compiler alone start fastest and cost least over seconds.
TEST_JVM = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: A benchmark's server runs for minutes, as an installation's does: with the JVM's defaults
#: (Debian's zkServer.sh passes none), so the CPU measured is what a production server spends.
SERVER_JVM: Tuple[str, ...] = ()
#: ZooKeeper's standard ports (client, quorum, election): used when every server has an address of its own.
STANDARD_PORTS = (2181, 2888, 3888)


class Server:
    """One ZooKeeper server process (standalone or one member of an ensemble)."""

    def __init__(self, myid: int, workdir: str, client_port: int, peers: List[str],
                 tick_ms: int, fsync: bool, classpath: str, jvm: Sequence[str] = TEST_JVM,
                 host: str = "127.0.0.1", preexec: Optional[Callable[[], None]] = None,
                 tls: Optional[Dict[str, str]] = None, jaas: Optional[str] = None):
        self.myid, self.client_port, self.host = myid, client_port, host
        self.probe_context: Optional[ssl.SSLContext] = None  # TLS: how serving() reaches the port
        self.preexec = preexec  # run in the child before exec, after die_with_parent
        self.dir = os.path.join(workdir, f"server{myid}")
        self.data_dir = os.path.join(self.dir, "data")
        os.makedirs(self.data_dir, exist_ok=True)
        with open(os.path.join(self.data_dir, "myid"), "w") as f:
            f.write(str(myid))
        self.cfg = os.path.join(self.dir, "zoo.cfg")
        port = [f"clientPort={client_port}", f"clientPortAddress={host}"]
        if tls is not None:  # the secure port alone: a plaintext client finds nothing to talk to
            port = [f"secureClientPort={client_port}", f"secureClientPortAddress={host}", *TLS_SETTINGS,
                    f"ssl.keyStore.location={tls['key_store']}", f"ssl.trustStore.location={tls['trust_store']}"]
            classpath = os.pathsep.join([classpath] + [j for j in NETTY_JARS if os.path.exists(j)])
            self.probe_context = ssl.create_default_context(cafile=tls["trust_store"])
            self.probe_context.check_hostname = False
            self.probe_context.load_cert_chain(tls["probe_cert"], tls["probe_key"])
        lines = [f"tickTime={tick_ms}", f"dataDir={self.data_dir}", *port, "initLimit=20", "syncLimit=10",
                 f"minSessionTimeout={2 * tick_ms}", f"maxSessionTimeout={60 * tick_ms}",
                 "admin.enableServer=false", "4lw.commands.whitelist=*", "maxClientCnxns=0",
                 f"forceSync={'yes' if fsync else 'no'}"] + peers
        if jaas is not None:  # SASL (DIGEST-MD5) beside the other schemes; the users are in the JAAS file
            lines.append("authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
            jvm = [*jvm, f"-Djava.security.auth.login.config={jaas}"]
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.classpath, self.jvm = classpath, list(jvm)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self) -> None:
        if self.running:
            return
        logf = open(os.path.join(self.dir, "server.log"), "ab")
        cmd = [shutil.which("java") or "java", *self.jvm, "-Dzookeeper.admin.enableServer=false", "-cp", self.classpath, MAIN_CLASS, self.cfg]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=self._preexec, cwd=self.dir)
        logf.close()

    def _preexec(self) -> None:
        die_with_parent()
        if self.preexec is not None:
            self.preexec()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def serving(self) -> bool:
        """True once the server answers requests (standalone, leader or follower)."""
        reply = four_letter(self.host, self.client_port, "srvr", context=self.probe_context)
        return "Mode:" in reply

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig) -> None:
        if self.running:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Ensemble:
    """1 or 3 local ZooKeeper servers on free loopback ports.

    ``tick_ms=200`` gives sessions down to 400 ms, which keeps failure tests fast. ``hosts``
    (one address per server) puts each server on an address of its own with ZooKeeper's
    standard ports, for servers in network namespaces of their own; ``preexecs`` (one per
    server) run in each server's child before exec (e.g. entering its namespace). ``tls``:
    TLS only, certificates from :attr:`ca` (a new CA in the work directory). ``sasl``
    ({user: password}): the servers also authenticate those users with SASL DIGEST-MD5.
    """

    def __init__(self, size: int = 1, tick_ms: int = 200, fsync: bool = True,
                 workdir: Optional[str] = None, classpath: Optional[str] = None, jvm: Sequence[str] = TEST_JVM,
                 hosts: Optional[Sequence[str]] = None,
                 preexecs: Optional[Sequence[Optional[Callable[[], None]]]] = None, tls: bool = False,
                 sasl: Optional[Dict[str, str]] = None):
        classpath = classpath or local_classpath()
        if not classpath:
            raise ZooKeeperNotFound(INSTALL_HINT)
        if shutil.which("java") is None:
            raise ZooKeeperNotFound("no 'java' on PATH: ZooKeeper needs a Java runtime (apt-get install default-jre-headless)")
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="zkgroups-zk-")
        self.tick_ms = tick_ms
        if hosts is not None and len(hosts) != size or preexecs is not None and len(preexecs) != size:
            raise ValueError(f"hosts and preexecs need one entry per server ({size})")
        if hosts is None:
            hosts = ["127.0.0.1"] * size
            ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        else:
            ports = [STANDARD_PORTS] * size
        preexecs = preexecs or [None] * size
        peers = [f"server.{i + 1}={h}:{p[1]}:{p[2]}" for i, (h, p) in enumerate(zip(hosts, ports))] if size > 1 else []
        self.ca: Optional[ThrowawayCa] = None
        settings = self._tls_settings(hosts) if tls else None
        jaas = self._jaas(sasl) if sasl else None
        self.servers = [Server(i + 1, self.workdir, p[0], peers, tick_ms, fsync, classpath, jvm, h, x, settings, jaas)
                        for i, (h, p, x) in enumerate(zip(hosts, ports, preexecs))]

    def _tls_settings(self, hosts: Sequence[str]) -> Dict[str, str]:
        self.ca = ThrowawayCa(os.path.join(self.workdir, "pki"))
        server = self.ca.issue("zookeeper", ips=sorted(set(hosts)))
        probe = self.ca.issue("probe")
        return {"key_store": server.pem, "trust_store": self.ca.cert, "probe_cert": probe.cert,
                "probe_key": probe.key}

    def _jaas(self, users: Dict[str, str]) -> str:
        """The servers' JAAS file: SASL DIGEST-MD5 users and their passwords (a test's own)."""
        os.makedirs(self.workdir, exist_ok=True)
        path = os.path.join(self.workdir, "jaas.conf")
        entries = "".join(f'\n    user_{user}="{password}"' for user, password in users.items())
        with open(path, "w") as f:
            f.write(f"Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required{entries};\n}};\n")
        os.chmod(path, 0o600)
        return path

    def client_tls(self, name: str, **issue) -> Dict[str, str]:
        """A new client certificate (subject ``/O=zkgroups/CN=<name>``; ``issue``: more of
        :meth:`ThrowawayCa.issue`'s arguments) and the ``zk_tls`` setting that uses it."""
        if self.ca is None:
            raise RuntimeError("this ensemble does not serve TLS (Ensemble(tls=True))")
        issued = self.ca.issue(name, **issue)
        return {"ca": self.ca.cert, "cert": issued.cert, "key": issued.key}

    @property
    def connect(self) -> str:
        return ",".join(s.address for s in self.servers)

    def start(self, timeout: float = 30.0) -> "Ensemble":
        for s in self.servers:
            s.start()
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 30.0, servers=None) -> None:
        servers = servers or [s for s in self.servers if s.running]
        deadline = time.monotonic() + timeout
        while not all(s.serving() for s in servers):
            dead = [s for s in servers if not s.running]
            if dead:
                raise RuntimeError(f"ZooKeeper server {dead[0].myid} exited; see {dead[0].dir}/server.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ZooKeeper did not start within {timeout:.0f}s; see {self.workdir}")
            time.sleep(0.05)

    def restart(self, index: int, timeout: float = 30.0) -> None:
        self.servers[index].start()
        self.wait_serving(timeout, [self.servers[index]])

    def close(self) -> None:
        for s in self.servers:
            s.kill()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


class ProvidedZooKeeper:
    """What :func:`provide_zookeeper` returns: a connect string and a way to let go of it."""

    def __init__(self, connect: str, ensemble: Optional[Ensemble] = None, container=None):
        self.connect, self.ensemble, self.container = connect, ensemble, container

    @property
    def local(self) -> bool:
        return self.ensemble is not None

    def close(self) -> None:
        if self.ensemble:
            self.ensemble.close()
        if self.container:
            self.container.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


#: The image of the testcontainers path: the official ``zookeeper`` image unless this variable
#: names another with the same environment, such as the one ``docker/zookeeper`` builds from
#: Debian's packages (``zkgroups/zookeeper:3.8``) where no registry can be reached.
ENV_ZK_IMAGE = "ZKGROUPS_ZK_IMAGE"
DEFAULT_ZK_IMAGE = "zookeeper:3.8"


def _docker_answers() -> bool:
    try:
        import docker  # testcontainers' dependency
        docker.from_env().ping()
        return True
    except Exception:
        return False


def start_container(image: Optional[str] = None, tick_ms: int = 200, timeout: float = 60.0) -> ProvidedZooKeeper:
    """One ZooKeeper server in a container, started through testcontainers on the engine that
    ``DOCKER_HOST`` (or the default socket) names; ready once ``srvr`` reports a mode.

    The reaper container (Ryuk) comes from Docker Hub; where it cannot be pulled, set
    ``TESTCONTAINERS_RYUK_DISABLED=true``: :meth:`ProvidedZooKeeper.close` removes the container
    either way, and a run killed before that leaves one labelled ``org.testcontainers=true``.
    """
    from testcontainers.core.container import DockerContainer
    image = image or os.environ.get(ENV_ZK_IMAGE) or DEFAULT_ZK_IMAGE
    container = DockerContainer(image).with_exposed_ports(2181).with_env(
        "ZOO_TICK_TIME", str(tick_ms)).with_env("ZOO_4LW_COMMANDS_WHITELIST", "*")
    container.start()
    provided = ProvidedZooKeeper("", container=container)
    try:
        host, port = container.get_container_host_ip(), int(container.get_exposed_port(2181))
        provided.connect = f"{host}:{port}"
        deadline = time.monotonic() + timeout
        while "Mode:" not in four_letter(host, port, "srvr"):
            container.get_wrapped_container().reload()
            if container.get_wrapped_container().status != "running":
                tail = container.get_wrapped_container().logs(tail=3).decode(errors="replace").strip()
                raise RuntimeError(f"ZooKeeper container of {image} exited: {tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ZooKeeper container of {image} did not serve within {timeout:.0f}s")
            time.sleep(0.1)
    except BaseException:
        provided.close()
        raise
    return provided


def provide_zookeeper(tick_ms: int = 200, fsync: bool = True, jvm: Sequence[str] = TEST_JVM) -> ProvidedZooKeeper:
    external = os.environ.get("ZK_CONNECT")
    if external:
        return ProvidedZooKeeper(external)
    if local_classpath():
        ensemble = Ensemble(1, tick_ms=tick_ms, fsync=fsync, jvm=jvm).start()
        return ProvidedZooKeeper(ensemble.connect, ensemble)
    if _docker_answers():
        return start_container(tick_ms=tick_ms)
    raise ZooKeeperNotFound(INSTALL_HINT)
