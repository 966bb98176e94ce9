"""A Docker engine on demand, for the container run (``bin/test-containers``), the way
:mod:`coordinator.testing.zkserver` provides ZooKeeper. Part of the tests, not of the
distribution: it runs ``apt-get`` as root, and only the container run needs it.

:class:`DockerEngine` uses the engine that answers at ``DOCKER_HOST`` (which must then answer)
or at the default socket. Where none does, it installs Debian's ``docker.io`` when ``dockerd``
is missing (as root, with apt, as ``bin/setup`` installs ZooKeeper), starts ``dockerd`` on a
socket, exec root and data root of its own, and on :meth:`~DockerEngine.close` stops what it
started, and only that. The data root is kept between runs: it is the image and layer cache.

Guarantees: a machine where no engine can start gets :class:`EngineUnavailable` with one line
saying why; a started ``dockerd`` gets SIGTERM when its parent dies (it then stops its
containers and unmounts what it mounted), and ``close()`` waits for it and lazily unmounts
anything left under its roots. Not provided: stopping an engine someone else started, or
running next to another ``dockerd`` that owns the default bridge (that one answers first).
"""
from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional

from coordinator.errors import IllegalStateError
from coordinator.lifecycle import Lifecycle
from coordinator.testing.zkserver import die_with_parent

log = logging.getLogger("zkgroups.testing.docker")

DEFAULT_SOCKET = "/var/run/docker.sock"
#: Where a started engine lives: socket, exec root and pid file (tmpfs), and its data root and
#: log (kept: the image and layer cache).
RUN_DIR = os.environ.get("ZKGROUPS_DOCKER_RUN_DIR", "/run/zkgroups-docker")
STATE_DIR = os.environ.get("ZKGROUPS_DOCKER_STATE_DIR", "/var/lib/zkgroups")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
APT_LOCK_TIMEOUT_S = 300


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here; the message says why in one line."""


class EngineState(enum.Enum):
    NEW = "new"
    ATTACHED = "attached"   # an engine someone else runs; close() leaves it alone
    STARTED = "started"     # our dockerd; close() stops it
    CLOSED = "closed"


def install_missing(commands: Dict[str, str]) -> List[str]:
    """Install, with apt, the Debian package of every command in ``{command: package}`` that is
    not on PATH; return the packages installed. Raises :class:`EngineUnavailable` where that
    cannot be done (not root, no apt) or fails."""
    packages = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None})
    if not packages:
        return []
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"missing {', '.join(packages)}: install Debian's package(s) "
                                f"(apt-get install {' '.join(packages)}) as root")
    log.info("installing Debian's %s", ", ".join(packages))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"
    for argv in (["apt-get", "update", "-qq", "-o", lock],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "-o", lock, *packages]):
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise EngineUnavailable(f"{' '.join(argv[:2])} failed: {lines[-1] if lines else done.returncode}")
    return packages


def answers(url: str, timeout: float = 5.0) -> bool:
    """True if a Docker engine answers ``/_ping`` at ``url`` (unix://... or tcp://...)."""
    import docker  # testcontainers' dependency (the test extra)
    try:
        client = docker.DockerClient(base_url=url, timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to talk means: no engine there
        return False


class DockerEngine(Lifecycle[EngineState]):
    """An engine to run containers on: one that answers, else a ``dockerd`` of our own.

    States: NEW -> ATTACHED | STARTED (:meth:`start`) -> CLOSED (:meth:`close`; a second close
    is a no-op). One thread uses an instance (the run's main thread).
    """

    TRANSITIONS = {
        EngineState.NEW: {EngineState.ATTACHED, EngineState.STARTED, EngineState.CLOSED},
        EngineState.ATTACHED: {EngineState.CLOSED},
        EngineState.STARTED: {EngineState.CLOSED},
        EngineState.CLOSED: set(),
    }

    def __init__(self, run_dir: str = RUN_DIR, state_dir: str = STATE_DIR):
        super().__init__(EngineState.NEW)
        self.run_dir, self.state_dir = run_dir, state_dir
        self.socket = os.path.join(run_dir, "docker.sock")
        self.data_root = os.path.join(state_dir, "docker")
        self.exec_root = os.path.join(run_dir, "exec")
        self.pidfile = os.path.join(run_dir, "dockerd.pid")
        self.log_path = os.path.join(state_dir, "dockerd.log")
        self.url: Optional[str] = None
        self._proc: Optional[subprocess.Popen] = None

    @property
    def env(self) -> Dict[str, str]:
        """The environment for ``docker``, ``docker-compose`` and testcontainers: this engine."""
        return {"DOCKER_HOST": self.url or ""}

    def start(self) -> "DockerEngine":
        if self.state is not EngineState.NEW:  # the lifecycle's one rule (Lifecycle._start_once)
            if self.state is EngineState.CLOSED:
                raise IllegalStateError(f"the Docker engine is {self.state.value}: it is not started again")
            return self  # started before
        given = os.environ.get("DOCKER_HOST")
        if given:
            if not answers(given):
                raise EngineUnavailable(f"DOCKER_HOST={given} does not answer; unset it to have an engine started")
            return self._attach(given)
        for url in (f"unix://{DEFAULT_SOCKET}", f"unix://{self.socket}"):
            if answers(url):  # the second: our own, left by a run that could not stop it
                return self._attach(url)
        install_missing({"dockerd": "docker.io"})
        if os.geteuid() != 0:
            raise EngineUnavailable("no Docker engine answers and starting dockerd needs root")
        self._start_dockerd()
        return self

    def _attach(self, url: str) -> "DockerEngine":
        self.url = url
        log.info("docker engine: using the one at %s", url)
        self._set_state(EngineState.ATTACHED)
        return self

    def _start_dockerd(self) -> None:
        try:
            for path in (self.run_dir, self.data_root):
                os.makedirs(path, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)
        except OSError as e:
            raise EngineUnavailable(f"cannot prepare dockerd's directories: {e}") from None
        argv = [shutil.which("dockerd") or "dockerd", "--host", f"unix://{self.socket}",
                "--data-root", self.data_root, "--exec-root", self.exec_root, "--pidfile", self.pidfile]
        with open(self.log_path, "ab") as logf:
            # SIGTERM, not SIGKILL, when we die: dockerd then stops its containers and unmounts.
            self._proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          preexec_fn=functools.partial(die_with_parent, signal.SIGTERM))
        self.url = f"unix://{self.socket}"
        self._set_state(EngineState.STARTED)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(self.url, timeout=2.0):
            if self._proc.poll() is not None:
                self.close()
                raise EngineUnavailable(f"dockerd exited with {self._proc.returncode}: {self._last_log_line()}")
            if time.monotonic() > deadline:
                self.close()
                raise EngineUnavailable(f"dockerd did not answer within {START_TIMEOUT_S:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        log.info("docker engine: started dockerd (pid %d) at %s, data root %s", self._proc.pid, self.url, self.data_root)

    def _last_log_line(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
            return lines[-1] if lines else f"nothing in {self.log_path}"
        except OSError:
            return f"no {self.log_path}"

    def close(self) -> None:
        """Stop the dockerd this engine started (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        started = self.state is EngineState.STARTED
        if not self._set_state(EngineState.CLOSED) or not started:
            return
        pid = self._proc.pid if self._proc is not None else self._pid_from_file()
        if pid is not None:
            _stop(pid, self._proc)
        self._unmount_leftovers()
        log.info("docker engine: dockerd stopped")

    def _pid_from_file(self) -> Optional[int]:
        try:
            with open(self.pidfile) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _unmount_leftovers(self) -> None:
        """Lazily unmount whatever is still mounted under our roots (dockerd killed hard)."""
        try:
            with open("/proc/mounts") as f:
                points = [line.split()[1] for line in f]
        except OSError:
            return
        roots = (self.exec_root, self.data_root, self.run_dir)
        for point in sorted((p for p in points if p.startswith(roots)), reverse=True):
            log.warning("docker engine: unmounting %s, left by dockerd", point)
            subprocess.run(["umount", "-l", point], capture_output=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def _stop(pid: int, proc: Optional[subprocess.Popen]) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(pid, proc):
        if time.monotonic() > deadline:
            log.warning("docker engine: dockerd (pid %d) ignored SIGTERM for %.0f s; killing it", pid, STOP_TIMEOUT_S)
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
        time.sleep(0.1)


def _alive(pid: int, proc: Optional[subprocess.Popen]) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False

