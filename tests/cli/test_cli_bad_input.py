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

from coordinator.testing.zkserver import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = {name: os.path.join(ROOT, "bin", name) for name in ("groupctl", "coordinatord", "pipeline")}
BOUND_S = 30

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

# (tool, arguments, what the line must say). Cases that do not give --zk get --zk {dead}
# --zk-timeout 1 first; the data directory is {tmp}/data (ZKGROUPS_DATA_DIR).
CASES = [
    # -- connect strings (every tool, and the environment)
    ("groupctl", "--zk 127.0.0.1:notaport topics list", "port 'notaport'"),
    ("groupctl", "--zk '' topics list", "it is empty"),
    ("groupctl", "--zk 127.0.0.1:2181/bad//chroot topics list", "empty component"),
    ("groupctl", "--zk :2181 topics list", "has no host"),
    ("groupctl", "--zk host:0 topics list", "port '0'"),
    ("groupctl", "--zk host:70000 topics list", "port '70000'"),
    ("groupctl", "--zk 'a:1,,b:2' topics list", "empty host entry"),
    ("groupctl", "--zk host topics list", "has no port"),
    ("groupctl", "--zk host:2181/app/ topics list", "ends with '/'"),
    ("groupctl", "--zk host:2181/a/../b topics list", "'..' component"),
    ("groupctl", "--zk host:2181/zookeeper/x topics list", "reserves"),
    ("groupctl", "--zk 'host name:2181' topics list", "not a host name"),
    ("coordinatord", "--zk 127.0.0.1:notaport", "port 'notaport'"),
    ("coordinatord", "--zk ''", "it is empty"),
    ("coordinatord", "--zk 127.0.0.1:2181/bad//chroot", "empty component"),
    ("coordinatord", "--zk :2181", "has no host"),
    ("coordinatord", "--zk host:0", "port '0'"),
    ("coordinatord", "--zk host:70000", "port '70000'"),
    ("coordinatord", "--zk 'a:1,,b:2'", "empty host entry"),
    # -- the node's HTTP server (checked before ZooKeeper is contacted)
    ("coordinatord", "--zk {dead} --http-addr host:99999", "port must be a number"),
    ("coordinatord", "--zk {dead} --http-addr '[::1]9464'", "IPv6"),
    ("coordinatord", "--zk {dead} --http-addr :0 --metrics-port 0", "not both"),
    ("coordinatord", "--zk {dead} --http-addr :0 --http-tls-cert {tmp}/c.pem", "needs both"),
    ("coordinatord", "--zk {dead} --http-addr :0 --http-tls-cert {tmp}/c.pem --http-tls-key {tmp}/k.pem",
     "does not exist"),
    ("coordinatord", "--zk {dead} --http-allowed-host proxy.example", "need --http-addr"),
    ("coordinatord", "--zk {dead} --http-addr :0 --lag-interval 0", "--lag-interval"),
    ("pipeline", "--zk :2181 --topic t --out {tmp}/out", "has no host"),
    ("pipeline", "--zk 'a:1,,b:2' --topic t --out {tmp}/out", "empty host entry"),
    ("pipeline", "--zk h:1/x/ --topic t --out {tmp}/out", "ends with '/'"),
    # -- ZooKeeper not answering: bounded by the timeout
    ("groupctl", "--zk {dead} --zk-timeout 0.5 topics list", "did not answer within 0.5s"),
    ("groupctl", "--zk {dead}/app --zk-timeout 0.5 topics list", "did not answer within 0.5s"),
    ("coordinatord", "--zk {dead} --zk-timeout 0.5", "did not answer within 0.5s"),
    ("coordinatord", "--zk {dead}/app --zk-timeout 0.5 --session-timeout-ms 1000", "did not answer within 0.5s"),
    ("pipeline", "--zk {dead} --zk-timeout 0.5 --data-dir {tmp} --topic t --out {tmp}/out",
     "did not answer within 0.5s"),
    # -- durations
    ("groupctl", "--zk-timeout 0 topics list", "--zk-timeout"),
    ("groupctl", "--zk-timeout -1 topics list", "--zk-timeout"),
    ("groupctl", "--zk-timeout nan topics list", "not a finite number"),
    ("groupctl", "--zk-timeout inf topics list", "--zk-timeout"),
    ("groupctl", "--zk-timeout 1e300 topics list", "--zk-timeout"),
    ("coordinatord", "--zk-timeout nan", "not a finite number"),
    ("coordinatord", "--zk-timeout 0", "--zk-timeout"),
    ("pipeline", "--topic t --out {tmp}/out --duration nan", "not a finite number"),
    ("pipeline", "--topic t --out {tmp}/out --zk-timeout -2", "--zk-timeout"),
    # -- numbers, range-checked before anything is allocated
    ("groupctl", "topics create t --partitions 1000000000", "the most partitions a topic may have (10,000)"),
    ("groupctl", "topics create t --partitions 10001", "the most partitions a topic may have (10,000)"),
    ("groupctl", "topics create t --partitions 0", "0 is not in the range x>=1"),
    ("groupctl", "topics create t --partitions -1", "-1 is not in the range x>=1"),
    ("groupctl", "topics create t --partitions many", "not a valid integer"),
    ("groupctl", "topics add-partitions t --to 1000000000", "the most partitions a topic may have"),
    ("groupctl", "topics add-partitions t --to 10001", "the most partitions a topic may have"),
    ("groupctl", "topics add-partitions t --to 0", "0 is not in the range x>=1"),
    ("groupctl", "produce t --generate 1 --size 100GB", "'100GB' is not a valid integer"),
    ("groupctl", "produce t --generate 1 --size 100000000000", "the largest record value (1,048,576)"),
    ("groupctl", "produce t --generate 1 --size 1048577", "the largest record value (1,048,576)"),
    ("groupctl", "produce t --generate 1 --size 0", "0 is not in the range x>=1"),
    ("groupctl", "produce t --generate 0", "0 is not in the range x>=1"),
    ("groupctl", "produce t --generate -5", "-5 is not in the range x>=1"),
    ("groupctl", "produce t --partition -1", "-1 is not in the range x>=0"),
    ("groupctl", "produce t --partition 10000", "the highest partition there can be"),
    ("groupctl", "consume g t --max-records 0", "0 is not in the range x>=1"),
    ("groupctl", "consume g t --max-records -3", "-3 is not in the range x>=1"),
    ("groupctl", "consume g t --idle-exit 0", "--idle-exit"),
    ("groupctl", "consume g t --idle-exit -1", "--idle-exit"),
    ("groupctl", "consume g t --idle-exit nan", "not a finite number"),
    ("groupctl", "consume g t --session-timeout-ms 10", "10 is not in the range x>=100"),
    ("groupctl", "consume g t --session-timeout-ms 99999999999", "largest session timeout"),
    ("groupctl", "groups reset-offsets g --topic t --to-offset -1", "-1 is not in the range x>=0"),
    ("groupctl", "groups reset-offsets g --topic t --to-datetime yesterday", "is not ISO 8601"),
    ("groupctl", "groups reset-offsets g --topic t --to-datetime 2026-13-45", "is not ISO 8601"),
    ("groupctl", "groups reset-offsets g --topic t --by-duration 1h", "is not an ISO-8601 duration"),
    ("groupctl", "groups reset-offsets g --topic t --by-duration -PT1H", "is not an ISO-8601 duration"),
    ("groupctl", "groups reset-offsets g --topic t:1,x --to-latest", "partitions are numbers from 0 to 9999"),
    ("groupctl", "groups reset-offsets g --topic t:10000 --to-latest", "partitions are numbers from 0 to 9999"),
    ("groupctl", "groups reset-offsets g --topic t --shift-by 1 --to-current", "give exactly one of"),
    ("groupctl", "groups reset-offsets g --to-latest", "Missing option '--topic'"),
    ("groupctl", "groups reset-offsets g --from-file {tmp}/missing.csv", "No such file or directory"),
    ("groupctl", "groups reset-offsets g --from-file {not_utf8}", "not UTF-8"),
    ("groupctl", "groups reset-offsets g --from-file {not_toml}", "expected topic,partition,offset"),
    ("groupctl", "groups describe g --output yaml", "'yaml' is not one of 'table', 'json'"),
    ("groupctl", "groups describe g --members --state", "give at most one of --offsets, --members, --state"),
    ("groupctl", "--log-format xml topics list", "'xml' is not one of 'text', 'json'"),
    ("groupctl", "consume g t --log-format xml", "'xml' is not one of 'text', 'json'"),
    ("coordinatord", "--log-format xml", "'xml' is not one of 'text', 'json'"),
    ("coordinatord", "--session-timeout-ms 99999999999", "session_timeout_ms must be at most"),
    ("coordinatord", "--session-timeout-ms 0", "session_timeout_ms must be > 0"),
    ("coordinatord", "--session-timeout-ms soon", "not a valid integer"),
    ("coordinatord", "--max-rebalance-retries -1", "must be >= 0"),
    ("coordinatord", "--max-rebalance-retries 1000", "max_rebalance_retries must be at most 100"),
    ("coordinatord", "--rebalance-timeout-ms -5", "rebalance_timeout_ms must be > 0"),
    ("pipeline", "--topic t --out {tmp}/out --workers 0", "0 is not in the range x>=1"),
    ("pipeline", "--topic t --out {tmp}/out --workers 100000", "the most partitions a topic may have"),
    ("pipeline", "--topic t --out {tmp}/out --batch-size 0", "0 is not in the range x>=1"),
    ("pipeline", "--topic t --out {tmp}/out --session-timeout-ms 0", "0 is not in the range x>=1"),
    ("pipeline", "--topic t --out {tmp}/out --session-timeout-ms 99999999999", "largest session timeout"),
    # -- names, checked before any path is built (and before connecting)
    ("groupctl", "topics describe ../../etc", "topic name '../../etc' is illegal"),
    ("groupctl", "topics create ../x", "topic name '../x' is illegal"),
    ("groupctl", "topics create 'bad name'", "is illegal"),
    ("groupctl", "topics create " + "x" * 250, "longer than 249"),
    ("groupctl", "topics create ..", "cannot be '..'"),
    ("groupctl", "topics add-partitions ../x --to 2", "topic name '../x' is illegal"),
    ("groupctl", "produce ../x", "topic name '../x' is illegal"),
    ("groupctl", "groups describe ../x", "group name '../x' is illegal"),
    ("groupctl", "groups delete ../x", "group name '../x' is illegal"),
    ("groupctl", "groups reset-offsets ../x --topic t --to-earliest", "group name '../x' is illegal"),
    ("groupctl", "groups reset-offsets g --topic ../x --to-earliest", "topic name '../x' is illegal"),
    ("groupctl", "consume ../x t", "group name '../x' is illegal"),
    ("groupctl", "consume g ../x", "topic name '../x' is illegal"),
    ("groupctl", "consume g t --consumer-id ../x", "consumer id name '../x' is illegal"),
    ("groupctl", "consume g --pattern '('", "is not a regular expression"),
    ("pipeline", "--topic ../x --out {tmp}/out", "topic name '../x' is illegal"),
    ("pipeline", "--group 'bad name' --topic t --out {tmp}/out", "group name 'bad name' is illegal"),
    # -- configuration files
    ("groupctl", "consume g t --config {config_dir}", "is a directory"),
    ("groupctl", "consume g t --config {unreadable}", "is not readable"),
    ("groupctl", "consume g t --config {tmp}/missing.toml", "does not exist"),
    ("groupctl", "consume g t --config {not_a_table}", "[consumer] must be a table"),
    ("groupctl", "consume g t --config {zk_number}", "zk must be a string, got 5"),
    ("groupctl", "consume g t --config {zk_bad}", "zk: bad ZooKeeper connect string"),
    ("groupctl", "consume g t --config {data_dir_number}", "data_dir must be a string, got 7"),
    ("groupctl", "consume g t --config {wrong_type}", "max_poll_records must be int"),
    ("groupctl", "consume g t --config {unknown_key}", "unknown key 'max_pol_records'"),
    ("groupctl", "consume g t --config {huge_session}", "session_timeout_ms must be at most"),
    ("groupctl", "consume g t --config {not_toml}", "is not valid TOML"),
    ("groupctl", "consume g t --config {not_utf8}", "not UTF-8"),
    ("groupctl", "consume g t --config /dev/zero", "is larger than"),
    ("coordinatord", "--config {config_dir}", "is a directory"),
    ("coordinatord", "--config {unreadable}", "is not readable"),
    ("coordinatord", "--config {tmp}/missing.toml", "does not exist"),
    ("coordinatord", "--config {not_a_table}", "[coordinator] must be a table"),
    ("coordinatord", "--config {zk_number}", "zk must be a string, got 5"),
    ("coordinatord", "--config {zk_bad}", "zk: bad ZooKeeper connect string"),
    ("coordinatord", "--config {node_id_number}", "node_id must be a string, got 12"),
    ("coordinatord", "--config {wrong_type}", "session_timeout_ms must be int, got 'long'"),
    ("coordinatord", "--config {unknown_key}", "unknown key 'rebalance_timout_ms'"),
    ("coordinatord", "--config {zk_timeout_negative}", "zk_timeout must be > 0"),
    ("coordinatord", "--config {wait_for_zk_text}", "wait_for_zk must be true or false"),
    ("coordinatord", "--config {too_many_threads}", "handler_threads must be at most 64"),
    ("coordinatord", "--config {nan_ratio}", "must be a finite number"),
    ("coordinatord", "--config {not_toml}", "is not valid TOML"),
    ("coordinatord", "--config /dev/zero", "is larger than"),
    # -- usage: one line and a pointer to --help
    ("groupctl", "topics frobnicate", "No such command 'frobnicate'"),
    ("groupctl", "--bogus topics list", "No such option"),
    ("groupctl", "consume", "Missing argument 'GROUP'"),
    ("groupctl", "produce t --generate 3 --key-separator :", "cannot be combined"),
    ("groupctl", "produce t -f {config_dir}", "Is a directory"),
    ("coordinatord", "--bogus", "No such option"),
    ("coordinatord", "--log-level LOUD", "'LOUD' is not one of"),
    ("coordinatord", "extra", "unexpected extra argument"),
    ("pipeline", "--out {tmp}/out", "Missing option '--topic'"),
    ("pipeline", "--topic t --out {tmp}/out --conf foo", "--conf 'foo' is not KEY=VALUE"),
    ("pipeline", "--topic t --out {tmp}/out --conf spark.speculation=true", "spark.speculation"),
    ("pipeline", "--topic t --out {tmp}/out --mode sideways", "'sideways' is not one of"),
    ("pipeline", "--topic t --out {tmp}/out --data-dir {tmp}/missing", "does not exist"),
]


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
