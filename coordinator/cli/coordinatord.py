"""``coordinatord``: run one coordinator node. Any number run; one leads.

Startup: the connect string, the options and the ``--config`` file are checked first; anything
wrong is one line on stderr and exit status 1 (2 for a usage error), before ZooKeeper is
contacted. Then the node waits for ZooKeeper (and creates the chroot): at most ``--zk-timeout``
seconds, after which it exits 1 with one line; or, with ``--wait-for-zk``, as long as it takes,
saying so once every 10 s (kazoo's own retry warnings are muted meanwhile). A chroot that
cannot be created is one line and exit 1.

Precedence: command line (or environment) > ``--config`` file > defaults. ``--kafka-config``
replaces the config file's ``kafka`` table.

Topic mirroring (``--bootstrap-servers``) is for a Kafka cluster in KRaft mode only, and only
when asked for: ``KAFKA_BOOTSTRAP_SERVERS`` is not read, because a Kafka in ZooKeeper mode
writes ``/brokers/topics`` itself and a mirror writing the same ZooKeeper would fight it. Its
settings are checked at startup too (confluent-kafka installed, properties librdkafka accepts;
a refused value is never shown, it may be a secret).

Logging: ``--log-level`` (INFO), ``--log-format text|json`` (env ``ZKGROUPS_LOG_FORMAT``): text
lines are ``time LEVEL logger: message``; JSON lines are objects with ``time``, ``level``,
``logger``, ``message`` and the fields a log call passed (see
:data:`coordinator.cli.common.LOG_FIELDS`). Neither shows librdkafka property values.

Metrics: ``--metrics-port PORT`` (env ``ZKGROUPS_METRICS_PORT``, file ``metrics_port``; 0 picks
a free port) serves the node's Prometheus metrics (:mod:`coordinator.metrics`) from before
ZooKeeper is reached; the log line ``metrics served at URL`` says where. A port out of range or
taken is one line and exit 1.

SIGTERM/SIGINT: the leader abandons its current attempt, resigns (another node leads at
once) and exits 0; a node still waiting for ZooKeeper exits 0 at once.
"""
from __future__ import annotations

import logging
import signal
import threading

import click

from coordinator import config as cfg
from coordinator.cli.common import (DEFAULT_ZK_TIMEOUT, LOG_FORMAT_OPTION, MAX_MS, MAX_WAIT_S, ZK_CONNECT,
                                    CliCommand, Seconds, setup_logging, take_connect, version_option)
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.config import MAX_SHARD_COUNT
from coordinator.errors import InvalidConfig
from coordinator.acl import ENV_ZK_AUTH
from coordinator.metrics import CoordinatorMetrics, MetricsServer, check_port
from coordinator.mirror import check_mirror_config
from coordinator.zkclient import wait_for_zookeeper

log = logging.getLogger("zkgroups.coordinator")

#: Upper bounds of the configuration (lower bounds are CoordinatorConfig.validate's).
LIMITS = {"session_timeout_ms": MAX_MS, "rebalance_timeout_ms": MAX_MS, "rebalance_backoff_ms": MAX_MS,
          "failed_retry_interval_ms": MAX_MS, "check_interval_ms": MAX_MS, "settle_ms": MAX_MS,
          "mirror_interval_ms": MAX_MS, "max_rebalance_retries": 100, "handler_threads": 64,
          "shards": MAX_SHARD_COUNT}


_DEFAULTS = CoordinatorConfig()  # the help shows the dataclass's defaults


@click.command(cls=CliCommand)
@click.option("--zk", envvar=cfg.ENV_ZK_CONNECT, default=cfg.DEFAULT_CONNECT, show_default=True, type=ZK_CONNECT,
              help="ZooKeeper connect string, optionally with a chroot (host:port,host:port/app).")
@click.option("--zk-auth", envvar=ENV_ZK_AUTH, metavar="USER:PASSWORD|@FILE",
              help="The coordinators' ZooKeeper digest identity, or @FILE holding it (keeps it out of ps); "
                   f"env {ENV_ZK_AUTH}. Without it znodes are created open.")
@click.option("--node-id", default=None, help="This node's id (default: host-pid).")
@click.option("--session-timeout-ms", type=int, help=f"ZooKeeper session timeout [{_DEFAULTS.session_timeout_ms}].")
@click.option("--rebalance-timeout-ms", type=int, help=f"How long to wait for members' acks [{_DEFAULTS.rebalance_timeout_ms}].")
@click.option("--max-rebalance-retries", type=int,
              help=f"Retries before a group is Failed [{_DEFAULTS.max_rebalance_retries}] (at most 100).")
@click.option("--rebalance-backoff-ms", type=int, help=f"Backoff between attempts, doubled each time [{_DEFAULTS.rebalance_backoff_ms}].")
@click.option("--failed-retry-interval-ms", type=int, help=f"When a Failed group is tried again [{_DEFAULTS.failed_retry_interval_ms}].")
@click.option("--check-interval-ms", type=int, help=f"Periodic full check of every group [{_DEFAULTS.check_interval_ms}].")
@click.option("--shards", type=int, help=f"Shards groups are spread over; used when the installation is created, "
                                         f"fixed afterwards [{_DEFAULTS.shards}] (at most {MAX_SHARD_COUNT}).")
@click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", type=Seconds(), metavar="SECONDS",
              help=f"How long to wait for ZooKeeper at startup [{DEFAULT_ZK_TIMEOUT:g}] (at most {MAX_WAIT_S:g}).")
@click.option("--wait-for-zk", is_flag=True, default=None,
              help="Wait for ZooKeeper at startup as long as it takes, saying so every --zk-timeout seconds.")
@click.option("--bootstrap-servers", metavar="HOST:PORT[,...]",
              help="Mirror the topics of this Kafka cluster into /brokers/topics while leading. Only for a "
                   "cluster in KRaft mode: a Kafka in ZooKeeper mode writes /brokers/topics itself, and mirroring "
                   "into that ZooKeeper would fight it. Never taken from KAFKA_BOOTSTRAP_SERVERS.")
@click.option("--kafka-config", type=click.Path(), metavar="FILE",
              help="TOML file of librdkafka properties for the mirror ([kafka] table or top level): "
                   "security.protocol, sasl.*, ssl.* ...; values are never logged.")
@click.option("--mirror-interval-ms", type=int,
              help=f"How often the mirror reads Kafka's topics [{_DEFAULTS.mirror_interval_ms}]; it also reads "
                   "them at once when a member names a topic not mirrored yet.")
@click.option("--metrics-port", envvar="ZKGROUPS_METRICS_PORT", type=int, metavar="PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port; the log says which).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@LOG_FORMAT_OPTION
@click.option("--config", "config_file", type=click.Path(),
              help="TOML file with the options above ([coordinator] table or top level).")
@version_option
def main(zk, node_id, zk_timeout, wait_for_zk, metrics_port, log_level, log_format, config_file, kafka_config,
         **options):
    """Run a zkgroups coordinator node; with --bootstrap-servers, the leader also mirrors the
    topics of a KRaft Kafka cluster into ZooKeeper."""
    setup_logging(log_format=log_format, level=logging.getLevelName(log_level.upper()), timestamps=True)
    source = config_file or "options"
    startup = {"zk": zk, "node_id": node_id, "zk_timeout": zk_timeout or DEFAULT_ZK_TIMEOUT, "wait_for_zk": wait_for_zk,
               "metrics_port": metrics_port}
    values = {}
    if config_file:
        values = dict(cfg.load_toml(config_file, "coordinator"))
        from_file = _startup_from_file(values, source)
        ctx = click.get_current_context()
        for name, value in from_file.items():
            if value is not None and ctx.get_parameter_source(name) in (None, click.core.ParameterSource.DEFAULT):
                startup[name] = value
    values.update({k: v for k, v in options.items() if v is not None})
    if kafka_config:
        values["kafka"] = cfg.check_kafka_properties(cfg.load_toml(kafka_config, "kafka"), kafka_config)
    config = cfg.build(CoordinatorConfig, values, source)
    for name, limit in LIMITS.items():
        if getattr(config, name) > limit:
            raise InvalidConfig(f"{source}: {name} must be at most {limit}, got {getattr(config, name)}")
    if config.bootstrap_servers:
        check_mirror_config(config.bootstrap_servers, config.kafka)
    metrics, server = CoordinatorMetrics(), None
    if startup["metrics_port"] is not None:  # before ZooKeeper: a port in use is one line at once
        port = check_port(startup["metrics_port"], "--metrics-port" if metrics_port is not None
                          else f"{source}: metrics_port")
        server = MetricsServer(metrics.registry, port).start()
        log.info("metrics served at %s", server.url, extra={"port": server.port})

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.setLevel(logging.CRITICAL)  # while waiting: one line of our own, not kazoo's retries
    try:
        zk = startup["zk"]
        reachable = wait_for_zookeeper(
            zk, None if startup["wait_for_zk"] else startup["zk_timeout"], stop,
            lambda waited: log.warning("ZooKeeper at %s not reachable yet (%.0f s); waiting", zk, waited,
                                       extra={"zk": zk, "duration_ms": int(waited * 1000)}),
            report_every=startup["zk_timeout"])
        if not reachable:
            log.info("stopped while waiting for ZooKeeper")
            return
        node = Coordinator(zk, startup["node_id"], config, metrics).start()
    finally:
        kazoo_log.setLevel(logging.WARNING)
    log.info("node %s started (zk %s)%s", node.node_id, zk,
             f"; while leading it mirrors the topics of Kafka at {config.bootstrap_servers} every "
             f"{config.mirror_interval_ms} ms" if config.bootstrap_servers else "",
             extra={"node": node.node_id, "zk": zk})
    while not stop.wait(0.5):
        pass
    node.close()
    if server is not None:
        server.close()


def _startup_from_file(values: dict, source: str) -> dict:
    """Take the startup keys (zk, node_id, zk_timeout, wait_for_zk, metrics_port) out of the file's values,
    checked; None for those it does not set."""
    found = {"zk": take_connect(values, source), "node_id": cfg.take(values, "node_id", str, source),
             "zk_timeout": cfg.take(values, "zk_timeout", float, source),
             "wait_for_zk": cfg.take(values, "wait_for_zk", bool, source),
             "metrics_port": cfg.take(values, "metrics_port", int, source)}
    if found["zk_timeout"] is not None and not 0 < found["zk_timeout"] <= MAX_WAIT_S:
        raise InvalidConfig(f"{source}: zk_timeout must be > 0 and at most {MAX_WAIT_S:g} seconds")
    return found


if __name__ == "__main__":
    main(prog_name="coordinatord")
