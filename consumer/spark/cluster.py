"""A Spark standalone cluster on one machine: one master and N workers started from the pyspark
wheel's ``spark-class`` (``bin/spark-cluster``, and the tests' cluster round).

Each role runs on a :class:`Host`: an address, a scratch directory of its own (the worker's
work directory with the executors' stdout/stderr, Spark's local directories, ``TMPDIR`` and
``java.io.tmpdir`` of the daemon, its executors and their Python workers: nothing under a
shared ``/tmp``), and a ``preexec`` run in the child before exec (entering a network namespace
of its own, so the host has its own network stack). The daemons run in a process session of
their own, which their executors and Python workers join: :meth:`StandaloneCluster.kill_worker`
SIGKILLs a worker host's processes at once, as a machine that died.

What the executors need to run zkgroups (the wheel's Python and this project on their
``PYTHONPATH``) is in the workers' environment, as an installation on a real worker machine
would be. The master answers ``http://<address>:<webui port>/json/`` (workers, applications):
:meth:`StandaloneCluster.status`.

Not a production setup: no authentication (``spark.authenticate``), no TLS, no high
availability of the master, every host on one kernel and one disk.

States::

    NEW --start()--> RUNNING --close()--> CLOSED        (start() failing: CLOSED, what it started killed)
"""
from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from coordinator.lifecycle import Lifecycle

#: The standard ports, for hosts of their own (each has its own address).
MASTER_PORT, MASTER_WEBUI_PORT, WORKER_WEBUI_PORT = 7077, 8080, 8081
READY_POLL_S = 0.2
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ClusterError(RuntimeError):
    """A daemon did not start or exited (one line, naming its log)."""


def spark_home() -> str:
    """The pyspark wheel's directory (it holds ``bin/spark-class`` and the jars)."""
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


@dataclass
class Host:
    """Where one daemon runs: ``address`` (what it binds and advertises), ``scratch`` (its own
    directory), ``preexec`` (run in its child before exec; None: a new session only), ``tmp``
    (its temporary directory as its processes see it; None: ``<scratch>/tmp``; ``/tmp`` when
    ``preexec`` gives it a private ``/tmp``)."""
    name: str
    address: str
    scratch: str
    preexec: Optional[Callable[[], None]] = None
    ports: Dict[str, int] = field(default_factory=dict)
    tmp: Optional[str] = None


@dataclass
class _Daemon:
    host: Host
    argv: List[str]
    proc: Optional[subprocess.Popen] = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.host.scratch, "daemon.log")


class ClusterState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class StandaloneCluster(Lifecycle[ClusterState]):
    """A master on ``master`` and a worker on each of ``workers`` (see the module docstring).

    ``cores``/``memory`` are each worker's (``--cores``, ``--memory``). ``python`` is the
    executors' interpreter (default: the one running this). States: the module docstring's; a
    second ``start()`` raises, ``close()`` again does nothing. Threads: one thread calls everything.
    """

    TRANSITIONS = {
        ClusterState.NEW: {ClusterState.RUNNING, ClusterState.CLOSED},
        ClusterState.RUNNING: {ClusterState.CLOSED},
        ClusterState.CLOSED: set(),
    }

    def __init__(self, master: Host, workers: List[Host], cores: int = 2, memory: str = "1g",
                 python: Optional[str] = None, env: Optional[Dict[str, str]] = None):
        import sys
        super().__init__(ClusterState.NEW)
        self.master_host, self.worker_hosts = master, list(workers)
        self.cores, self.memory = cores, memory
        self.python = python or sys.executable
        self.extra_env = dict(env or {})
        master.ports.setdefault("port", MASTER_PORT)
        master.ports.setdefault("webui", MASTER_WEBUI_PORT)
        self.master = _Daemon(master, ["org.apache.spark.deploy.master.Master", "--host", master.address,
                                       "--port", str(master.ports["port"]), "--webui-port",
                                       str(master.ports["webui"])])
        self.workers = [self._worker_daemon(h) for h in self.worker_hosts]

    @property
    def url(self) -> str:
        """The master's URL, as ``spark-submit --master`` takes it."""
        return f"spark://{self.master_host.address}:{self.master_host.ports['port']}"

    @property
    def webui(self) -> str:
        return f"http://{self.master_host.address}:{self.master_host.ports['webui']}"

    def _worker_daemon(self, host: Host) -> _Daemon:
        host.ports.setdefault("webui", WORKER_WEBUI_PORT)
        return _Daemon(host, ["org.apache.spark.deploy.worker.Worker", self.url, "--host", host.address,
                              "--cores", str(self.cores), "--memory", self.memory, "--webui-port",
                              str(host.ports["webui"]), "--work-dir", os.path.join(host.scratch, "work")])

    # ---------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60.0) -> "StandaloneCluster":
        if not self._set_state(ClusterState.RUNNING, expect={ClusterState.NEW}):
            raise ClusterError(f"start() on a {self.state.value} cluster")
        try:
            self._spawn(self.master)
            self.wait_workers(0, timeout)
            for daemon in self.workers:
                self._spawn(daemon)
            self.wait_workers(len(self.workers), timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """SIGKILL every host's processes (idempotent)."""
        if not self._set_state(ClusterState.CLOSED):
            return
        for daemon in [*self.workers, self.master]:
            self._kill(daemon)

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- faults

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index``'s host: the daemon, its executors and their Python workers."""
        self._kill(self.workers[index])

    def restart_worker(self, index: int, timeout: float = 60.0) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait until it registered."""
        self._kill(self.workers[index])
        self._spawn(self.workers[index])
        self.wait_workers(len(self.workers), timeout)

    # ---------------------------------------------------------------- the master's view

    def status(self, timeout: float = 2.0) -> dict:
        """The master's ``/json/`` (workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=timeout) as reply:
            return json.loads(reply.read().decode())

    def alive_workers(self) -> List[dict]:
        try:
            return [w for w in self.status()["workers"] if w.get("state") == "ALIVE"]
        except (OSError, ValueError, KeyError):
            return []

    def wait_workers(self, count: int, timeout: float) -> None:
        """Until the master answers and ``count`` workers of ours are alive in its view (a
        killed worker stays listed as alive until the master's timeout: the current process's
        own port counts)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_running()
            if self._registered() >= count:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the Spark master saw {self._registered()} of {count} workers within "
                                   f"{timeout:g}s; see {self.master.log_path}")
            time.sleep(READY_POLL_S)

    def _registered(self) -> int:
        try:
            alive = {w["webuiaddress"] for w in self.status()["workers"] if w.get("state") == "ALIVE"}
        except (OSError, ValueError, KeyError):
            return -1
        return sum(1 for d in self.workers if d.proc is not None and d.proc.poll() is None
                   and f"http://{d.host.address}:{d.host.ports['webui']}" in alive)

    def executor_dirs(self, app_id: str) -> Dict[str, List[str]]:
        """Worker host name -> the executor directories application ``app_id`` had there."""
        found = {}
        for host in self.worker_hosts:
            app_dir = os.path.join(host.scratch, "work", app_id)
            found[host.name] = sorted(os.listdir(app_dir)) if os.path.isdir(app_dir) else []
        return found

    # ---------------------------------------------------------------- plumbing

    def _env(self, host: Host) -> Dict[str, str]:
        tmp = host.tmp or os.path.join(host.scratch, "tmp")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _PROJECT_ROOT]
        env.update(SPARK_HOME=spark_home(), SPARK_CONF_DIR=os.path.join(host.scratch, "conf"),
                   SPARK_LOCAL_IP=host.address, SPARK_LOCAL_DIRS=os.path.join(host.scratch, "local"),
                   SPARK_WORKER_DIR=os.path.join(host.scratch, "work"), TMPDIR=tmp,
                   SPARK_DAEMON_JAVA_OPTS=f"-Djava.io.tmpdir={tmp}", PYSPARK_PYTHON=self.python,
                   PYTHONPATH=os.pathsep.join([_PROJECT_ROOT, *paths]), **self.extra_env)
        return env

    def _spawn(self, daemon: _Daemon) -> None:
        host = daemon.host
        for sub in ("conf", "local", "work", "tmp"):
            os.makedirs(os.path.join(host.scratch, sub), exist_ok=True)
        with open(daemon.log_path, "ab") as log:
            daemon.proc = subprocess.Popen([os.path.join(spark_home(), "bin", "spark-class"), *daemon.argv],
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env=self._env(host), cwd=host.scratch,
                                           preexec_fn=host.preexec or _own_session)

    def _check_running(self) -> None:
        for daemon in [self.master, *self.workers]:
            if daemon.proc is not None and daemon.proc.poll() is not None and self.state == ClusterState.RUNNING:
                raise ClusterError(f"the Spark {'master' if daemon is self.master else 'worker'} on "
                                   f"{daemon.host.name} exited ({daemon.proc.returncode}); see {daemon.log_path}")

    @staticmethod
    def _kill(daemon: _Daemon) -> None:
        proc, daemon.proc = daemon.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the executors and Python workers too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _own_session() -> None:
    """A loopback host's ``preexec``: dies with its parent, in a session of its own."""
    from coordinator.testing.zkserver import die_with_parent
    die_with_parent()


def loopback_hosts(base_dir: str, workers: int) -> List[Host]:
    """A master and ``workers`` workers on 127.0.0.1 (free ports), scratch under ``base_dir``."""
    from coordinator.testing.zkserver import free_port

    def host(name, **ports):
        return Host(name, "127.0.0.1", os.path.join(base_dir, name), ports=ports)
    return [host("master", port=free_port(), webui=free_port()),
            *(host(f"worker{i}", webui=free_port()) for i in range(1, workers + 1))]


def remove_scratch(hosts: List[Host]) -> None:
    for host in hosts:
        shutil.rmtree(host.scratch, ignore_errors=True)
