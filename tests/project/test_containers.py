"""The container run's own logic, without an engine: what bin/test-containers counts as
consumed, how it reads build times, the engine harness's refusals, and bad input to the
images' scripts (one line, non-zero exit); and the zkgroups image's dependency layer, its
steps read from docker/Dockerfile and run in a throwaway directory. The images and the stack
themselves run in bin/test-containers, not in this suite (a build from nothing takes minutes)."""
import datetime as dt
import fnmatch
import importlib.machinery
import importlib.util
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.containers import dockerengine
from tests.containers.dockerengine import DockerEngine, EngineState, EngineUnavailable, install_missing
from tests.containers.run import _step_name, consumed_records, layer_times, listening_ports, missing_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTC = dt.timezone.utc


def test_consumed_records_are_the_printed_records_of_the_topic():
    lines = ['{"topic": "demo", "partition": 2, "offset": 7, "value": "x"}',
             '{"topic": "other", "partition": 2, "offset": 8}',
             "produced 10 records", "", "[1, 2]",
             '{"topic": "demo", "partition": 2, "offset": 7}']  # a redelivery counts once
    assert consumed_records(lines) == {(2, 7)}


@pytest.mark.parametrize("consumed, ends, missing", [
    ({(0, 0), (0, 1), (1, 0)}, {0: 2, 1: 1}, []),
    ({(0, 0), (0, 2)}, {0: 3, 1: 1}, [(0, 1), (1, 0)]),
    (set(), {0: 0}, []),
    ({(0, 5)}, {0: 1}, [(0, 0)]),  # beyond the end does not stand in for what is missing
])
def test_missing_records(consumed, ends, missing):
    assert missing_records(consumed, ends) == missing


def _row(when, size, created_by):
    return {"CreatedAt": when, "Size": str(size), "CreatedBy": created_by}


def test_layer_times_are_gaps_between_layers_made_by_this_build():
    history = [  # newest first, as docker history lists them
        _row("2026-01-01T00:02:00Z", 0, '/bin/sh -c #(nop)  CMD ["groupctl" "--help"]'),
        _row("2026-01-01T00:01:50Z", 2_000, "/bin/sh -c #(nop) COPY dir:abc in /src/coordinator"),
        _row("2026-01-01T00:01:30Z", 70_000_000, "|1 EXTRAS= /bin/sh -c set -eux; apt-get update"),
        _row("2025-06-01T00:00:00Z", 80_000_000, ""),  # the base image's one layer
    ]
    started = dt.datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert layer_times(history, 1, started) == [
        (90.0, 70_000_000, "RUN set -eux; apt-get update", False),
        (20.0, 2_000, "COPY dir:abc in /src/coordinator", False),
        (10.0, 0, 'CMD ["groupctl" "--help"]', False)]
    # Built again later: the first two layers came from the cache.
    later = dt.datetime(2026, 1, 1, 0, 1, 55, tzinfo=UTC)
    assert [(seconds, cached) for seconds, _, _, cached in layer_times(history, 1, later)] == [
        (0.0, True), (0.0, True), (5.0, False)]


def test_step_names():
    assert _step_name("/bin/sh -c #(nop)  ENV A=1") == "ENV A=1"
    assert _step_name("|2 BASE=x EXTRAS= /bin/sh -c pip  install .") == "RUN pip install ."
    assert _step_name("/bin/sh -c useradd z") == "RUN useradd z"


def test_install_missing_installs_nothing_when_every_command_is_there():
    assert install_missing({"sh": "dash", os.path.basename(sys.executable): "python3"}) == []


def test_install_missing_without_root_or_apt_is_one_line(monkeypatch):
    monkeypatch.setattr(dockerengine.shutil, "which", lambda cmd: None)
    with pytest.raises(EngineUnavailable, match=r"missing docker.io: install Debian's package\(s\) "
                                                r"\(apt-get install docker.io\) as root"):
        install_missing({"dockerd": "docker.io"})


def test_a_docker_host_that_does_not_answer_is_one_line(monkeypatch, tmp_path):
    url = f"unix://{tmp_path}/nothing.sock"
    monkeypatch.setenv("DOCKER_HOST", url)
    engine = DockerEngine(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"))
    with pytest.raises(EngineUnavailable, match=f"DOCKER_HOST={url} does not answer; unset it"):
        engine.start()
    engine.close()  # nothing was started: nothing to stop
    assert engine.state is EngineState.CLOSED
    assert not os.path.exists(tmp_path / "run")


def shipped_modules():
    """The modules the distribution ships: setup.cfg's packages (options.packages.find)."""
    import configparser
    import setuptools
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    include = cfg["options.packages.find"]["include"].split()
    for package in setuptools.find_packages(ROOT, include=include):
        folder = os.path.join(ROOT, *package.split("."))
        yield from (os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name.endswith(".py"))


def test_no_module_the_distribution_ships_runs_apt_get():
    """The engine harness installs Debian packages as root: it lives in tests/, not in the wheel."""
    import ast
    running = []
    for path in shipped_modules():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        if any(isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
               and node.elts[0].value == "apt-get" for node in ast.walk(tree)):
            running.append(os.path.relpath(path, ROOT))
    assert running == []
    assert os.path.join(ROOT, "coordinator", "testing", "zkserver.py") in set(shipped_modules())  # the scan sees the harness


def _script(argv, env):
    return subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("env, message", [
    ({"ZOO_MY_ID": "x"}, "ZOO_MY_ID must be a whole number from 1 to 255, not 'x'"),
    ({"ZOO_MY_ID": "0"}, "ZOO_MY_ID must be a whole number from 1 to 255, not '0'"),
    ({"ZOO_TICK_TIME": "-5"}, "ZOO_TICK_TIME must be a whole number from 1 to 600000, not '-5'"),
    ({"ZOO_MY_ID": "2", "ZOO_SERVERS": "server.1=zk1:2888:3888;2181"},
     "ZOO_SERVERS has no server.2 (this server's ZOO_MY_ID)"),
    ({"ZOO_SERVERS": "server.1=zk1:2888"},
     "ZOO_SERVERS entry 'server.1=zk1:2888' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"),
    ({"ZOO_SERVERS": "server.1=zk1:2888:3888;2181 server.2=$(id):1:2"},
     "ZOO_SERVERS entry 'server.2=$(id):1:2' is not server.N=HOST:QUORUM_PORT:ELECTION_PORT[;CLIENT_PORT]"),
    ({"ZOO_LOG_LEVEL": "LOUD"}, "ZOO_LOG_LEVEL must be one of TRACE DEBUG INFO WARN ERROR"),
])
def test_zookeeper_entrypoint_refuses_bad_settings_in_one_line(env, message):
    done = _script(["bash", os.path.join(ROOT, "docker", "zookeeper", "entrypoint.sh")], env)
    assert done.returncode == 1
    assert done.stderr == f"zookeeper-entrypoint: {message}\n"


@pytest.mark.parametrize("env, message", [
    ({"ZOO_TLS_KEY_STORE": "/nonexistent/zk1.keystore.pem"},
     "ZOO_TLS_KEY_STORE needs ZOO_TLS_TRUST_STORE (the CA client certificates are checked against)"),
    ({"ZOO_TLS_KEY_STORE": "/nonexistent/zk1.keystore.pem", "ZOO_TLS_TRUST_STORE": "/nonexistent/ca.pem"},
     "/nonexistent/zk1.keystore.pem does not exist or is not readable by"),
    ({"ZOO_TLS_KEY_STORE": "{ca}", "ZOO_TLS_TRUST_STORE": "{ca}"},
     "ZOO_TLS_KEY_STORE {ca} must hold this server's PEM key and certificate"),
    ({"ZOO_TLS_KEY_STORE": "{store}", "ZOO_TLS_TRUST_STORE": "{store}", "ZOO_TLS_CLIENT_AUTH": "none"},
     "ZOO_TLS_CLIENT_AUTH must be need or want"),
    ({"ZOO_TLS_KEY_STORE": "{store}", "ZOO_TLS_TRUST_STORE": "{ca}", "ZOO_TLS_QUORUM": "yes"},
     "ZOO_TLS_QUORUM must be true or false"),
    ({"ZOO_TLS_KEY_STORE": "{store}", "ZOO_TLS_TRUST_STORE": "{ca}", "ZOO_SECURE_CLIENT_PORT": "0"},
     "ZOO_SECURE_CLIENT_PORT must be a whole number from 1 to 65535, not '0'"),
    ({"ZOO_TLS_KEY_STORE": "{store}", "ZOO_TLS_TRUST_STORE": "{ca}",
      "ZOO_SERVERS": "server.1=zk1:2888:3888;2181 server.2=zk2:2888:3888"},
     "ZOO_SERVERS entry 'server.1=zk1:2888:3888;2181' names a client port, which would be plaintext: "
     "leave out ';2181' with ZOO_TLS_KEY_STORE"),
])
def test_zookeeper_entrypoint_refuses_bad_tls_settings_in_one_line(env, message, tmp_path):
    """A TLS-only server is refused before anything is written: a store missing or not PEM, a
    client port in ZOO_SERVERS (it would be plaintext)."""
    ca, store = tmp_path / "ca.pem", tmp_path / "zk1.keystore.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    store.write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n" + ca.read_text())
    env = {k: v.format(ca=ca, store=store) for k, v in env.items()}
    done = _script(["bash", os.path.join(ROOT, "docker", "zookeeper", "entrypoint.sh")], env)
    assert done.returncode == 1
    assert done.stderr.startswith(f"zookeeper-entrypoint: {message.format(ca=ca, store=store)}")
    assert len(done.stderr.splitlines()) == 1


def test_listening_ports_read_from_proc_net_tcp():
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
             "   0: 00000000:08E9 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 1 1\n"
             "   1: 0B00120A:0F30 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 2 1\n"
             "   2: 0B00120A:08E9 0C00120A:B2D6 01 00000000:00000000 00:00000000 00000000   999        0 3 1\n")
    assert listening_ports(table) == {2281, 3888}  # 08E9 = 2281; an established connection is no listener
    assert listening_ports("") == set()


CERTS = os.path.join(ROOT, "docker", "zkgroups-certs")


@pytest.mark.parametrize("argv, message", [
    (["--client", "admin"], "--client must be NAME:GID, not 'admin'"),
    (["--client", "../x:2001"], "--client '../x' is not a name of letters, digits, '.', '_' and '-'"),
    (["--server", "zk 1"], "--server 'zk 1' is not a name of letters, digits, '.', '_' and '-'"),
    (["--days", "0"], "--days must be a whole number of at least 1, not '0'"),
    (["--days", "30", "--renew-days", "30"], "--renew-days (30) must be less than --days (30)"),
    (["--out"], "--out needs a value"),
    (["--nope", "x"], "unknown argument '--nope' (see --help)"),
])
def test_certs_refuses_bad_arguments_in_one_line(argv, message):
    done = _script(["bash", CERTS, *argv], {})
    assert done.returncode == 1
    assert done.stderr == f"zkgroups-certs: {message}\n"


def _cert_text(path):
    return subprocess.run(["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-ext", "subjectAltName",
                           "-in", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("openssl") is None, reason="sets file owners: needs root and openssl")
def test_certs_makes_a_ca_and_the_identities_then_keeps_them(tmp_path):
    """What the stack's `certs` step makes: a CA whose key stays in its own directory, server key
    stores for ZooKeeper's user, client keys readable by their identity's group alone, the
    x509 identities of the policy; a second run keeps everything, another CA renews everything;
    no key material on its output."""
    from coordinator.zktls import certificate_identity
    ca_dir, out = tmp_path / "ca", tmp_path / "tls"
    ca_dir.mkdir()
    argv = ["bash", CERTS, "--ca-dir", str(ca_dir), "--out", str(out), "--server", "zk1", "--server-owner", "999",
            "--client", "coordinator:2001", "--client", "demo-group:2002"]
    first = _script(argv, {})
    assert first.returncode == 0, first.stderr
    assert "PRIVATE KEY" not in first.stdout + first.stderr and "BEGIN" not in first.stdout
    assert [line.split(":")[1].strip().split(" ")[0] for line in first.stdout.splitlines()] == \
        ["made", "issued", "issued", "issued"]
    assert sorted(os.listdir(out)) == ["ca.pem", "coordinator.key", "coordinator.pem", "demo-group.key",
                                       "demo-group.pem", "zk1.keystore.pem"]
    assert (os.stat(ca_dir / "ca.key").st_mode & 0o777) == 0o600
    store = os.stat(out / "zk1.keystore.pem")
    assert (store.st_uid, store.st_mode & 0o777) == (999, 0o600)
    key = os.stat(out / "coordinator.key")
    assert (key.st_uid, key.st_gid, key.st_mode & 0o777) == (0, 2001, 0o640)
    assert os.stat(out / "demo-group.key").st_gid == 2002
    assert certificate_identity(str(out / "coordinator.pem")) == "x509:CN=coordinator,O=zkgroups"
    assert certificate_identity(str(out / "demo-group.pem")) == "x509:CN=demo-group,O=zkgroups"
    assert "DNS:zk1, DNS:localhost, IP Address:127.0.0.1" in _cert_text(out / "zk1.keystore.pem")
    for name in ("zk1.keystore.pem", "coordinator.pem"):
        verified = subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.pem"), str(out / name)],
                                  capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}

    again = _script(argv, {})
    assert again.returncode == 0, again.stderr
    assert [line.split(":")[1].strip().split(" ")[0] for line in again.stdout.splitlines()] == ["CA", "kept", "kept", "kept"]
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before

    os.rename(ca_dir / "ca.key", tmp_path / "ca.key")  # the CA's certificate alone: keeps what is valid ...
    alone = _script(argv, {})
    assert alone.returncode == 0, alone.stderr
    assert "its certificate alone" in alone.stdout and alone.stdout.count("kept") == 3
    os.remove(out / "demo-group.pem")  # ... and cannot issue what is missing: one line naming it
    missing = _script(argv, {})
    assert missing.returncode == 1
    assert missing.stderr == (f"zkgroups-certs: demo-group's certificate in {out} must be issued (missing), "
                              f"but {ca_dir} has no ca.key\n")
    os.rename(tmp_path / "ca.key", ca_dir / "ca.key")

    for name in os.listdir(ca_dir):  # another CA (a CA of your own): every certificate issued again
        os.remove(ca_dir / name)
    renewed = _script(argv, {})
    assert renewed.returncode == 0, renewed.stderr
    assert renewed.stdout.count("issued (not signed by the CA)") == 2  # demo-group's: issued (missing)
    assert renewed.stdout.count("issued (missing) demo-group") == 1
    assert (out / "ca.pem").read_bytes() != before["ca.pem"]


def test_probe_usage_is_one_line():
    done = _script([sys.executable, os.path.join(ROOT, "docker", "zkgroups-probe"), "nonsense"], {})
    assert done.returncode == 2
    assert done.stderr == "usage: zkgroups-probe coordinator [NODE_ID] | zkgroups-probe URL\n"


def test_probe_of_a_url_that_does_not_answer_says_so(tmp_path):
    done = _script([sys.executable, os.path.join(ROOT, "docker", "zkgroups-probe"), "http://127.0.0.1:9/readyz"], {})
    assert done.returncode == 1
    assert done.stderr.startswith("zkgroups-probe: http://127.0.0.1:9/readyz: ")
    assert len(done.stderr.splitlines()) == 1


# ---------------------------------------------------------------- the Dockerfile's dependency layer

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")


def dockerfile_steps(path):
    """(INSTRUCTION, arguments) of each step of a Dockerfile: continuation lines joined,
    comments left out (also those between continuation lines, as Docker does)."""
    steps, pending = [], ""
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            pending += line.rstrip("\n")
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            instruction, _, arguments = pending.strip().partition(" ")
            steps.append((instruction.upper(), arguments.strip()))
            pending = ""
    return steps


def dependency_layer(steps):
    """The steps from the one after the RUN that makes the virtualenv up to (not including) the
    first COPY of the package's source: what the image installs before it has the code."""
    venv = next(i for i, (ins, args) in enumerate(steps) if ins == "RUN" and "-m venv" in args)
    source = next(i for i, (ins, args) in enumerate(steps)
                  if ins == "COPY" and "coordinator" in shlex.split(args)[:-1])
    return steps[venv + 1:source]


def dockerignored(path):
    """Whether the build context leaves ``path`` out (.dockerignore: the last matching rule wins)."""
    ignored = False
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        for rule in (line.strip() for line in f):
            if not rule or rule.startswith("#"):
                continue
            keep = rule.startswith("!")
            pattern = rule.lstrip("!").replace("**/", "")
            parts = path.split("/")
            if any(fnmatch.fnmatch("/".join(parts[:n]), pattern) or fnmatch.fnmatch(parts[n - 1], pattern)
                   for n in range(1, len(parts) + 1)):
                ignored = not keep
    return ignored


class ImageRoot:
    """A throwaway directory standing in for the image's file system: an absolute path in the
    image is the same path under ``root``, also in the commands run."""

    def __init__(self, root):
        self.root = str(root)
        self.paths = set()
        self.workdir = "/"  # in the image

    @property
    def cwd(self):
        return self.map(self.workdir)

    def map(self, path):
        path = os.path.normpath(path if os.path.isabs(path) else os.path.join(self.workdir, path))
        if path != "/":
            self.paths.add(path)
        return self.root + path if path != "/" else self.root

    def command(self, text):
        """``text`` with each image path that this layer used made a path under ``root``."""
        for path in sorted(self.paths, key=len, reverse=True):
            text = re.sub(rf"(?<![\w./-]){re.escape(path)}(?=[/\s\"';]|$)", lambda m: self.root + path, text)
        return text


def play_dependency_layer(image, env, steps):
    """Run the layer's WORKDIR, COPY and RUN steps as Docker would, in ``image`` (an ImageRoot)."""
    for instruction, arguments in steps:
        if instruction == "WORKDIR":
            image.workdir = os.path.normpath(os.path.join(image.workdir, arguments))
            os.makedirs(image.cwd, exist_ok=True)
        elif instruction == "COPY":
            *sources, dest = shlex.split(arguments)
            target = image.map(dest)
            for source in sources:
                assert not dockerignored(source), f"{source} is left out of the build context by .dockerignore"
                origin = os.path.join(ROOT, source)
                if os.path.isdir(origin):
                    shutil.copytree(origin, target, dirs_exist_ok=True)
                else:
                    into_dir = dest.endswith("/") or len(sources) > 1
                    os.makedirs(target if into_dir else os.path.dirname(target), exist_ok=True)
                    shutil.copy2(origin, os.path.join(target, os.path.basename(source)) if into_dir else target)
        elif instruction == "RUN":
            done = subprocess.run(["sh", "-c", image.command(arguments)], cwd=image.cwd, env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"RUN {arguments[:60]}... exited {done.returncode}:\n{done.stderr[-3000:]}"
        else:
            raise AssertionError(f"the dependency layer has a {instruction} step, which this test does not play")


def unmet(requirements, site_packages):
    """Those of ``requirements`` (PEP 508 lines) that no distribution in ``site_packages`` satisfies."""
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions(path=[site_packages])}
    missing = []
    for line in requirements:
        wanted = Requirement(line)
        if wanted.marker is not None and not wanted.marker.evaluate({"extra": ""}):
            continue
        version = have.get(canonicalize_name(wanted.name))
        if version is None or not wanted.specifier.contains(version, prereleases=True):
            missing.append(f"{line} (installed: {version})")
    return missing


@pytest.mark.process
def test_the_dockerfile_dependency_layer_installs_every_dependency_without_the_code(tmp_path):
    """The layer's steps, read from the Dockerfile, on a virtualenv made as the RUN before them
    makes one, with no package code copied and the build context's .dockerignore respected;
    afterwards every dependency the project declares is installed."""
    steps = dockerfile_steps(DOCKERFILE)
    layer = dependency_layer(steps)
    assert layer, "no steps between the virtualenv and the package's source"
    image = ImageRoot(tmp_path / "image")
    image_env = dict(item.split("=", 1) for ins, args in steps if ins == "ENV" for item in shlex.split(args))
    venv = image.map(image_env["VIRTUAL_ENV"])
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env["PATH"], EXTRAS="")
    made = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "setuptools>=61", "wheel"],
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr
    play_dependency_layer(image, env, layer)

    site_packages = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert unmet(metadata.requires("zkgroups"), site_packages) == []


INSTALL_DEPENDENCIES = os.path.join(ROOT, "docker", "install-dependencies")


def test_install_dependencies_reads_what_the_built_metadata_declares():
    """setuptools' reading of setup.cfg alone gives the requirements the project's metadata has
    (here: of the installed project), for each extra."""
    loader = importlib.machinery.SourceFileLoader("install_dependencies", INSTALL_DEPENDENCIES)
    script = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(script)
    built = [Requirement(r) for r in metadata.requires("zkgroups")]
    for extra in ("", "spark", "kafka"):
        wanted = {(r.name, str(r.specifier)) for r in built
                  if r.marker is None or "extra" not in str(r.marker) or r.marker.evaluate({"extra": extra})}
        read = script.requirements(os.path.join(ROOT, "setup.cfg"), [extra] if extra else [])
        assert {(Requirement(r).name, str(Requirement(r).specifier)) for r in read} == wanted


@pytest.mark.parametrize("argv, message", [
    ([], "usage: install-dependencies SETUP_CFG [EXTRAS]"),
    (["nothing.cfg"], "install-dependencies: nothing.cfg: no such file"),
    ([os.path.join(ROOT, "setup.cfg"), "kafka,nope"],
     f"install-dependencies: no extra 'nope' in {os.path.join(ROOT, 'setup.cfg')} (there are: docs, kafka, spark, test)"),
])
def test_install_dependencies_refuses_bad_input_in_one_line(argv, message):
    done = _script([sys.executable, INSTALL_DEPENDENCIES, *argv], {})
    assert done.returncode == 2
    assert done.stderr == message + "\n"
