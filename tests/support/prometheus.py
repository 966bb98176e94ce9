"""Debian's Prometheus server (``prometheus``, installed by bin/setup) started by a test, and the
shipped alert rules rendered to run in seconds.

:func:`shortened_rules` is the one change made to ``monitoring/prometheus/zkgroups-alerts.yml``
before a test loads it: every duration is divided by ``factor`` (60: a minute becomes a second) —
each ``for:``, each range window (``[10m]`` becomes ``[10s]``) and the one threshold that is a
duration in seconds (``zkgroups_group_rebalancing_seconds) > 300`` becomes ``> 5``). Nothing else
in an expression changes, so a test of the rendered rules is a test of the shipped ones on a
clock 60 times faster (the server scraping and evaluating every second).

:class:`PrometheusServer` runs the server on a free loopback port with its own storage, scrape
targets in a file it watches (``set_targets``: a node that starts later is scraped within a
second), and reads its HTTP API (instant queries, raw samples, active alerts).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

import yaml

from coordinator.testing.zkserver import free_port
from tests.support.helpers import wait_for

PROMETHEUS = shutil.which("prometheus")

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = r"(\d+)(ms|s|m|h|d)"


def _seconds(number: str, unit: str) -> float:
    return int(number) * _UNITS[unit]


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def shortened_rules(text: str, factor: int = 60) -> str:
    """The rules file ``text`` with every ``for:``, range window and seconds threshold divided
    by ``factor`` (see the module docstring); anything else is left as it is."""
    text = re.sub(r"(\bfor:\s*)" + _DURATION + r"\b",
                  lambda m: m.group(1) + _duration(_seconds(m.group(2), m.group(3)) / factor), text)
    text = re.sub(r"\[" + _DURATION + r"(:" + _DURATION + r")?\]",
                  lambda m: "[" + _duration(_seconds(m.group(1), m.group(2)) / factor)
                  + (":" + _duration(_seconds(m.group(4), m.group(5)) / factor) if m.group(3) else "") + "]", text)
    return re.sub(r"(_seconds\)\s*>\s*)(\d+)\b", lambda m: m.group(1) + f"{int(m.group(2)) / factor:g}", text)


class PrometheusServer:
    """One Prometheus server in ``directory``: ``config`` (a prometheus.yml as a dict) is written
    there as it is, except that each scrape job named in ``jobs`` reads its targets from a file
    (``set_targets``). ``start()`` returns once ``/-/ready`` answers; ``close()`` stops it."""

    def __init__(self, directory: str, config: dict, jobs=()):
        self.directory, self.jobs = directory, tuple(jobs)
        self.config = dict(config)
        scrapes = []
        for job in self.config.get("scrape_configs", []):
            job = dict(job)
            if job["job_name"] in self.jobs:
                job.pop("static_configs", None)
                job["file_sd_configs"] = [{"files": [self._targets_path(job["job_name"])], "refresh_interval": "1s"}]
            scrapes.append(job)
        self.config["scrape_configs"] = scrapes
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""

    def _targets_path(self, job: str) -> str:
        return os.path.join(self.directory, f"targets-{job}.json")

    def set_targets(self, job: str, targets: List[str]) -> None:
        """Scrape ``targets`` (host:port) in ``job`` from now on (written whole, then renamed in)."""
        path = self._targets_path(job)
        with open(path + ".tmp", "w") as f:
            json.dump([{"targets": list(targets)}], f)
        os.replace(path + ".tmp", path)

    def start(self) -> "PrometheusServer":
        for job in self.jobs:
            if not os.path.exists(self._targets_path(job)):
                self.set_targets(job, [])
        config_path = os.path.join(self.directory, "prometheus.yml")
        with open(config_path, "w") as f:
            yaml.safe_dump(self.config, f)
        for _attempt in range(3):  # the port picked may be taken before the server binds it
            port = free_port()
            log = open(os.path.join(self.directory, "prometheus.log"), "w")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={self.directory}/data",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=log)
            log.close()
            self.url = f"http://127.0.0.1:{port}"
            try:
                wait_for(lambda: self.proc.poll() is not None or self._ready(), 30, message="Prometheus ready")
            except AssertionError:
                self.close()
                raise
            if self.proc.poll() is None:
                return self
        raise AssertionError("Prometheus did not start: " + self.log())

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def log(self) -> str:
        with open(os.path.join(self.directory, "prometheus.log")) as f:
            return f.read()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the HTTP API

    def api(self, path: str, **params) -> object:
        """The ``data`` of ``/api/v1/<path>``; AssertionError when Prometheus reports an error."""
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> List[dict]:
        """An instant query's result: [{"metric": {...}, "value": [t, "v"]}, ...] (or "values"
        for a range selector: its raw samples)."""
        return self.api("query", query=expr, time=f"{time.time():.3f}")["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> List[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)["result"]

    def alerts(self, name: str) -> Dict[tuple, dict]:
        """The active (pending or firing) alerts named ``name``: {their labels' items: alert}."""
        return {tuple(sorted((k, v) for k, v in a["labels"].items() if k not in ("alertname", "severity"))): a
                for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name}

    def targets_up(self) -> Dict[str, str]:
        """{scrape URL: health} of the active targets."""
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets", state="active")["activeTargets"]}
