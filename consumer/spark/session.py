"""The driver's Spark session: which master (:func:`spark_master`), the session zkgroups builds
(:func:`local_session`), and the driver's stderr under spark-submit (:func:`stderr_apart`).

Under spark-submit the application's Python starts with spark-submit's JVM already running and
its configuration (``--master``, ``--conf``, ``spark-defaults.conf``) held there, as Java
system properties; pyspark's ``SparkConf`` sees them only once the Py4J gateway to that JVM is
open (before, it is an empty Python dict). :func:`spark_master` opens it first, so every way of
giving spark-submit a master counts.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Dict, Optional, Tuple

#: Where a master comes from when neither the caller nor spark-submit gives one.
ENV_SPARK_MASTER = "SPARK_MASTER"

#: The project root: Spark's Python workers must be able to import this package.
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD = 434, 438  # the same number on every Linux architecture


def under_spark_submit() -> bool:
    """This Python is an application spark-submit started (its JVM waits on a gateway port)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def submitted_master() -> Optional[str]:
    """The master spark-submit resolved (``--master``, ``--conf spark.master=…``,
    ``spark-defaults.conf``, else its own ``local[*]``), or None when not under spark-submit."""
    if not under_spark_submit():
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # the gateway: without it SparkConf is an empty dict
    return SparkConf().get("spark.master", None)


def spark_master(master: Optional[str] = None, default: str = "local[2]") -> Tuple[Optional[str], str]:
    """``(master to set on the builder or None, the master the session will have)``: ``master``
    if given, else spark-submit's (then nothing is set: the session takes it), else
    ``$SPARK_MASTER``, else ``default``."""
    if master:
        return master, master
    submitted = submitted_master()
    if submitted:
        return None, submitted
    if os.environ.get(ENV_SPARK_MASTER, "").strip():
        chosen = os.environ[ENV_SPARK_MASTER].strip()
        return chosen, chosen
    return default, default


def local_session(master: Optional[str] = None, app_name: str = "zkgroups", conf: Optional[Dict[str, str]] = None,
                  log_level: str = "WARN", default_master: str = "local[2]"):
    """A SparkSession on ``master`` (:func:`spark_master`: the given one, spark-submit's,
    ``$SPARK_MASTER``, else ``default_master``); the UI and the console progress bar are off,
    and Spark's status store records every task's end at once (``spark.ui.liveUpdate.period=0``:
    the worker deaths' clock, :mod:`consumer.spark.deaths`), unless ``conf`` says otherwise.

    On a local master the Python workers run this interpreter and can import this project:
    ``PYSPARK_PYTHON`` (if unset) becomes ``sys.executable`` and the project root goes on
    ``PYTHONPATH`` before the JVM starts. On a cluster master nothing of the driver's
    interpreter or paths is pushed to the executors: zkgroups must be installed there (or
    shipped with ``--py-files``).
    """
    from pyspark.sql import SparkSession

    chosen, effective = spark_master(master, default_master)
    if effective.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if _PROJECT_ROOT not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *paths])
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.ui.liveUpdate.period": "0ms", "spark.sql.shuffle.partitions": "4", **(conf or {})}
    builder = SparkSession.builder.appName(app_name)
    if chosen is not None:
        builder = builder.master(chosen)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


def stderr_apart() -> bool:
    """Under spark-submit, send this process's stderr to spark-submit's own stderr; True if it did.

    spark-submit runs a Python application with its stderr merged into its stdout (Spark's
    ``PythonRunner`` starts it with ``redirectErrorStream(true)`` and copies that one pipe to
    its own stdout), so log lines and a program's output arrive mixed. Here fd 2 becomes the
    launching JVM's fd 2: the same open file (``pidfd_getfd``), else the same file reopened for
    appending (``/proc/<pid>/fd/2``). Nothing changes when not under spark-submit, when stdout
    and stderr are apart already, or when the JVM's stderr cannot be reached."""
    if not under_spark_submit() or not _merged():
        return False
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"org.apache.spark." not in f.read():
                return False
    except OSError:
        return False
    fd = _parent_fd(parent, 2)
    if fd is None:
        return False
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return True


def _merged() -> bool:
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def _parent_fd(pid: int, target: int) -> Optional[int]:
    """A descriptor of ``pid``'s ``target`` open file, or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if pidfd >= 0:
        try:
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, target, 0)
        finally:
            os.close(pidfd)
        if fd >= 0:
            return fd
    try:
        return os.open(f"/proc/{pid}/fd/{target}", os.O_WRONLY | os.O_APPEND)
    except OSError:
        return None
