"""Structured logs: ``--log-format json`` on coordinatord and groupctl (consume above all), one
JSON object per line with time, level, logger, message and the fields a log call passed;
text stays the default. The formatter is unit-tested; the processes are run for real and every
line they write to stderr must parse."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys

import pytest

from coordinator import protocol
from coordinator.cli import common
from coordinator.cli.common import CliError, JsonFormatter, report, setup_logging
from coordinator.errors import InvalidConfig
from coordinator.testing.zkserver import free_port
from coordinator.topics import TopicRegistry
from tests.support.helpers import GROUPCTL, fill, wait_for

BOUND_S = 60


@pytest.fixture
def restore_logging():
    """setup_logging changes the root logger; put it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    kazoo = logging.getLogger("kazoo").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(kazoo)


def record(message="rebalanced %s", args=("g",), exc_info=None, **extra):
    r = logging.LogRecord("zkgroups.coordinator", logging.INFO, __file__, 1, message, args, exc_info)
    r.__dict__.update(extra)
    return r


class NodeName:
    """A value that is not JSON: written as its str()."""

    def __str__(self):
        return "n1"


def test_every_logger_of_ours_is_under_zkgroups():
    """One prefix to configure: each module's logger is named ``zkgroups.<part>`` (only the
    third-party loggers it configures, kazoo's and py4j's, are named otherwise)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    named, outside = 0, []
    for package in ("coordinator", "consumer"):
        for folder, _dirs, files in os.walk(os.path.join(root, package)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for line, text in enumerate(f, 1):
                        for call in re.findall(r"getLogger\(([^)]*)\)", text):
                            named += 1
                            if call and not re.fullmatch(r'"(zkgroups(\.[a-z_.]+)?|kazoo(\.client)?|py4j)"', call):
                                outside.append(f"{os.path.relpath(path, root)}:{line}: getLogger({call})")
    assert named > 20 and outside == []


def test_a_json_line_has_time_level_logger_message_and_every_extra_field():
    line = json.loads(JsonFormatter().format(record(group="g", generation=7, reason="member joined",
                                                    duration_ms=12.5, moved=["t-0", "t-1"], member=None,
                                                    node=NodeName())))
    assert line.pop("time").endswith("Z")
    assert line == {"level": "info", "logger": "zkgroups.coordinator", "message": "rebalanced g", "group": "g",
                    "generation": 7, "reason": "member joined", "duration_ms": 12.5, "moved": ["t-0", "t-1"],
                    "member": None, "node": "n1"}


def test_time_is_utc_iso_8601_with_milliseconds():
    r = record()
    r.created = 1795532584.123456
    assert json.loads(JsonFormatter().format(r))["time"] == "2026-11-24T15:03:04.123Z"


def test_fields_that_look_like_credentials_are_never_written():
    text = JsonFormatter().format(record(**{"sasl.password": "hunter2", "token": "hunter2",
                                            "kafka": {"sasl.password": "hunter2", "client.id": "c",
                                                      "ssl.key.password": "hunter2"},
                                            "credentials": ["hunter2"], "api_secret": "hunter2"}))
    assert "hunter2" not in text
    line = json.loads(text)
    assert line["kafka"] == {"sasl.password": "[redacted]", "client.id": "c", "ssl.key.password": "[redacted]"}
    assert line["token"] == line["credentials"] == "[redacted]"


def test_a_logged_exception_is_summed_up_and_its_traceback_only_when_asked():
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record(exc_info=exc_info)))
    assert line["error"] == "ValueError: boom" and "traceback" not in line
    line = json.loads(JsonFormatter(tracebacks=True).format(record(exc_info=exc_info)))
    assert "Traceback (most recent call last)" in line["traceback"] and "\n" not in json.dumps(line)


def test_setup_logging_switches_formats_and_report_follows(capsys, restore_logging):
    log = logging.getLogger("zkgroups.test")
    setup_logging(0, "json")
    log.warning("commit refused", extra={"group": "g", "member": "m-1"})
    report("consumed 3 records", "zkgroups.groupctl", group="g", records=3)
    CliError("ZooKeeper at h:1 did not answer within 1s").show()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(l["level"], l["logger"], l["message"]) for l in lines] == [
        ("warning", "zkgroups.test", "commit refused"), ("info", "zkgroups.groupctl", "consumed 3 records"),
        ("error", "zkgroups.cli", "ZooKeeper at h:1 did not answer within 1s")]
    assert lines[0]["group"] == "g" and lines[0]["member"] == "m-1" and lines[1]["records"] == 3

    setup_logging(0, "text")
    log.warning("commit refused", extra={"group": "g"})
    report("consumed 3 records", group="g")
    CliError("bad").show()
    assert capsys.readouterr().err.splitlines() == ["warning: commit refused", "consumed 3 records", "error: bad"]
    with pytest.raises(InvalidConfig, match="log format 'xml' is not one of text, json"):
        setup_logging(0, "xml")


def test_the_documented_fields_are_the_docs():
    with open(common.__file__.replace("coordinator/cli/common.py", "docs/operations/logging.md")) as f:
        page = f.read()
    for name in common.LOG_FIELDS:
        assert f"`{name}`" in page, name


def json_lines(text: str):
    """Every line of ``text`` parsed as a JSON log line (fails on any other line)."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    return lines


def test_coordinatord_logs_json_lines(zk, zk_connect, tmp_path, subprocess_env):
    log_path = tmp_path / "node.log"
    with open(log_path, "w") as log:
        node = subprocess.Popen([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", zk_connect,
                                 "--node-id", "n1", "--log-format", "json", "--session-timeout-ms", "2000"],
                                env=subprocess_env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: zk.exists(protocol.LEADER), 20, message="n1 leads")
        TopicRegistry(zk).create("t", 2)
        node.send_signal(signal.SIGTERM)
        assert node.wait(20) == 0
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    lines = json_lines(log_path.read_text())
    started = [line for line in lines if line["message"].startswith("node n1 started")]
    assert started and started[0]["node"] == "n1" and started[0]["zk"] == zk_connect
    assert all(line["level"] in ("debug", "info", "warning", "error", "critical") for line in lines)
    assert len(lines) >= 2, lines  # started, and the coordinator's own lines (election, leaving)

    # the environment chooses it too, and a failure is a JSON line as well
    env = dict(subprocess_env, ZKGROUPS_LOG_FORMAT="json")
    dead = f"127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "consumer.cli.coordinatord", "--zk", dead, "--zk-timeout", "0.5"],
                          env=env, capture_output=True, text=True, timeout=BOUND_S)
    assert proc.returncode == 75
    (line,) = json_lines(proc.stderr)
    assert line["level"] == "error" and line["message"] == f"ZooKeeper at {dead} did not answer within 0.5s"


@pytest.mark.parametrize("where", ["global", "consume"])
def test_groupctl_consume_logs_json_lines(cluster, zk, zk_connect, data_dir, subprocess_env, where):
    cluster.node("n")
    fill(data_dir, "t", [4, 4], zk=zk)
    base = [*GROUPCTL, "--zk", zk_connect, "--data-dir", data_dir, "-v"]
    option = ["--log-format", "json"]
    args = [*base, *option, "consume", "g", "t", "--max-records", "8"] if where == "global" else \
        [*base, "consume", "g", "t", "--max-records", "8", *option]
    proc = subprocess.run(args, env=subprocess_env, capture_output=True, text=True, timeout=BOUND_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 8
    lines = json_lines(proc.stderr)  # -v: the consumer library's info lines too, every one JSON
    assert lines[-1]["message"] == "consumed 8 records"
    assert lines[-1]["records"] == 8 and lines[-1]["group"] == "g" and lines[-1]["level"] == "info"
    assert any(line["level"] == "info" and line["logger"] != "zkgroups.groupctl" for line in lines), lines


def test_groupctl_errors_are_json_lines_in_json_mode(subprocess_env):
    dead = f"127.0.0.1:{free_port()}"
    proc = subprocess.run([*GROUPCTL, "--log-format", "json", "--zk", dead, "--zk-timeout", "0.5", "groups",
                           "list"], env=subprocess_env, capture_output=True, text=True, timeout=BOUND_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 75
    (line,) = json_lines(proc.stderr)
    assert line["level"] == "error" and "did not answer within 0.5s" in line["message"]
