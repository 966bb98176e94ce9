"""Bad input to the tools, tried from outside: every case runs ``bin/groupctl``,
``bin/coordinatord`` or ``bin/pipeline`` as a real process and must end with a non-zero exit
status and exactly one line on stderr, ``error: ...`` (saying what is wrong), no traceback,
within a bound.

Most cases need no ZooKeeper: the tools check input before they connect. ``{dead}`` is a
loopback port nobody listens on, so a tool that connected first would fail differently (or
after its timeout). The cases that need a real server (an unreachable chroot) are at the end.
"""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from coordinator.config import tomllib
from coordinator.testing.zkserver import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = {name: os.path.join(ROOT, "bin", name) for name in ("groupctl", "coordinatord", "pipeline")}
BOUND_S = 30
CASES_FILE = os.path.join(ROOT, "docs", "_ext", "bad_input_cases.toml")


def bad_input_cases():
    with open(CASES_FILE, "rb") as f:
        return tomllib.load(f)["cases"]

# Files a case can name as {name}: written as <name>.toml into the test's directory.
FILES = {
    "not_a_table": "consumer = 5\ncoordinator = 5\n",
    "zk_number": "zk = 5\n",
    "zk_bad": 'zk = "127.0.0.1:notaport"\n',
    "data_dir_number": "[consumer]\ndata_dir = 7\n",
    "node_id_number": "node_id = 12\n",
    "wrong_type": '[consumer]\nmax_poll_records = "many"\n[coordinator]\nsession_timeout_ms = "long"\n',
    "unknown_key": "[consumer]\nmax_pol_records = 5\n[coordinator]\nrebalance_timout_ms = 5\n",
    "zk_timeout_negative": "zk_timeout = -1\n",
    "wait_for_zk_text": 'wait_for_zk = "yes"\n',
    "too_many_threads": "handler_threads = 100000\n",
    "nan_ratio": "suspend_grace_ratio = nan\n",
    "huge_session": "[consumer]\nsession_timeout_ms = 99999999999999\n",
    "not_toml": "this is = = not toml\n",
    "not_utf8": b"\xff\xfe\x00",
    "unreadable": "[consumer]\n",       # chmod 000 below (skipped as root: root reads anything)
}
DIRECTORY = "config_dir"  # {config_dir}: a directory where a file is expected

#: (tool, arguments, what the line must say): docs/_ext/bad_input_cases.toml, which the
#: troubleshooting page shows as a table (the docs build imports nothing of the tests).
CASES = [tuple(case) for case in bad_input_cases()]


def run_tool(tool: str, args, env, timeout: float = BOUND_S) -> subprocess.CompletedProcess:
    return subprocess.run([TOOLS[tool], *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def assert_one_error_line(proc: subprocess.CompletedProcess, match: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert match in lines[0], lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The case files, written once: {name} in a case is the path of FILES[name]'s file."""
    d = tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        path = d / f"{name}.toml"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    (d / DIRECTORY).mkdir()
    os.chmod(d / "unreadable.toml", 0)
    return d


@pytest.fixture
def env(subprocess_env, workdir):
    env = dict(subprocess_env)
    for name in ("ZK_CONNECT", "ZKGROUPS_DATA_DIR", "ZKGROUPS_ZK_TIMEOUT"):
        env.pop(name, None)
    env["ZKGROUPS_DATA_DIR"] = str(workdir / "data")
    return env


def expand(args: str, workdir) -> list:
    dead = f"127.0.0.1:{free_port()}"
    fields = {"dead": dead, "tmp": str(workdir), "config_dir": str(workdir / DIRECTORY),
              **{name: str(workdir / f"{name}.toml") for name in FILES}}
    argv = [a.format(**fields) for a in shlex.split(args)]
    return argv if "--zk" in argv else ["--zk", dead, "--zk-timeout", "1", *argv]


@pytest.mark.parametrize("tool, args, match", CASES, ids=[f"{t} {a}"[:80] for t, a, _ in CASES])
def test_bad_input_is_one_line(tool, args, match, workdir, env):
    if "{unreadable}" in args and os.geteuid() == 0:
        pytest.skip("root reads unreadable files")
    assert_one_error_line(run_tool(tool, expand(args, workdir), env), match)


@pytest.mark.parametrize("tool, args", [("groupctl", ["topics", "list"]), ("coordinatord", []),
                                        ("pipeline", ["--topic", "t", "--out", "out"])])
def test_a_bad_connect_string_in_the_environment_is_one_line(tool, args, env, tmp_path):
    env = dict(env, ZK_CONNECT="127.0.0.1:notaport")
    assert_one_error_line(run_tool(tool, args, env), "port 'notaport'")


# ---------------------------------------------------------------- with a real ZooKeeper

@pytest.mark.parametrize("tool, args", [("groupctl", ["topics", "list"]),
                                        ("coordinatord", ["--zk-timeout", "5"])])
def test_a_chroot_that_cannot_be_created_is_one_line(tool, args, zk, zk_connect, env):
    """Under an ephemeral znode nothing can be created: the chroot fails, with one line."""
    zk.create("/eph", ephemeral=True)
    hosts, chroot = zk_connect.split("/", 1)
    connect = f"{hosts}/{chroot}/eph/app"
    assert_one_error_line(run_tool(tool, ["--zk", connect, *args], env),
                          f"cannot create the chroot /{chroot}/eph/app")
