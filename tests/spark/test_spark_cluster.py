"""``spark-submit`` on a Spark standalone cluster: a master and two workers started from the
pyspark wheel's ``spark-class``, each a host of its own (a network namespace, an address and a
scratch directory: tests/support/sparkcluster.py), ZooKeeper and librdkafka's mock Kafka
cluster in namespaces of their own, the driver in this host's namespace. One cluster for the
module.

The round in ``bin/test``: the pipeline submitted with ``--master spark://…`` runs its
executors on the workers and reports that master, with the JSON summary alone on stdout; the
master given with ``--conf spark.master=…`` or in ``spark-defaults.conf`` is the driver's too.
The fault round (``slow``, and only when ``-m`` selects ``slow``: ~8 min here, by hand with
``pytest -m slow tests/spark/test_spark_cluster.py``): a worker host SIGKILLed, a worker host cut from ZooKeeper, the
driver killed and submitted again, the embedded log on the cluster and a ``run_group_job``
job; the output stays exactly once.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
if shutil.which("java") is None:
    pytest.skip("pyspark needs a Java runtime", allow_module_level=True)

from coordinator import protocol  # noqa: E402
from coordinator.coordinator import Coordinator, CoordinatorConfig  # noqa: E402
from coordinator.zkclient import close_client, start_client  # noqa: E402
from tests.spark.test_spark import read_output  # noqa: E402
from tests.spark.test_spark_kafka import Writer  # noqa: E402
from tests.support import helpers  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402
from tests.support.sparkcluster import PIPELINE_APP, ROOT, SparkTestbed  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.zk, pytest.mark.timeout(300)]

SUBMIT_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    # every test's tmp_path is on the disk the hosts share; /tmp is each host's own
    with SparkTestbed(str(tmp_path_factory.mktemp("spark-cluster")), workers=2, cores=2,
                      shared=[str(tmp_path_factory.getbasetemp())]) as testbed:
        yield testbed


def chroot_name(request) -> str:
    """This test's own (a parametrized test's cases too: names cut short would clash)."""
    return f"{re.sub(r'[^a-zA-Z0-9_-]', '_', request.node.name)[:40]}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def chroot(bed, request):
    """A ZooKeeper chroot of this test's own on the cluster's ZooKeeper, with a coordinator
    mirroring the Kafka mock's topics into it."""
    connect = f"{bed.zk_connect}/{chroot_name(request)}"
    node = coordinator_in(connect, bootstrap_servers=bed.bootstrap_servers)
    yield connect
    node.close()


def kafka_topic(bed, name: str, partitions: int, per_partition: int) -> Writer:
    bed.kafka.create_topic(name, partitions)
    writer = Writer(bed.bootstrap_servers, name, partitions)
    for _ in range(per_partition // 10000):  # within the producer's queue (100,000 records)
        writer.write(10000)
    writer.write(per_partition % 10000)
    return writer


def pipeline_args(bed, zk: str, topic: str, out, *more: str, workers: int = 2):
    return ["--zk", zk, "--bootstrap-servers", bed.bootstrap_servers, "--topic", topic, "--out", str(out),
            "--workers", str(workers), "--batch-size", "2000", "--json", *more]


def submit(bed, argv, **kw):
    return subprocess.run(argv, env=kw.pop("env", None) or bed.submit_env(), capture_output=True, text=True,
                          timeout=SUBMIT_TIMEOUT_S, **kw)


def assert_exactly_once(out, writer: Writer) -> None:
    offsets, _ = read_output(str(out / "records"))
    missing, duplicate = writer.expected() - set(offsets), [k for k, n in offsets.items() if n > 1]
    assert (len(missing), len(duplicate)) == (0, 0) and set(offsets) == writer.expected()


# ---------------------------------------------------------------- the round in bin/test

def test_spark_submit_runs_the_pipeline_on_the_standalone_master(bed, chroot, tmp_path):
    writer = kafka_topic(bed, "orders", 4, 5000)
    out = tmp_path / "out"
    proc = submit(bed, bed.submit_argv(PIPELINE_APP, *pipeline_args(bed, chroot, "orders", out,
                                                                     "--progress-interval", "0.5")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # the summary alone: every log line went to stderr
    summary = report["summary"]
    assert summary["master"] == bed.spark.url
    ran = bed.spark.executor_dirs(summary["app_id"])
    assert all(ran[name] for name in bed.worker_names), ran  # executors on both worker hosts
    assert "zkgroups.spark.progress" in proc.stderr
    if bed.net is not None:  # each worker host's /tmp is its own: its scratch's tmp, not this host's
        here = os.stat("/tmp")
        for daemon in bed.spark.workers:
            seen = os.stat(f"/proc/{daemon.proc.pid}/root/tmp")  # /tmp as the worker's mount namespace has it
            own = os.stat(os.path.join(daemon.host.scratch, "tmp"))
            assert (seen.st_dev, seen.st_ino) == (own.st_dev, own.st_ino) != (here.st_dev, here.st_ino)
    assert summary["complete"] and summary["records"] == 20000 and report["output"]["overlaps"] == 0
    assert_exactly_once(out, writer)


PROBE = textwrap.dedent("""
    import json, sys
    from consumer.spark.session import spark_master, stderr_apart
    stderr_apart()
    print("a line on stderr", file=sys.stderr, flush=True)
    print(json.dumps(spark_master(None, "local[1]")), flush=True)
""")


@pytest.mark.parametrize("how", ["conf", "spark-defaults.conf"])
def test_the_master_spark_submit_resolved_is_the_drivers(bed, tmp_path, how):
    """However spark-submit was given its master, that is the driver's, not the fallback."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = bed.submit_env()
    argv = bed.submit_argv(str(probe))
    argv.remove("--master")
    argv.remove(bed.spark.url)
    if how == "conf":
        argv[1:1] = ["--conf", f"spark.master={bed.spark.url}"]
    else:
        conf_dir = tmp_path / "conf"
        conf_dir.mkdir()
        (conf_dir / "spark-defaults.conf").write_text(f"spark.master {bed.spark.url}\n")
        env["SPARK_CONF_DIR"] = str(conf_dir)
    proc = submit(bed, argv, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [None, bed.spark.url]
    assert "a line on stderr" in proc.stderr


# ---------------------------------------------------------------- the fault round (slow)

#: The fault round runs when asked for (``-m slow``), not in every ``bin/test`` (a skip mark, so
#: the module's cluster is not started for it).
by_hand = pytest.mark.skipif("not re.search(r'(?<!not )\\bslow\\b', config.getoption('markexpr') or '')",
                             reason="the cluster's fault round runs by hand: -m slow")


def coordinator_in(connect: str, **mirror):
    node = Coordinator(connect, "n1", CoordinatorConfig(session_timeout_ms=2000, rebalance_timeout_ms=5000,
                                                         rebalance_backoff_ms=50, **mirror)).start()
    wait_for(lambda: node.is_leader, 20, message="coordinator leads")
    return node


@pytest.fixture
def log_chroot(bed, request):
    """A chroot with a coordinator for the embedded log (no Kafka mirror)."""
    connect = f"{bed.zk_connect}/{chroot_name(request)}"
    node = coordinator_in(connect)
    yield connect
    node.close()


def files_written(out) -> int:
    return len(glob.glob(str(out / "records" / "topic=*" / "partition=*" / "*.parquet")))


@contextlib.contextmanager
def zk_client(connect: str):
    client = start_client(connect)
    try:
        yield client
    finally:
        close_client(client)


def wait_until_running(zk, out, proc, workers: int = 4) -> None:
    """Until every worker is a member of the group and batches are written."""
    def running():
        members = zk.get_children(protocol.ids_path("pipeline")) if zk.exists(protocol.ids_path("pipeline")) else []
        return len(members) >= workers and files_written(out) >= 2
    wait_for(lambda: running() or proc.poll() is not None, 180, message="every worker running")
    assert proc.poll() is None, proc.stderr.read()[-3000:]


def committed_all(zk, topic: str, writer: Writer) -> bool:
    return list(helpers.committed(zk, "pipeline", topic, len(writer.next)).values()) == writer.next


def output_offsets(out) -> Counter:
    """Counter of (topic, partition, offset) in the pipeline's Parquet files."""
    import pyarrow.parquet as pq

    found = Counter()
    for path in glob.glob(str(out / "records" / "topic=*" / "partition=*" / "*.parquet")):
        table = pq.read_table(path, columns=["topic", "partition", "offset"]).to_pydict()
        found.update(zip(table["topic"], table["partition"], table["offset"]))
    return found


def start_submit(bed, argv) -> subprocess.Popen:
    """spark-submit in a session of its own (the driver's JVM and Python killed together)."""
    return subprocess.Popen(argv, env=bed.submit_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen):
    out, err = proc.communicate(timeout=SUBMIT_TIMEOUT_S)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


FAULT_ARGS = ("--batch-size", "10000", "--session-timeout-ms", "2000", "--max-worker-deaths", "20")


@pytest.mark.slow
@by_hand
def test_a_worker_host_killed_is_replaced_by_the_master_and_the_output_is_exactly_once(bed, chroot, tmp_path):
    """A stream of 200,000 records on four workers (two task slots on each host), held until
    the master gave the application an executor on the killed host again, and every record
    was committed."""
    writer = kafka_topic(bed, "killed", 4, 50000)
    out, stop = tmp_path / "out", tmp_path / "stop"
    proc = start_submit(bed, bed.submit_argv(PIPELINE_APP, *pipeline_args(
        bed, chroot, "killed", out, "--mode", "stream", "--stop-file", str(stop), *FAULT_ARGS, workers=4)))
    with zk_client(chroot) as zk:
        wait_until_running(zk, out, proc)
        app_id = bed.spark.status()["activeapps"][0]["id"]
        bed.kill_worker(0)          # the daemon, its executors and their Python workers, at once
        bed.spark.restart_worker(0)
        wait_for(lambda: len(bed.spark.executor_dirs(app_id)["worker1"]) >= 2 or proc.poll() is not None, 180,
                 message="the master started an executor on the worker host again")
        wait_for(lambda: committed_all(zk, "killed", writer) or proc.poll() is not None, 180,
                 message="every record committed")
    stop.touch()
    report = finish(proc)
    assert report["summary"]["task_failures"] >= 1
    assert len(bed.spark.executor_dirs(app_id)["worker1"]) >= 2  # the killed executor and its successor
    assert_exactly_once(out, writer)


@pytest.mark.slow
@by_hand
def test_a_worker_host_cut_from_zookeeper_under_a_drain_leaves_the_output_exactly_once(bed, chroot, tmp_path):
    if bed.net is None:
        pytest.skip("no network namespaces here: nothing to cut")
    writer = kafka_topic(bed, "cut", 4, 50000)
    out = tmp_path / "out"
    proc = start_submit(bed, bed.submit_argv(PIPELINE_APP, *pipeline_args(bed, chroot, "cut", out, *FAULT_ARGS,
                                                                           workers=4)))
    with zk_client(chroot) as zk:
        wait_until_running(zk, out, proc)
    bed.cut_from_zookeeper(1)
    try:
        # the other host's workers take its partitions over once its sessions ended
        with zk_client(chroot) as zk:
            wait_for(lambda: committed_all(zk, "cut", writer) or proc.poll() is not None, 180,
                     message="every record committed")
    finally:
        bed.heal(1)
    report = finish(proc)
    assert report["summary"]["complete"]
    assert_exactly_once(out, writer)


@pytest.mark.slow
@by_hand
def test_the_driver_killed_and_submitted_again_finishes_the_output_exactly_once(bed, chroot, tmp_path):
    writer = kafka_topic(bed, "rerun", 4, 50000)
    out = tmp_path / "out"
    argv = bed.submit_argv(PIPELINE_APP, *pipeline_args(bed, chroot, "rerun", out, *FAULT_ARGS))
    first = start_submit(bed, argv)
    wait_for(lambda: files_written(out) >= 2 or first.poll() is not None, 180, message="batches written")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    wait_for(lambda: not bed.spark.status()["activeapps"], 60, message="the master ended the application")
    report = finish(start_submit(bed, argv))
    assert report["summary"]["complete"]
    assert_exactly_once(out, writer)


@pytest.mark.slow
@by_hand
@pytest.mark.parametrize("mode", ["drain", "stream"])
def test_the_pipeline_on_the_embedded_log_runs_on_the_cluster_when_its_data_directory_is_shared(
        bed, log_chroot, tmp_path, mode):
    """Every host mounts the data directory at the same path (here: one machine's disk); the
    stream reads records appended while it runs."""
    from tests.spark.test_spark import Producer

    data_dir, out = str(tmp_path / "data"), tmp_path / "out"
    os.makedirs(data_dir)
    more = ["--duration", "40", "--trigger-interval", "2"] if mode == "stream" else []
    with zk_client(log_chroot) as client:
        helpers.fill(data_dir, "logged", [5000] * 4, zk=client)
        with Producer(data_dir, "logged", 4, 20, pause_s=0.05) if mode == "stream" else contextlib.nullcontext():
            proc = submit(bed, bed.submit_argv(PIPELINE_APP, "--zk", log_chroot, "--data-dir", data_dir,
                                               "--topic", "logged", "--out", str(out), "--workers", "2",
                                               "--mode", mode, "--json", *more))
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout)
        committed = helpers.committed(client, "pipeline", "logged", 4)
    assert report["summary"]["master"] == bed.spark.url
    assert all(end >= 5000 for end in committed.values()) and (mode == "stream" or report["summary"]["complete"])
    offsets = output_offsets(out)  # (the records appended meanwhile have other values than fill's)
    assert set(offsets) == {("logged", p, o) for p, end in committed.items() for o in range(end)}
    assert max(offsets.values()) == 1


GROUP_JOB = textwrap.dedent("""
    import json, os, sys
    from consumer.spark import local_session, run_group_job

    zk, servers, topic, notes = sys.argv[1:5]

    def note(batch):  # on the executors: one line per batch, in a file per worker attempt
        with open(os.path.join(notes, batch.worker.consumer_id), "a") as f:
            for tp, (start, end) in batch.ranges.items():
                f.write(f"{tp.partition} {start} {end}\\n")

    spark = local_session(app_name="group-job")
    summary = run_group_job(spark, "job", [topic], note, zk=zk, bootstrap_servers=servers, workers=2,
                            consumer_config={"session_timeout_ms": 2000})
    print(json.dumps(summary.as_dict(), default=str))
    spark.stop()
""")


@pytest.mark.slow
@by_hand
def test_a_group_job_submitted_to_the_cluster_processes_every_record(bed, chroot, tmp_path):
    writer = kafka_topic(bed, "job", 4, 5000)
    app, notes = tmp_path / "job.py", tmp_path / "notes"
    app.write_text(GROUP_JOB)
    notes.mkdir()
    proc = submit(bed, bed.submit_argv(str(app), chroot, bed.bootstrap_servers, "job", str(notes)), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["master"] == bed.spark.url and summary["complete"]
    seen = set()
    for name in os.listdir(notes):
        for line in (notes / name).read_text().splitlines():
            p, start, end = map(int, line.split())
            seen.update(("job", p, o) for o in range(start, end))
    assert seen == writer.expected()


def test_spark_cluster_refuses_bad_input_in_one_line(subprocess_env):
    proc = subprocess.run([os.path.join(ROOT, "bin", "spark-cluster"), "--workers", "0"], env=subprocess_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: Invalid value for '--workers': 0 is not in the range x>=1. (see 'spark-cluster --help')"]
