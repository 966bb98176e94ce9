"""``pipeline``: an example Spark pipeline on a zkgroups consumer group, with exactly-once output.

Reads a topic through consumer group ``--group`` on Spark workers (consumer.spark) and writes

    <out>/records/topic=<topic>/partition=<p>/<start:020d>-<end:020d>.parquet   every record, once
    <out>/records/_SUCCESS                          JSON manifest, after a run that ended cleanly
    <out>/counts/                                   per-key counts (Parquet)

``spark.read.parquet("<out>/records")`` gives Spark's Kafka-source schema.

then prints the summary. The work is :func:`consumer.spark.sink.run_pipeline` (which says
why the output is exactly once although consumption is at-least-once, also across reruns
after the group's offsets were moved back); this module parses
the options, checks before starting Spark that the configuration, ZooKeeper, a coordinator
and the topic are there (on the data plane: the embedded log under ``--data-dir``, or Kafka
with ``--bootstrap-servers``), starts Spark with its log in ``<out>/_spark.log``, turns the
first Ctrl-C or SIGTERM into a stop after the current batch, and reports in one line what
went wrong. Output with an offset in two files (possible only if files were put there by
hand) is exit 3.

The Spark master: ``--master``, else spark-submit's (its ``--master``, ``--conf
spark.master=…`` or ``spark-defaults.conf``), else ``$SPARK_MASTER``, else ``local[WORKERS]``
(one slot per worker; a failed worker is started again by the driver, within the death
budget). Under spark-submit the driver's stderr goes to spark-submit's stderr, not merged into
its stdout, so ``--json`` prints the summary alone on stdout.

On Kafka (``--bootstrap-servers`` or ``KAFKA_BOOTSTRAP_SERVERS``; librdkafka properties from
``--kafka-config FILE``, as for ``groupctl``) the workers read the brokers themselves: only
``--out`` must be a directory the driver and every executor see. The properties never
appear in a message, the summary or Spark's configuration (they reach the executors inside
the pickled job).

TLS to ZooKeeper: ``--zk-tls-ca``, ``--zk-tls-cert``, ``--zk-tls-key`` and
``--zk-tls-key-password-file`` (env ``ZK_TLS_*``), as for ``groupctl``. The workers get the
file names only (never a key or its password; a password only as a file): the files must
exist at the same paths on every executor.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Dict, Optional

import click

from coordinator import protocol
from coordinator.acl import parse_auth
from coordinator.cli.common import (DEFAULT_ZK_TIMEOUT, MAX_MS, ZK_CONNECT, CliCommand, CliError, CliUsageError,
                                    Limited, Seconds, version_option, zk_tls_options)
from coordinator.config import DEFAULT_CONNECT, DEFAULT_DATA_DIR, DEFAULT_SESSION_TIMEOUT_MS, ENV_DATA_DIR, ENV_ZK_CONNECT
from coordinator.errors import InvalidConfig, UnknownTopic, ZkGroupsError
from coordinator.metrics_server import check_port
from coordinator.signals import on_stop_signals
from consumer.cli.context import BOOTSTRAP_SERVERS, kafka_settings
from consumer.dataplane import ENV_BOOTSTRAP_SERVERS
from consumer.spark.driver import check_spark_conf
from consumer.spark.session import local_session, stderr_apart
from consumer.spark.sink import DEFAULT_BATCH_SIZE, RECORDS_DIR, run_pipeline


def _parse_conf(values) -> Dict[str, str]:
    conf = {}
    for item in values:
        if "=" not in item:
            raise CliUsageError(f"--conf {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        conf[k.strip()] = v.strip()
    return conf


@contextmanager
def _jvm_stderr_to(path: Optional[str]):
    """Start the JVM (and its Python workers) with stderr going to ``path`` (None: unchanged)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _fail(message: str, code: int = 1):
    error = CliError(message)
    error.exit_code = code
    raise error


@click.command(cls=CliCommand)
@click.option("--zk", envvar=ENV_ZK_CONNECT, default=DEFAULT_CONNECT, show_default=True, type=ZK_CONNECT,
              help="ZooKeeper connect string, optionally with a chroot (host:port/app).")
@click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", default=DEFAULT_ZK_TIMEOUT, show_default=True,
              type=Seconds(), metavar="SECONDS", help="How long to wait for ZooKeeper to answer.")
@click.option("--data-dir", envvar=ENV_DATA_DIR, default=DEFAULT_DATA_DIR, show_default=True, show_envvar=True, type=click.Path(file_okay=False),
              help="The embedded log's directory (shared disk: the same files for the driver and every executor).")
@click.option("--bootstrap-servers", envvar=ENV_BOOTSTRAP_SERVERS, show_envvar=True, type=BOOTSTRAP_SERVERS,
              help="Kafka brokers: read the topic from Kafka instead of the embedded log (no shared disk needed).")
@click.option("--kafka-config", type=click.Path(dir_okay=False), metavar="FILE",
              help="TOML file of librdkafka properties ([kafka] table or top level: security.protocol, sasl.*, "
                   "ssl.*, ...); never shown.")
@click.option("--zk-auth", envvar="ZK_AUTH", show_envvar=True, metavar="USER:PASSWORD|@FILE",
              help="The group's ZooKeeper digest identity, or @FILE holding it (keeps it out of ps and out of "
                   "the pickled job: executors read the file).")
@click.option("--group", default="pipeline", show_default=True, help="Consumer group id.")
@click.option("--topic", required=True, help="Topic to read.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Output directory: records/ and counts/ (Parquet).")
@click.option("--workers", default=2, show_default=True,
              type=Limited(1, protocol.MAX_PARTITIONS, "the most partitions a topic may have"),
              help="Worker tasks (group members; more than the topic's partitions would idle).")
@click.option("--mode", default="drain", show_default=True, type=click.Choice(["drain", "stream"]),
              help="drain: what is in the topic now, then exit; stream: until --duration, --stop-file or Ctrl-C.")
@click.option("--duration", type=Seconds(max=None),
              help="Seconds: stream for this long; in drain mode, give up after this long (exit 2).")
@click.option("--batch-size", default=DEFAULT_BATCH_SIZE, show_default=True, type=click.IntRange(1),
              help="Records per output file: partitions are cut at offsets that are multiples of this "
                   "(larger: fewer, bigger files; a worker holds up to this many records per partition).")
# -- Spark: master, triggers, worker deaths
@click.option("--master", default=None,
              help="Spark master [spark-submit's, else $SPARK_MASTER, else local[WORKERS]].")
@click.option("--trigger-interval", type=Seconds(max=None), metavar="SECONDS",
              help="Stream: cut a batch when it is full or when this much time has passed, whichever comes first.")
@click.option("--max-worker-deaths", default=3, show_default=True, type=click.IntRange(0),
              help="Failed worker task attempts tolerated within --death-window; a dead worker is started again.")
@click.option("--death-window", default=60.0, show_default=True, type=Seconds(max=None), metavar="SECONDS",
              help="The window of --max-worker-deaths.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark configuration (repeatable).")
@click.option("--stop-file", type=click.Path(dir_okay=False),
              help="Stop when this file appears: every worker writes and commits what it fetched, then all leave.")
@click.option("--session-timeout-ms", type=Limited(1, MAX_MS, "ZooKeeper's largest session timeout"),
              help=f"Workers' ZooKeeper session timeout [{DEFAULT_SESSION_TIMEOUT_MS}].")
@click.option("--progress-interval", default=10.0, show_default=True, type=Seconds(max=None), metavar="SECONDS",
              help="Log the run's progress (records, batches, workers up, lag) on stderr this often.")
@click.option("--metrics-port", type=int, metavar="PORT",
              help="Serve the run's Prometheus metrics at http://HOST:PORT/metrics while it runs (0: any free port).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--verbose", is_flag=True, help="Show Spark's own log on stderr (default: <out>/_spark.log).")
@zk_tls_options
@version_option
def main(zk, zk_auth, zk_tls, zk_timeout, data_dir, bootstrap_servers, kafka_config, group, topic, out, workers, mode, duration,
         batch_size, master, trigger_interval, max_worker_deaths, death_window, confs, stop_file,
         session_timeout_ms, progress_interval, metrics_port, as_json, verbose):
    """Read TOPIC through a consumer group on Spark; write the records and per-key counts as Parquet.

    Each offset is written once, also across reruns after the group's offsets were moved back.
    Exit 0 done; 1 error (one line); 2 usage, or a drain not finished; 3 output with an offset in
    two files.
    """
    stderr_apart()  # under spark-submit: stdout carries the summary alone
    _setup_logging(verbose)
    protocol.validate_name(group, "group")
    protocol.validate_name(topic)
    bootstrap_servers, kafka = kafka_settings(bootstrap_servers, kafka_config)
    conf = _parse_conf(confs)
    _check_options(metrics_port, conf, zk_auth, zk_tls)
    _preflight(zk, zk_timeout, data_dir, bootstrap_servers, kafka, topic, zk_auth, zk_tls)
    if importlib.util.find_spec("pyspark") is None:
        _fail("pyspark is not installed (pip install 'zkgroups[spark]')")
    os.makedirs(out, exist_ok=True)
    conf.setdefault("spark.sql.shuffle.partitions", str(max(2, workers)))
    spark = _start_spark(master, f"local[{workers}]", conf, None if verbose else os.path.join(out, "_spark.log"))
    stop = threading.Event()
    with _spark_run(spark, out, verbose):
        result = run_pipeline(spark, zk=zk, data_dir=data_dir, bootstrap_servers=bootstrap_servers, kafka=kafka,
                              group=group, topic=topic, out=out, workers=workers, mode=mode, duration_s=duration,
                              batch_size=batch_size, stop_file=stop_file,
                              consumer_config=_worker_config(session_timeout_ms, zk_auth, zk_tls),
                              job_ready=functools.partial(_stop_on_signals, stop),
                              trigger_interval_s=trigger_interval,
                              max_worker_deaths=max_worker_deaths, death_window_s=death_window,
                              progress_interval_s=progress_interval, metrics_port=metrics_port)
    _print_result(result, out, as_json)
    _fail_unless_complete(result, out, mode, duration, stop)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.ERROR)
    logging.getLogger("zkgroups.spark.progress").setLevel(logging.INFO)  # a line per --progress-interval
    # librdkafka's own lines (connection retries, ...) are detail: the errors say what failed.
    logging.getLogger("zkgroups.kafka").setLevel(logging.NOTSET if verbose else logging.CRITICAL)


def _check_options(metrics_port: Optional[int], conf: Dict[str, str], zk_auth: Optional[str], zk_tls=None) -> None:
    """The metrics port, the Spark configuration, the ZooKeeper identity and TLS setting (its
    key password a file the workers can read): one line each, before paying for a JVM."""
    if metrics_port is not None:
        try:
            check_port(metrics_port)
        except InvalidConfig as e:
            _fail(str(e), 2)
    check_spark_conf(conf)
    parse_auth(zk_auth)  # a malformed value or a missing file: one line, before anything starts
    if zk_tls is not None:
        zk_tls.carried("--zk-tls-*")


def _worker_config(session_timeout_ms: Optional[int], zk_auth: Optional[str], zk_tls=None) -> Optional[dict]:
    """The workers' consumer settings the options give (None: the defaults); TLS as file names."""
    consumer_config = {"session_timeout_ms": session_timeout_ms} if session_timeout_ms else {}
    if zk_auth:
        consumer_config["zk_auth"] = zk_auth
    if zk_tls is not None:
        consumer_config["zk_tls"] = zk_tls.carried("--zk-tls-*")
    return consumer_config or None


def _stop_on_signals(stop: threading.Event, job) -> None:
    """The first Ctrl-C or SIGTERM sets ``stop`` and asks ``job`` to stop after the current
    batch; a second ends the process at once (exit 130)."""
    def on_signal() -> None:
        if stop.is_set():  # second Ctrl-C: give up at once
            os._exit(130)
        stop.set()
        job.request_stop()
    on_stop_signals(on_signal)


@contextmanager
def _spark_run(spark, out: str, verbose: bool):
    """Around the run: what fails is one line (exit 1), and Spark is stopped in any case."""
    try:
        yield
    except (ZkGroupsError, OSError) as e:
        log_hint = "" if verbose else f" (Spark's log: {os.path.join(out, '_spark.log')})"
        _fail(f"{e}{log_hint}")
    except Exception as e:  # Spark/Py4J trouble outside the group job: still one line
        _fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        try:
            spark.stop()
        except Exception:
            pass


def _print_result(result, out: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2, default=str))
        return
    click.echo(result.summary.table())
    o = result.output
    click.echo(f"records: {o.counted:,} in {o.files} files under {os.path.join(out, RECORDS_DIR)}"
               f" (overlapping offsets: {o.overlaps}); {o.written:,} written by this run, any attempt")
    click.echo(f"spark master: {result.summary.master}")
    click.echo(f"per-key counts: {o.distinct_keys:,} keys in {o.counts_dir}")


def _fail_unless_complete(result, out: str, mode: str, duration: Optional[float], stop: threading.Event) -> None:
    """Exit 3 for output with an offset in two files, 2 for a drain that did not finish."""
    if result.output.overlaps:
        _fail(f"{result.output.overlaps} offsets are in more than one file under {os.path.join(out, RECORDS_DIR)} "
              "(files put there by another writer?); the per-key counts count each record once", code=3)
    if mode == "drain" and not result.summary.complete:
        why = f"within --duration {duration:g}s" if duration and not stop.is_set() else "(stopped)"
        _fail(f"the drain did not finish {why}; records up to the committed offsets are written, "
              "run again to continue", code=2)


def _preflight(zk: str, zk_timeout: float, data_dir: str, bootstrap_servers: str, kafka: Dict[str, object],
               topic: str, zk_auth: Optional[str] = None, zk_tls=None) -> None:
    """Fail fast, before Spark starts: ZooKeeper reachable, a coordinator running, the topic
    there (in ZooKeeper's registry for the embedded log, on Kafka — answering within
    ``zk_timeout`` — for Kafka)."""
    from coordinator.zkclient import close_client, start_client
    from consumer.dataplane import open_data_plane, topic_partitions

    if not bootstrap_servers and not os.path.isdir(data_dir):
        raise ZkGroupsError(f"data directory {data_dir} does not exist")
    client = start_client(zk, connect_timeout=zk_timeout, auth=zk_auth, tls=zk_tls)
    try:
        with open_data_plane(data_dir=data_dir, bootstrap_servers=bootstrap_servers, kafka=kafka, zk=client,
                             timeout_s=zk_timeout) as plane:
            topic_partitions(plane, client, [topic])
        if client.exists(protocol.LEADER) is None:
            raise ZkGroupsError(f"no zkgroups coordinator is running against {zk} (start bin/coordinatord)")
        if bootstrap_servers and not _registered(client, topic):
            click.echo(f"warning: topic {topic} is not registered in ZooKeeper yet: the group gets its partitions "
                       "once a coordinator mirroring Kafka (coordinatord --bootstrap-servers) or a Kafka in "
                       "ZooKeeper mode registers it", err=True)
    finally:
        close_client(client)


def _registered(client, topic: str) -> bool:
    from coordinator.topics import TopicRegistry
    try:
        TopicRegistry(client).partitions(topic)
        return True
    except UnknownTopic:
        return False


def _start_spark(master: Optional[str], default_master: str, conf: Dict[str, str], jvm_log: Optional[str]):
    with _jvm_stderr_to(jvm_log):
        return local_session(master, "zkgroups-pipeline", conf, log_level="WARN", default_master=default_master)


if __name__ == "__main__":
    main(prog_name="pipeline")
