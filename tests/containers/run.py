"""``bin/test-containers``: the ``docker/`` deployment built from Debian's packages and PyPI,
run, and judged from outside the containers; then everything it started is torn down.

    bin/test-containers [--base IMAGE] [--records N] [--fresh] [--own-ca] [--run-dir DIR]

1. engine: :class:`~tests.containers.dockerengine.DockerEngine` (an engine that answers,
   else a ``dockerd`` of its own); Debian's ``docker.io``, ``debootstrap`` and
   ``docker-compose`` are installed where missing.
2. base: ``docker/make-base-image`` (debootstrap from Debian's mirror, cached), unless
   ``--base`` names an image to pull or use (``debian:bookworm-slim`` where a registry answers).
3. build: the ZooKeeper image (``docker/zookeeper``) and the zkgroups image
   (``docker/Dockerfile``), timed, with where the time went (per step, from the layers' times).
4. testcontainers: the ZooKeeper harness's container path
   (:func:`~coordinator.testing.zkserver.start_container`) on the local ZooKeeper image, the
   reaper disabled; a znode written and read back, the container gone after ``close()``.
5. up: the compose stack (its one-shot ``certs`` making a throwaway CA and the certificates,
   its one-shot ``acl`` the policy of x509 identities; 3 ZooKeeper servers serving TLS only,
   3 ``coordinatord``, 3 consumers), until healthy; the CA and the admin's certificate copied out
   of the stack's ``tls`` volume into the run directory (mode 0600), for the host's ``groupctl``.
   ``--own-ca``: the stack's certificates come from a CA made beforehand, as an operator's own
   (``docker/compose.own-ca.yml``); the stack's ``ca.pem`` must be that CA's, byte for byte.
   tls-only: no server listens on the plaintext port 2181 (its ``/proc/net/tcp``); zk1's
   election port answers zk2 over TLS (the quorum's traffic encrypted too); a plaintext
   client on the TLS port, and a TLS client without a certificate, are refused in one line; the
   group's identity cannot do the admin's work (create a topic); a consumer's container can read
   its own identity's key and no other.
6. five rounds, each producing ``--records`` records (``compose run producer``) and waiting
   until every record is consumed (the consumers' printed records) and the group's committed
   offsets, read by ``groupctl`` on the host over TLS through the published ports, cover them:
   ``baseline``; ``coordinator-killed``: the container of the node that coordinates the group
   SIGKILLed and a consumer stopped, so the group needs another node to rebalance it;
   ``zookeeper-killed``: the leading ZooKeeper server's container SIGKILLed (two of three keep
   the quorum); ``healed``: both started again and healthy, the consumer back; ``rolled``:
   every ZooKeeper and coordinator container recreated one at a time, as an upgrade does
   (followers first, the ZooKeeper leader last, then the coordinators), records produced midway.
7. verdict: every produced record consumed (each partition's offsets 0..end-1 seen); every
   znode's ACL as the policy says (``groupctl acl check``); no key in any container's log or
   process listing, nor in either image; the stack removed with its volumes (``down -v``); the engine stopped if this run started it.

Exit status: 0 pass, 1 fail, 2 could not run (one line says why). The run directory keeps
``run.log`` and every container's log. Images stay in the engine's data root as the cache of
the next run (``--fresh`` removes them first, to measure a build from nothing).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.containers.dockerengine import DockerEngine, EngineUnavailable, install_missing  # noqa: E402
from coordinator.testing.zkserver import four_letter  # noqa: E402

log = logging.getLogger("zkgroups.test-containers")

LOCAL_BASE = "zkgroups/debian:bookworm"
ZK_IMAGE = "zkgroups/zookeeper:3.8"
APP_IMAGE = "zkgroups/zkgroups:latest"
COMPOSE_FILE = os.path.join(ROOT, "docker", "compose.yml")
OWN_CA_FILE = os.path.join(ROOT, "docker", "compose.own-ca.yml")
PROJECT = "zkgroups"
GROUP, TOPIC = "demo-group", "demo"
ZK_SERVICES = ("zk1", "zk2", "zk3")
COORDINATORS = ("coord-1", "coord-2", "coord-3")
CONSUMERS = ("consumer-1", "consumer-2", "consumer-3")
#: ZooKeeper as the host sees it: the TLS client ports compose.yml publishes on loopback.
HOST_ZK = {"zk1": 2281, "zk2": 2282, "zk3": 2283}
#: Inside the stack: the TLS port each server listens on, and the plaintext one none may.
TLS_PORT, PLAINTEXT_PORT = 2281, 2181
#: What the host copies out of the stack's tls volume (the admin's identity, the CA).
HOST_TLS_FILES = ("ca.pem", "admin.pem", "admin.key", "demo-group.pem", "demo-group.key")
HEALTHY_TIMEOUT_S = 240.0
ROUND_TIMEOUT_S = 240.0


class CannotRun(Exception):
    """The run could not be made (exit 2); the message is the one line."""


class Failed(Exception):
    """A check failed (exit 1); the message is the one line."""


# ---------------------------------------------------------------- pure pieces (unit-tested)

def consumed_records(lines: Iterable[str], topic: str = TOPIC) -> Set[Tuple[int, int]]:
    """The (partition, offset) of every record that ``groupctl consume --with-metadata``
    printed for ``topic``; other lines (not JSON, other topics) are left out."""
    seen = set()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("topic") == topic:
            seen.add((int(record["partition"]), int(record["offset"])))
    return seen


def listening_ports(proc_net_tcp: str) -> Set[int]:
    """The TCP ports in state LISTEN (0A) in the text of ``/proc/net/tcp`` or ``tcp6``."""
    ports = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def missing_records(consumed: Set[Tuple[int, int]], ends: Dict[int, int]) -> List[Tuple[int, int]]:
    """Every (partition, offset) below its partition's end (``ends``) that was not consumed."""
    return [(p, o) for p, end in sorted(ends.items()) for o in range(end) if (p, o) not in consumed]


def layer_times(history: Sequence[dict], base_layers: int, since: dt.datetime) -> List[Tuple[float, int, str, bool]]:
    """(seconds, bytes, step, cached) for each build step of an image on top of its base, from
    its ``docker history`` rows (newest first; ``CreatedAt`` RFC 3339, ``Size`` in bytes,
    ``CreatedBy``), the number of rows its base image has and when the build began. A layer
    made before the build began came from the cache (0 s); any other step took the gap between
    its layer and the one before it (or the build's start): running it and committing it."""
    rows = list(reversed(history))
    steps = []
    previous = since
    for row in rows[base_layers:]:
        made = _when(row["CreatedAt"])
        cached = made < since
        seconds = 0.0 if cached else max((made - previous).total_seconds(), 0.0)
        previous = max(previous, made)
        steps.append((seconds, int(row["Size"]), _step_name(row["CreatedBy"]), cached))
    return steps


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _instant(text: str) -> dt.datetime:
    """Docker's RFC 3339 time with nanoseconds (``2026-12-02T16:12:28.123456789Z``)."""
    whole, _, rest = text.rstrip("Z").partition(".")
    return _when(f"{whole}.{(rest + '000000')[:6]}Z")


def _step_name(created_by: str) -> str:
    """A short name for a layer's command: ``RUN set -eux; ...``, ``COPY dir:...``, ``ENV ...``."""
    text = " ".join(created_by.split())
    if text.startswith("/bin/sh -c #(nop) "):
        return text[len("/bin/sh -c #(nop) "):]
    if "/bin/sh -c " in text:  # [|N ARG=value ...] /bin/sh -c COMMAND
        return "RUN " + text.split("/bin/sh -c ", 1)[1]
    return text


# ---------------------------------------------------------------- the run

@dataclass
class Options:
    base: Optional[str]
    records: int
    fresh: bool
    run_dir: str
    own_ca: bool = False


@dataclass
class Timings:
    phases: Dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, action: Callable[[], object]):
        started = time.monotonic()
        try:
            return action()
        finally:
            self.phases[name] = time.monotonic() - started


class ContainerRun:
    """One run: the engine, the images, the stack and the checks, in that order; ``close()``
    removes the stack and stops the engine if this run started it. One thread."""

    def __init__(self, options: Options):
        self.options = options
        self.engine = DockerEngine()
        self.timings = Timings()
        self.compose_cmd: List[str] = []
        self.produced = 0
        self.stack_up = False
        self.containers: Dict[str, str] = {}
        self.tls_dir = os.path.join(options.run_dir, "tls")
        self.own_ca_dir = os.path.join(options.run_dir, "own-ca") if options.own_ca else None
        self.compose_files = [COMPOSE_FILE] + ([OWN_CA_FILE] if options.own_ca else [])

    # ---- commands

    @property
    def env(self) -> Dict[str, str]:
        own = {"ZKGROUPS_CA_DIR": self.own_ca_dir} if self.own_ca_dir else {}
        return dict(os.environ, **self.engine.env, **own, BASE_IMAGE=self.options.base or LOCAL_BASE,
                    TESTCONTAINERS_RYUK_DISABLED="true")

    def run(self, argv: Sequence[str], timeout: float = 900.0, check: bool = True) -> str:
        """Run a command against the engine; its stdout (stderr goes to run.log)."""
        log.debug("$ %s", " ".join(argv))
        try:
            done = subprocess.run(list(argv), env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"{' '.join(argv[:4])} ... did not finish within {timeout:.0f} s") from None
        if done.stderr.strip():
            log.debug("%s", done.stderr.strip())
        if check and done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise Failed(f"{' '.join(argv[:4])} ... exited {done.returncode}: {lines[-1] if lines else ''}")
        return done.stdout

    def compose(self, *args: str, timeout: float = 900.0, check: bool = True) -> str:
        files = [arg for path in self.compose_files for arg in ("-f", path)]
        return self.run([*self.compose_cmd, *files, "-p", PROJECT, *args], timeout=timeout, check=check)

    def groupctl_argv(self, *args: str, identity: Optional[str] = "admin") -> List[str]:
        """``groupctl`` on the host against the published ZooKeeper ports, over TLS as
        ``identity`` (its certificate from the stack), or a plaintext client (``identity=None``),
        or TLS without a certificate (``identity=""``)."""
        connect = ",".join(f"127.0.0.1:{p}" for p in HOST_ZK.values())
        tls: List[str] = []
        if identity is not None:
            tls = ["--zk-tls-ca", os.path.join(self.tls_dir, "ca.pem")]
        if identity:
            tls += ["--zk-tls-cert", os.path.join(self.tls_dir, f"{identity}.pem"),
                    "--zk-tls-key", os.path.join(self.tls_dir, f"{identity}.key")]
        return [os.path.join(ROOT, "bin", "groupctl"), "--zk", connect, "--zk-timeout", "10", *tls,
                "--data-dir", os.path.join(self.options.run_dir, "no-log-here"), *args]

    def groupctl(self, *args: str) -> dict:
        """``groupctl --output json`` on the host as the admin, over TLS."""
        return json.loads(self.run(self.groupctl_argv(*args, "--output", "json"), timeout=60))

    def refused(self, argv: Sequence[str], expected: str) -> str:
        """Run ``argv``, which must fail with a last stderr line containing ``expected``; that line."""
        done = subprocess.run(list(argv), env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)
        lines = done.stderr.strip().splitlines()
        last = lines[-1] if lines else ""
        log.debug("$ %s -> %d: %s", " ".join(argv), done.returncode, last)
        if done.returncode == 0 or expected not in last:
            raise Failed(f"{' '.join(argv[-4:])}: expected a refusal saying {expected!r}, got exit {done.returncode}: "
                         f"{last or done.stdout.strip()[-200:]}")
        return last

    def tls_context(self) -> ssl.SSLContext:
        """The admin's TLS context (the server's certificate checked, its name 127.0.0.1 too)."""
        context = ssl.create_default_context(cafile=os.path.join(self.tls_dir, "ca.pem"))
        context.load_cert_chain(os.path.join(self.tls_dir, "admin.pem"), os.path.join(self.tls_dir, "admin.key"))
        return context

    def srvr(self, port: int) -> str:
        return four_letter("127.0.0.1", port, "srvr", timeout=3.0, context=self.tls_context())

    def container(self, service: str) -> str:
        """The container id of ``service`` (kept: killing and starting a container keeps its id)."""
        if service not in self.containers:
            ids = self.compose("ps", "-q", service).split()
            if not ids:
                raise Failed(f"no container for service {service}")
            self.containers[service] = ids[0]
        return self.containers[service]

    def say(self, message: str) -> None:
        print(message, flush=True)
        log.info("%s", message)

    # ---- steps

    def start_engine(self) -> None:
        wanted = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
        if self.options.base:
            del wanted["debootstrap"]
        have_v2 = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
        if not have_v2:
            wanted["docker-compose"] = "docker-compose"
        try:
            installed = install_missing(wanted)
            self.engine.start()
        except EngineUnavailable as e:
            raise CannotRun(f"no Docker engine: {e}") from None
        self.compose_cmd = ["docker", "compose"] if have_v2 else ["docker-compose"]
        self.say(f"engine: {self.engine.state.value} at {self.engine.url}"
                 + (f" (installed {', '.join(installed)})" if installed else ""))

    def remove_images(self) -> None:
        for image in (APP_IMAGE, ZK_IMAGE, LOCAL_BASE):
            self.run(["docker", "image", "rm", "-f", image], check=False)
        self.run(["docker", "image", "prune", "-f"], check=False)
        self.run(["docker", "builder", "prune", "-af"], check=False)
        cache = os.environ.get("ZKGROUPS_CACHE_DIR", "/var/cache/zkgroups")
        tarball = os.path.join(cache, "debian-bookworm-minbase.tar")
        if not self.options.base and os.path.exists(tarball):
            os.unlink(tarball)
        self.say("fresh: cached images and the base tarball removed")

    def make_base(self) -> None:
        if self.options.base:
            if subprocess.run(["docker", "image", "inspect", self.options.base], env=self.env,
                              capture_output=True).returncode != 0:
                self.run(["docker", "pull", self.options.base], timeout=600)
            return
        out = subprocess.run([os.path.join(ROOT, "docker", "make-base-image"), "--tag", LOCAL_BASE],
                             env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1200)
        log.info("%s", out.stderr.strip())
        if out.returncode != 0:
            raise CannotRun(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "make-base-image failed")

    def build(self) -> None:
        base = self.options.base or LOCAL_BASE
        for image, argv in ((ZK_IMAGE, ["docker", "build", "--build-arg", f"BASE={base}", "-t", ZK_IMAGE,
                                        os.path.join("docker", "zookeeper")]),
                            (APP_IMAGE, ["docker", "build", "--build-arg", f"BASE={base}", "-t", APP_IMAGE,
                                         "-f", os.path.join("docker", "Dockerfile"), "."])):
            started, since = time.monotonic(), dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            self.run(argv, timeout=1800)
            self.timings.phases[f"build {image}"] = time.monotonic() - started
            self.report_image(image, since)
        # Earlier builds of changed steps: the cache lives on in the current images' layers.
        self.run(["docker", "image", "prune", "-f"], check=False)

    def report_image(self, image: str, since: dt.datetime) -> None:
        size = int(self.run(["docker", "image", "inspect", "-f", "{{.Size}}", image]).strip())
        rows = self.history(image)
        base_layers = len(self.history(self.options.base or LOCAL_BASE))
        steps = layer_times(rows, base_layers, since)
        cached = sum(1 for step in steps if step[3])
        self.say(f"image {image}: {size / 1e6:.0f} MB, built in {self.timings.phases[f'build {image}']:.0f} s, "
                 f"{cached} of {len(steps)} steps from the cache")
        for seconds, size_b, step, _ in sorted(steps, reverse=True)[:4]:
            if seconds > 0:
                self.say(f"  {seconds:6.0f} s {size_b / 1e6:7.1f} MB  {step[:90]}")

    def history(self, image: str) -> List[dict]:
        return [json.loads(line) for line in
                self.run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{json .}}", image]).splitlines()]

    def check_testcontainers(self) -> None:
        """The ZooKeeper harness's testcontainers path, for real, on the local image."""
        os.environ.update(self.engine.env, TESTCONTAINERS_RYUK_DISABLED="true")
        from coordinator.testing.zkserver import start_container
        from coordinator.zkclient import close_client, start_client
        provided = start_container(image=ZK_IMAGE, tick_ms=200)
        name = provided.container.get_wrapped_container().name
        try:
            client = start_client(provided.connect, 4000)
            try:
                client.create("/test-containers", b"written through testcontainers")
                value, _ = client.get("/test-containers")
            finally:
                close_client(client)
        finally:
            provided.close()
        if value != b"written through testcontainers":
            raise Failed(f"testcontainers: read back {value!r}")
        if self.run(["docker", "ps", "-aq", "--filter", f"name={name}"]).strip():
            raise Failed(f"testcontainers: container {name} still exists after close()")
        self.say(f"testcontainers: ZooKeeper from {ZK_IMAGE} at {provided.connect} served a znode; container removed")

    def make_own_ca(self) -> None:
        """An operator's own CA, made as docs/operations/security.md says (its key 0600)."""
        os.makedirs(self.own_ca_dir, mode=0o700, exist_ok=True)
        cert, key = os.path.join(self.own_ca_dir, "ca.pem"), os.path.join(self.own_ca_dir, "ca.key")
        self.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                  "-keyout", key, "-out", cert, "-days", "365", "-subj", "/O=example/CN=operator CA",
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        os.chmod(key, 0o600)
        self.say(f"own CA: {cert} (the stack's certs step reads it read-only)")

    def up(self) -> None:
        if self.own_ca_dir:
            self.make_own_ca()
        self.stack_up = True
        try:
            self.compose("up", "-d", "--no-build", *ZK_SERVICES, *COORDINATORS, *CONSUMERS, timeout=600)
        except Failed:
            for step in ("certs", "acl"):  # a one-shot step that failed says why in its last line
                ids = self.compose("ps", "-q", step, check=False).split()
                code = self.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", ids[0]], check=False).strip() if ids else ""
                if code not in ("", "0"):
                    said = subprocess.run(["docker", "logs", ids[0]], env=self.env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, timeout=60).stdout.strip().splitlines()
                    raise Failed(f"up: the {step} step exited {code}: {said[-1] if said else ''}") from None
            raise
        self.wait_healthy([*ZK_SERVICES, *COORDINATORS])
        self.say("up: certificates made, 3 ZooKeeper servers (TLS only) and 3 coordinatord healthy, 3 consumers running")
        self.copy_certificates()

    def copy_certificates(self) -> None:
        """The CA and the identities the host uses, out of the tls volume (through the exited
        ``certs`` container) into the run directory: the directory 0700, keys 0600."""
        os.makedirs(self.tls_dir, mode=0o700, exist_ok=True)
        certs = self.container("certs")
        for name in HOST_TLS_FILES:
            target = os.path.join(self.tls_dir, name)
            self.run(["docker", "cp", f"{certs}:/tls/{name}", target])
            os.chmod(target, 0o600 if name.endswith(".key") else 0o644)
        made = self.run(["docker", "logs", certs]).strip().splitlines()
        took = {}
        for service in ("certs", "acl"):
            times = self.run(["docker", "inspect", "-f", "{{.State.StartedAt}} {{.State.FinishedAt}}",
                              self.container(service)]).split()
            took[service] = (_instant(times[1]) - _instant(times[0])).total_seconds()
        ca = next((m.split(": ", 2)[2] for m in made if m.startswith("zkgroups-certs: CA: ")), None)
        ca = ca or next((m.split("(", 1)[1].rstrip(")") for m in made if "throwaway CA" in m), "the CA")
        self.say(f"certs: {len([m for m in made if 'issued' in m])} certificates issued by {ca} "
                 f"(certs step {took['certs']:.1f} s, acl step {took['acl']:.1f} s)")
        if self.own_ca_dir:
            with open(os.path.join(self.own_ca_dir, "ca.pem"), "rb") as own, \
                    open(os.path.join(self.tls_dir, "ca.pem"), "rb") as used:
                if own.read() != used.read():
                    raise Failed("the stack's ca.pem is not the CA given with compose.own-ca.yml")

    def check_tls_only(self) -> None:
        """ZooKeeper serves TLS only, to certificates of the stack's CA, each identity its role."""
        for service in ZK_SERVICES:
            ports = set()
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                ports |= listening_ports(self.run(["docker", "exec", self.container(service), "cat", table]))
            if PLAINTEXT_PORT in ports or TLS_PORT not in ports:
                raise Failed(f"{service} listens on {sorted(ports)}: expected {TLS_PORT} and not {PLAINTEXT_PORT}")
        quorum = self.run(["docker", "exec", self.container(ZK_SERVICES[1]), "sh", "-c",
                           "openssl s_client -connect zk1:3888 -brief -verify_return_error -CAfile /tls/ca.pem "
                           "-cert \"$ZOO_TLS_KEY_STORE\" -key \"$ZOO_TLS_KEY_STORE\" </dev/null 2>&1 "
                           "| grep -E '^(Protocol version|Peer certificate|Verification)'"],
                          check=False)
        if "Verification: OK" not in quorum:
            raise Failed(f"zk1's election port (3888) does not speak TLS to zk2: {quorum.strip()[-200:]}")
        plain = self.refused(self.groupctl_argv("coordinator", identity=None), "speaks TLS only")
        no_cert = self.refused(self.groupctl_argv("coordinator", identity=""), "certificate")
        if four_letter("127.0.0.1", HOST_ZK["zk1"], "srvr", timeout=3.0):
            raise Failed("a plaintext srvr on the TLS port was answered")
        member = self.refused(self.groupctl_argv("topics", "create", "intruder", "--partitions", "1",
                                                 identity="demo-group"), "")
        if "intruder" in json.dumps(self.groupctl("topics", "list")):
            raise Failed("the group's identity created a topic")
        consumer = self.container(CONSUMERS[0])
        readable = self.run(["docker", "exec", consumer, "sh", "-c",
                             "for k in /tls/*.key; do test -r $k && echo $k; done"], check=False).split()
        if readable != ["/tls/demo-group.key"]:
            raise Failed(f"{CONSUMERS[0]} (the group's identity) can read {readable}: expected its own key alone")
        self.say(f"tls-only: no server listens on {PLAINTEXT_PORT}, each on {TLS_PORT}; the quorum's election port "
                 f"speaks TLS; refused: a plaintext client "
                 f"({plain[:70]}...), one without a certificate ({no_cert[:70]}...), the group's identity creating "
                 f"a topic ({member[:70]}...); {CONSUMERS[0]} reads its own key, no other")

    def check_acls_and_secrets(self) -> None:
        """Every znode's ACL as the policy says; no key material in a log or a process listing."""
        self.run(self.groupctl_argv("acl", "check"), timeout=120)
        for service in (*ZK_SERVICES, *COORDINATORS, *CONSUMERS, "certs", "acl", "create-topic"):
            cid = self.container(service)
            done = subprocess.run(["docker", "logs", cid], env=self.env, capture_output=True, text=True, timeout=120)
            listing = self.run(["docker", "top", cid], check=False) if service in (*ZK_SERVICES, *COORDINATORS) else ""
            for where, text in (("log", done.stdout + done.stderr), ("process listing", listing)):
                if "PRIVATE KEY" in text or "BEGIN CERTIFICATE" in text:
                    raise Failed(f"{service}'s {where} shows key material")
        for image in (ZK_IMAGE, APP_IMAGE):  # keys are made at stack start, into volumes: none in an image
            found = self.run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "find", image, "/",
                              "-xdev", "(", "-name", "*.key", "-o", "-name", "*.keystore.pem", "-o", "-path", "/tls/*",
                              ")", "-print"], timeout=120).split()
            if found:
                raise Failed(f"{image} holds key files: {found[:5]}")
        self.say("acl check: every znode's ACL as the policy says; no key or certificate in a log, a process listing "
                 "or an image")

    def health(self, service: str) -> str:
        return self.run(["docker", "inspect", "-f", "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}",
                         self.container(service)]).strip()

    def wait_healthy(self, services: Sequence[str], timeout: float = HEALTHY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = {s: self.health(s) for s in services}
            if all(state == "healthy" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise Failed(f"not healthy within {timeout:.0f} s: {states}")
            time.sleep(2)

    def produce(self, records: int) -> None:
        out = self.compose("run", "--rm", "--no-deps", "producer", "groupctl", "produce", TOPIC,
                           "--generate", str(records), "--size", "100", timeout=300)
        if f"produced {records:,} records" not in out:
            raise Failed(f"producer: {out.strip()[-200:]}")
        self.produced += records

    def consumed(self) -> Set[Tuple[int, int]]:
        seen: Set[Tuple[int, int]] = set()
        for service in CONSUMERS:
            done = subprocess.run(["docker", "logs", self.container(service)], env=self.env, capture_output=True,
                                  text=True, timeout=120)
            seen |= consumed_records(done.stdout.splitlines())
        return seen

    def committed(self) -> Dict[int, int]:
        rows = self.groupctl("groups", "describe", GROUP)["offsets"]
        return {r["partition"]: r["current_offset"] or 0 for r in rows if r["topic"] == TOPIC}

    def wait_consumed(self, round_name: str) -> None:
        """Bounded: until every produced record was printed by a consumer and the committed
        offsets add up to everything produced."""
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        started = time.monotonic()
        while True:
            committed = self.committed()
            seen = self.consumed()
            if sum(committed.values()) == self.produced and len(seen) >= self.produced:
                missing = missing_records(seen, committed)
                if missing:
                    raise Failed(f"{round_name}: offsets committed but never printed: {missing[:5]}")
                self.say(f"round {round_name}: all {self.produced:,} records consumed and committed "
                         f"({time.monotonic() - started:.0f} s)")
                return
            if time.monotonic() > deadline:
                raise Failed(f"{round_name}: after {ROUND_TIMEOUT_S:.0f} s {len(seen):,} of {self.produced:,} records "
                             f"consumed, {sum(committed.values()):,} committed")
            time.sleep(2)

    def kill(self, service: str) -> None:
        self.run(["docker", "kill", "--signal", "KILL", self.container(service)])

    def group_coordinator(self) -> Tuple[str, str]:
        """(node coordinating the group, controller) as groupctl on the host reports them."""
        info = self.groupctl("coordinator")
        node = next((r["node"] for r in info["shards"] if GROUP in r["groups"]), None)
        if not node:
            raise Failed(f"groupctl coordinator: no node leads {GROUP}'s shard")
        return node, (info.get("leader") or {}).get("node_id", "")

    def zookeeper_leader(self) -> str:
        modes = {s: self.srvr(port) for s, port in HOST_ZK.items()}
        leaders = [s for s, reply in modes.items() if "Mode: leader" in reply]
        if len(leaders) != 1:
            raise Failed(f"expected one ZooKeeper leader, srvr says {[(s, r[-40:]) for s, r in modes.items()]}")
        return leaders[0]

    def rounds(self) -> None:
        n = self.options.records
        self.produce(n)
        self.wait_consumed("baseline")

        node, controller = self.group_coordinator()
        self.kill(node)
        self.compose("stop", "-t", "30", CONSUMERS[-1])  # the group needs a live coordinator to move its partitions
        self.say(f"killed {node} (coordinating {GROUP}{', and the controller' if node == controller else ''}), "
                 f"stopped {CONSUMERS[-1]}")
        self.produce(n)
        self.wait_consumed("coordinator-killed")
        now, _ = self.group_coordinator()
        if now == node:
            raise Failed(f"{node} was killed but groupctl still shows it leading {GROUP}'s shard")
        self.say(f"  {now} took over {GROUP}")

        zk_leader = self.zookeeper_leader()
        self.kill(zk_leader)
        self.say(f"killed {zk_leader} (the ZooKeeper leader)")
        self.produce(n)
        self.wait_consumed("zookeeper-killed")
        serving = {s: self.srvr(p) for s, p in HOST_ZK.items() if s != zk_leader}
        if not all("Mode:" in reply for reply in serving.values()):
            raise Failed(f"the two remaining ZooKeeper servers do not both serve: {serving}")
        self.say(f"  {' and '.join(serving)} kept serving (a new leader: {self.zookeeper_leader()})")

        self.compose("start", node, zk_leader, CONSUMERS[-1], timeout=300)
        self.wait_healthy([*ZK_SERVICES, *COORDINATORS])
        self.produce(n)
        self.wait_consumed("healed")
        self.report_usage()

        self.roll()
        self.produce(n)
        self.wait_consumed("rolled")

    def roll(self) -> None:
        """An upgrade's restarts, one server at a time: every container recreated (a new image
        would be picked up here), ZooKeeper followers first and the leader last, then the
        coordinators, each healthy before the next; records produced meanwhile."""
        zk_leader = self.zookeeper_leader()
        order = [s for s in ZK_SERVICES if s != zk_leader] + [zk_leader] + list(COORDINATORS)
        started = time.monotonic()
        for service in order:
            self.compose("up", "-d", "--no-deps", "--force-recreate", service, timeout=300)
            self.containers.pop(service, None)
            self.wait_healthy([service])
            if service == order[len(ZK_SERVICES) - 1]:
                self.produce(self.options.records)  # mid-roll: the ensemble renewed, the coordinators not yet
        self.say(f"rolled: {', '.join(order)} recreated one at a time, each healthy before the next "
                 f"({time.monotonic() - started:.0f} s)")

    def report_usage(self) -> None:
        """Memory and CPU of each container now (for sizing)."""
        out = self.run(["docker", "stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}\t{{.CPUPerc}}"])
        for line in sorted(out.splitlines()):
            name, memory, cpu = line.split("\t")
            self.say(f"  usage {name.replace(PROJECT + '_', '').rsplit('_', 1)[0]:<11} {memory.split(' / ')[0]:>9}  {cpu}")

    def save_logs(self) -> None:
        logs = os.path.join(self.options.run_dir, "containers")
        os.makedirs(logs, exist_ok=True)
        for service in (*ZK_SERVICES, *COORDINATORS, *CONSUMERS, "certs", "acl", "create-topic"):
            try:
                cid = self.container(service)
            except Failed:
                continue
            with open(os.path.join(logs, f"{service}.log"), "w") as f:
                subprocess.run(["docker", "logs", cid], env=self.env, stdout=f, stderr=subprocess.STDOUT, timeout=120)

    def close(self) -> None:
        try:
            if self.stack_up:
                self.save_logs()
                self.compose("down", "-v", "--remove-orphans", "-t", "30", timeout=300, check=False)
            if self.engine.url:  # containers the harness started, should a failure have left one
                leftovers = self.run(["docker", "ps", "-aq", "--filter", "label=org.testcontainers=true"], check=False).split()
                if leftovers:
                    self.run(["docker", "rm", "-fv", *leftovers], check=False)
        finally:
            self.engine.close()


def execute(options: Options) -> int:
    run = ContainerRun(options)
    started = time.monotonic()
    try:
        run.timings.timed("engine", run.start_engine)
        if options.fresh:
            run.remove_images()
        run.timings.timed("base image", run.make_base)
        run.timings.timed("build", run.build)
        run.timings.timed("testcontainers", run.check_testcontainers)
        run.timings.timed("up", run.up)
        run.timings.timed("tls-only", run.check_tls_only)
        run.timings.timed("rounds", run.rounds)
        run.timings.timed("acl check", run.check_acls_and_secrets)
        verdict = 0
        message = (f"PASS: {run.produced:,} records produced, every one consumed through a coordinator kill, a ZooKeeper "
                   "kill and a rolling restart, ZooKeeper TLS only")
    except CannotRun as e:
        verdict, message = 2, f"could not run: {e}"
    except Failed as e:
        verdict, message = 1, f"FAIL: {e}"
    except Exception as e:  # noqa: BLE001 - any other error is a failed run, said in one line
        log.exception("unexpected error")
        verdict, message = 1, f"FAIL: {type(e).__name__}: {e}"
    finally:
        run.timings.timed("teardown", run.close)
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in run.timings.phases.items())
    print(f"test-containers: {message} ({time.monotonic() - started:.0f} s: {phases}); run directory {options.run_dir}",
          flush=True)
    return verdict


def parse_args(argv=None) -> Options:
    parser = argparse.ArgumentParser(prog="bin/test-containers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="Base image to build on (pulled if missing), e.g. debian:bookworm-slim; "
                                       f"default: {LOCAL_BASE}, made by docker/make-base-image")
    parser.add_argument("--records", type=int, default=5000, help="Records produced per round (default 5000)")
    parser.add_argument("--fresh", action="store_true", help="Remove the cached images and base tarball first")
    parser.add_argument("--own-ca", action="store_true",
                        help="Run the stack on a CA made beforehand (docker/compose.own-ca.yml), not a throwaway one")
    parser.add_argument("--run-dir", help="Where run.log and the containers' logs go (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.records < 1:
        parser.error("--records must be at least 1")
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="zkgroups-containers-")
    os.makedirs(run_dir, exist_ok=True)
    return Options(base=args.base, records=args.records, fresh=args.fresh, run_dir=run_dir, own_ca=args.own_ca)


def main(argv=None) -> int:
    options = parse_args(argv)
    logging.basicConfig(filename=os.path.join(options.run_dir, "run.log"), level=logging.DEBUG,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return execute(options)


if __name__ == "__main__":
    sys.exit(main())
