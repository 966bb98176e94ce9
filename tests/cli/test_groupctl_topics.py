"""groupctl: topic administration and produce, happy paths and one-line errors; CLI helpers."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from consumer.hashing import partition_for_key
from consumer.log import Log
from coordinator import config
from coordinator.cli.common import print_table
from consumer.cli.groupctl import MAX_VALUE_BYTES, main
from coordinator.errors import EXIT_RETRIABLE, InvalidConfig
from coordinator.topics import TopicRegistry
from coordinator.testing.zkserver import free_port
from tests.support.helpers import assert_failed, assert_one_line_error, ok

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUPCTL = os.path.join(ROOT, "bin", "groupctl")


def all_records(data_dir: str, topic: str, partitions: int):
    with Log(data_dir) as log:
        return {p: log.fetch(topic, p, 0, max_records=100_000) for p in range(partitions)}


# ---------------------------------------------------------------- happy paths

def test_create_list_describe_add_partitions(groupctl):
    assert ok(groupctl("topics", "create", "orders", "--partitions", "3")) == "created topic orders with 3 partitions\n"
    ok(groupctl("topics", "create", "clicks"))
    listing = ok(groupctl("topics", "list")).splitlines()
    assert listing[0].split() == ["TOPIC", "PARTITIONS"]
    assert [line.split() for line in listing[1:]] == [["clicks", "1"], ["orders", "3"]]

    assert "now has 5 partitions (was 3)" in ok(groupctl("topics", "add-partitions", "orders", "--to", "5"))
    assert "already has 5" in ok(groupctl("topics", "add-partitions", "orders", "--to", "5"))
    described = ok(groupctl("topics", "describe", "orders")).splitlines()
    assert described[0].startswith("topic orders: 5 partitions")
    assert described[1].split() == ["PARTITION", "EARLIEST", "LATEST", "RECORDS", "BYTES"]
    assert [line.split() for line in described[2:]] == [[str(p), "0", "0", "0", "0"] for p in range(5)]

    assert "already exists with 1 partitions" in ok(groupctl("topics", "create", "clicks", "--if-not-exists"))


def test_produce_lines_from_stdin_then_describe(groupctl, data_dir):
    ok(groupctl("topics", "create", "t", "--partitions", "2"))
    out = ok(groupctl("produce", "t", input="alpha\nbeta\r\n\ngamma"))
    assert out.startswith("produced 4 records to t in ") and "records/s" in out
    values = sorted(r.value for records in all_records(data_dir, "t", 2).values() for r in records)
    assert values == [b"", b"alpha", b"beta", b"gamma"]
    rows = [line.split() for line in ok(groupctl("topics", "describe", "t")).splitlines()[2:]]
    assert sum(int(row[3]) for row in rows) == 4 and all(int(row[4].replace(",", "")) > 0 for row in rows)


def test_produce_keys_pick_partitions_like_kafka(groupctl, data_dir, tmp_path):
    ok(groupctl("topics", "create", "t", "--partitions", "4"))
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"user-%d:event-%d\n" % (i % 7, i) for i in range(50)))
    assert "produced 50 records" in ok(groupctl("produce", "t", "-f", str(lines), "--key-separator", ":"))
    ok(groupctl("produce", "t", "--key", "fixed", input="one\ntwo\n"))
    records = all_records(data_dir, "t", 4)
    for partition, recs in records.items():
        for r in recs:
            assert partition_for_key(r.key, 4) == partition
    keyed = [r for recs in records.values() for r in recs if r.key.startswith(b"user-")]
    assert sorted(int(r.value.split(b"-")[1]) for r in keyed) == list(range(50))
    assert [r.value for r in records[partition_for_key(b"fixed", 4)] if r.key == b"fixed"] == [b"one", b"two"]


def test_produce_generate(groupctl, data_dir):
    ok(groupctl("topics", "create", "load", "--partitions", "3"))
    out = ok(groupctl("produce", "load", "--generate", "2000", "--size", "50"))
    assert out.startswith("produced 2,000 records to load")
    records = [r for recs in all_records(data_dir, "load", 3).values() for r in recs]
    assert len(records) == 2000 and {len(r.value) for r in records} == {50}
    assert sorted(int(r.value) for r in records) == list(range(2000))
    ok(groupctl("produce", "load", "--generate", "5", "--partition", "2"))
    assert len(all_records(data_dir, "load", 3)[2]) > 5


def test_describe_warns_once_when_a_topic_has_no_data_under_the_data_dir(groupctl, zk, zk_connect, data_dir, tmp_path):
    ok(groupctl("topics", "create", "t", "--partitions", "3"))  # makes its partition directories
    fresh = groupctl("topics", "describe", "t")
    assert ok(fresh) and fresh.stderr == "", "no records yet, but its data is here: no warning"

    TopicRegistry(zk).create("away", 2)  # registered by a producer that writes somewhere else
    away = groupctl("topics", "describe", "away")
    assert [line.split() for line in ok(away).splitlines()[2:]] == [[str(p), "0", "0", "0", "0"] for p in (0, 1)]
    assert away.stderr.splitlines() == [f"warning: topic away has no data under {data_dir} (is --data-dir right?)"]

    other = str(tmp_path / "elsewhere")  # a wrong --data-dir
    wrong = CliRunner().invoke(main, ["--zk", zk_connect, "--data-dir", other, "topics", "describe", "t"])
    assert wrong.exit_code == 0
    assert wrong.stderr.splitlines() == [f"warning: topic t has no data under {other} (is --data-dir right?)"]


def test_add_partitions_makes_the_new_partition_directories(groupctl, data_dir):
    ok(groupctl("topics", "create", "t", "--partitions", "2"))
    ok(groupctl("topics", "add-partitions", "t", "--to", "4"))
    assert sorted(os.listdir(data_dir)) == ["t-0", "t-1", "t-2", "t-3"]


def test_a_line_longer_than_the_largest_value_is_one_line(groupctl, tmp_path):
    ok(groupctl("topics", "create", "t"))
    big = tmp_path / "big.txt"
    big.write_bytes(b"ok\n" + b"x" * (MAX_VALUE_BYTES + 1) + b"\n")
    assert_failed(groupctl("produce", "t", "-f", str(big)), f"line 2 is longer than {MAX_VALUE_BYTES:,} bytes")
    exact = tmp_path / "exact.txt"
    exact.write_bytes(b"y" * MAX_VALUE_BYTES + b"\r\n")
    assert "produced 1 records" in ok(groupctl("produce", "t", "-f", str(exact)))


# ---------------------------------------------------------------- errors: one line, no traceback

def test_zookeeper_unreachable_is_one_line(tmp_path, subprocess_env):
    env = dict(subprocess_env, ZKGROUPS_ZK_TIMEOUT="0.5", ZKGROUPS_DATA_DIR=str(tmp_path))
    dead = f"127.0.0.1:{free_port()}"
    for args in (["--zk", dead, "topics", "list"], ["--zk", dead + "/app", "topics", "create", "x"]):
        proc = subprocess.run([GROUPCTL, *args], env=env, capture_output=True, text=True, timeout=30)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "did not answer within 0.5s")
        assert proc.returncode == EXIT_RETRIABLE  # ZooKeeper unreachable: try again later


@pytest.mark.parametrize("args, match, code", [
    (["topics", "create", "bad name"], "illegal", 1),
    (["topics", "create", "x" * 250], "longer than 249", 1),
    (["topics", "create", "t", "--partitions", "0"], "0 is not in the range x>=1", 2),
    (["topics", "describe", "nope"], "topic 'nope' does not exist", 1),
    (["topics", "add-partitions", "nope", "--to", "3"], "topic 'nope' does not exist", 1),
    (["produce", "nope"], "topic 'nope' does not exist", 1),
    (["topics", "create"], "Missing argument 'NAME'", 2),
    (["topics", "frobnicate"], "No such command 'frobnicate'", 2),
    (["produce", "t", "--generate", "3", "--key-separator", ":"], "cannot be combined", 2),
    (["produce", "t", "-f", "/does/not/exist"], "/does/not/exist", 2),
])
def test_errors_are_one_line(groupctl, args, match, code):
    assert_failed(groupctl(*args), match, code)


def test_existing_topic_and_shrinking_are_errors(groupctl):
    ok(groupctl("topics", "create", "t", "--partitions", "3"))
    assert_failed(groupctl("topics", "create", "t"), "topic 't' already exists")
    assert_failed(groupctl("topics", "add-partitions", "t", "--to", "2"), "cannot be removed")
    assert_failed(groupctl("produce", "t", "--key-separator", "=", input="k=v\nno separator\n"),
                  "line 2 has no key separator '='")


def test_corrupt_topic_znode(groupctl, zk):
    ok(groupctl("topics", "create", "good"))
    zk.create("/brokers/topics/bad", b"not json")
    assert_failed(groupctl("topics", "describe", "bad"), "/brokers/topics/bad: topic registration is not JSON")
    assert_failed(groupctl("produce", "bad", input="x\n"), "/brokers/topics/bad")
    listing = groupctl("topics", "list")  # still lists the others, and says what is wrong
    assert listing.exit_code == 0
    assert [line.split() for line in listing.stdout.splitlines()[1:]] == [["bad", "?"], ["good", "1"]]
    assert listing.stderr.startswith("warning: /brokers/topics/bad")


def test_bin_groupctl_runs_the_module(zk_connect, tmp_path, subprocess_env):
    env = dict(subprocess_env, ZK_CONNECT=zk_connect, ZKGROUPS_DATA_DIR=str(tmp_path))
    run = lambda *args, **kw: subprocess.run([GROUPCTL, *args], env=env, capture_output=True, text=True,
                                             timeout=60, **kw)
    assert run("topics", "create", "t", "-p", "2").returncode == 0
    proc = run("produce", "t", input="a\nb\n")
    assert proc.returncode == 0 and "produced 2 records" in proc.stdout, proc.stderr
    assert "TOPIC" in run("topics", "list").stdout


# ---------------------------------------------------------------- shared CLI helpers

@dataclass
class Sample:
    name: str = "default"
    retries: int = 3
    ratio: float = 0.5


def load_config(path, cls, table="", overrides=None):
    """A config file's table, command-line overrides on top, built and checked."""
    values = dict(config.load_toml(path, table))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return config.build(cls, values, source=path)


def test_config_files_are_read_by_section_and_unknown_keys_rejected(tmp_path):
    path = tmp_path / "tool.toml"
    path.write_text('[tool]\nname = "from-file"\nretries = 5\nratio = 1\n')
    assert load_config(str(path), Sample, "tool") == Sample("from-file", 5, 1.0)
    assert load_config(str(path), Sample, "tool", {"retries": 9, "name": None}) == Sample("from-file", 9, 1.0)
    for text, match in (('[tool]\nretrys = 5\n', "unknown key 'retrys'"),
                        ('[tool]\nretries = "five"\n', "retries must be int"),
                        ('[tool\n', "not valid TOML")):
        path.write_text(text)
        with pytest.raises(InvalidConfig, match=match):
            load_config(str(path), Sample, "tool")
    with pytest.raises(InvalidConfig, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"), Sample)


def test_print_table_aligns_columns(capsys):
    print_table(("NAME", "COUNT"), [("a", 5), ("longer", 12345)])
    assert capsys.readouterr().out.splitlines() == ["NAME     COUNT", "a            5", "longer  12,345"]
