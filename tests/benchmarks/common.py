"""Helpers shared by the benchmarks (run them with ``bin/bench NAME``).

This machine is shared and noisy: report every figure next to a baseline measured in the same
run, as a ratio, and print results with :func:`print_table`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from consumer.producer import Producer
from coordinator.zkclient import close_client, start_client
from coordinator.testing.zkserver import SERVER_JVM, provide_zookeeper


def workload_parser(name: str, doc: str, rounds: int, data_dir: bool = True) -> argparse.ArgumentParser:
    """``bin/bench NAME``'s options for the shared workload: records of --size bytes on
    --partitions partitions, best of --rounds; --data-dir keeps the log."""
    parser = argparse.ArgumentParser(prog=f"bin/bench {name}", description=doc.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds of each measurement (best is reported)")
    if data_dir:
        parser.add_argument("--data-dir", help="keep the log here instead of a temporary directory")
    return parser


@contextlib.contextmanager
def zookeeper(fsync: bool = True) -> Iterator[str]:
    """A ZooKeeper for the run (``ZK_CONNECT``, a local server or a container): its connect
    string. A local server runs with the JVM's defaults, as an installation's does."""
    with provide_zookeeper(tick_ms=200, fsync=fsync, jvm=SERVER_JVM) as provided:
        yield provided.connect


@contextlib.contextmanager
def zk_client(connect: str, session_timeout_ms: int = 6000):
    """A started kazoo client, closed on exit."""
    client = start_client(connect, session_timeout_ms=session_timeout_ms)
    try:
        yield client
    finally:
        close_client(client)


@contextlib.contextmanager
def scratch_dir(prefix: str = "zkgroups-bench-", keep: Optional[str] = None) -> Iterator[str]:
    """A temporary directory removed on exit (or ``keep``, used as is and kept)."""
    if keep:
        yield keep
        return
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its descendants, live or already waited
    for (Linux ``/proc``): steadier than wall time on a busy machine."""
    parents, times = {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(times.get(p, 0.0) for p in tree)


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds`` (monotonic, high resolution)."""

    def __enter__(self) -> "Timer":
        self.seconds = 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start

    def rate(self, count: int) -> float:
        return count / self.seconds if self.seconds > 0 else float("inf")


def produce(zk, data_dir: str, topic: str, records: int, payload: bytes) -> float:
    """Write ``records`` copies of ``payload`` to ``topic`` through a Producer; records/s."""
    with Producer(zk, data_dir) as producer, Timer() as t:
        send = producer.send
        for _ in range(records):
            send(topic, payload)
        producer.flush()
    return t.rate(records)


@dataclass
class Row:
    name: str
    value: float
    unit: str
    ratio: Optional[float] = None   # against the run's baseline
    note: str = ""                  # e.g. the target


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3g}"


def print_table(rows: Iterable[Row], title: str = "") -> None:
    """Print rows as an aligned table: name, value, unit, ratio, note."""
    rows = list(rows)
    cells = [("", "value", "unit", "ratio", "")] + [
        (r.name, _number(r.value), r.unit, "" if r.ratio is None else f"{r.ratio:.2f}", r.note) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    if title:
        print(title)
    for c in cells:
        print(f"  {c[0]:<{widths[0]}}  {c[1]:>{widths[1]}}  {c[2]:<{widths[2]}}  "
              f"{c[3]:>{widths[3]}}  {c[4]}".rstrip())
