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

TLS to ZooKeeper: ``--zk-tls-ca``, ``--zk-tls-cert``, ``--zk-tls-key`` (and the key's password
from ``--zk-tls-key-password-file`` or the environment), env ``ZK_TLS_*``, or the config file's
``[zookeeper.tls]`` table (``ca``, ``cert``, ``key``, ``key_password = "@FILE"``,
``verify_hostname``); files that cannot be used, or a server that refuses the connection for a
TLS reason, are one line and exit 1 (:mod:`coordinator.zktls`).

Logging: ``--log-level`` (INFO), ``--log-format text|json`` (env ``ZKGROUPS_LOG_FORMAT``): text
lines are ``time LEVEL logger: message``; JSON lines are objects with ``time``, ``level``,
``logger``, ``message`` and the fields a log call passed (see
:data:`coordinator.cli.common.LOG_FIELDS`). Neither shows librdkafka property values.

HTTP: one server per node (:mod:`coordinator.http`) serves ``/metrics``, ``/healthz``,
``/readyz`` and the console (:mod:`coordinator.console`), from before ZooKeeper is reached.
``--http-addr HOST:PORT`` (env ``ZKGROUPS_HTTP_ADDR``, file ``http_addr``; ``:PORT`` is
127.0.0.1) binds it there; ``--metrics-port PORT`` (env ``ZKGROUPS_METRICS_PORT``, file
``metrics_port``) binds every interface as it always did, with the console answered to loopback
peers only; give one of them. 0 picks a free port; the log lines ``metrics served at URL`` and
``console at URL`` say where. ``--http-tls-cert``/``--http-tls-key`` serve HTTPS, and
``--http-tls-client-ca`` answers only clients with a certificate that CA signed;
``--http-allowed-host`` adds names the console answers to (a reverse proxy's). ``--no-console``
serves metrics and probes only. The console's lag is read every ``--lag-interval`` seconds from
the embedded log under ``--data-dir`` (env ``ZKGROUPS_DATA_DIR``), or from Kafka at
``--lag-bootstrap-servers`` (default: ``--bootstrap-servers``; the ``kafka`` properties apply).
An address out of range or taken, or TLS files that cannot be loaded, is one line and exit 1.

The node never imports :mod:`consumer`: the console reads the data plane's log ends (and the
timestamps of the records at committed offsets: lag in seconds) through the reader the
daemon's entry point hands in (:func:`with_log_ends`; ``coordinatord`` is
:mod:`consumer.cli.coordinatord`, which gives it :mod:`consumer.dataplane.log_ends`).

SIGTERM/SIGINT: the leader abandons its current attempt, resigns (another node leads at
once) and exits 0; a node still waiting for ZooKeeper exits 0 at once.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Optional, Tuple

import click

from coordinator import config as cfg
from coordinator.cli.common import (DEFAULT_ZK_TIMEOUT, LOG_FORMAT_OPTION, MAX_MS, MAX_WAIT_S, ZK_CONNECT,
                                    ZK_SASL_OPTION, CliCommand, Seconds, setup_logging, take_connect, take_tls,
                                    version_option, zk_tls_options)
from coordinator.coordinator import Coordinator, CoordinatorConfig
from coordinator.config import ENV_DATA_DIR, default_data_dir
from coordinator.kafka import check_bootstrap_servers
from coordinator.protocol import MAX_SHARD_COUNT
from coordinator.errors import InvalidConfig
from coordinator.acl import ENV_ZK_AUTH
from coordinator.signals import on_stop_signals
from coordinator.console.app import NodeConsole
from coordinator.console.lag import DEFAULT_INTERVAL_S
from coordinator.http import HttpSettings, NodeHttpServer, Response, node_health, node_readiness
from coordinator.metrics import CoordinatorMetrics
from coordinator.metrics_server import check_port
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
              help="Serve Prometheus metrics at http://HOST:PORT/metrics on every interface (0: any free port; "
                   "the log says which); the console on this port answers loopback peers only.")
@click.option("--http-addr", envvar="ZKGROUPS_HTTP_ADDR", metavar="HOST:PORT",
              help="Serve /metrics, /healthz, /readyz and the console here (:PORT is 127.0.0.1; another "
                   "address shows the console to everyone who reaches it). Instead of --metrics-port.")
@click.option("--http-allowed-host", "http_allowed_hosts", multiple=True, metavar="NAME",
              help="A host name the console answers to besides the loopback's (a reverse proxy's); repeatable.")
@click.option("--http-tls-cert", type=click.Path(dir_okay=False), metavar="FILE", help="Serve HTTPS: PEM certificate.")
@click.option("--http-tls-key", type=click.Path(dir_okay=False), metavar="FILE", help="Serve HTTPS: PEM private key.")
@click.option("--http-tls-client-ca", type=click.Path(dir_okay=False), metavar="FILE",
              help="HTTPS for clients with a certificate only: one signed by a CA in this PEM file (every route; "
                   "others are refused at the handshake).")
@click.option("--console/--no-console", "console", default=None,
              help="Serve the read-only console (pages and /api/v1) beside the metrics [on].")
@click.option("--lag-interval", type=Seconds(), metavar="SECONDS",
              help=f"How often the console reads lag from the data plane [{DEFAULT_INTERVAL_S:g}].")
@click.option("--data-dir", envvar=ENV_DATA_DIR, metavar="DIR",
              help="The embedded log's directory, where the console reads log ends [./data].")
@click.option("--lag-bootstrap-servers", metavar="HOST:PORT[,...]",
              help="Kafka brokers the console reads log ends from (default: --bootstrap-servers; else the "
                   "embedded log).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@LOG_FORMAT_OPTION
@click.option("--config", "config_file", type=click.Path(),
              help="TOML file with the options above ([coordinator] table or top level; TLS to ZooKeeper "
                   "in [zookeeper.tls]).")
@zk_tls_options
@ZK_SASL_OPTION
@version_option
def main(zk, zk_tls, node_id, zk_timeout, wait_for_zk, metrics_port, http_addr, http_allowed_hosts, http_tls_cert,
         http_tls_key, http_tls_client_ca, console, lag_interval, data_dir, lag_bootstrap_servers, log_level,
         log_format, config_file, kafka_config, **options):
    """Run a zkgroups coordinator node; with --bootstrap-servers, the leader also mirrors the
    topics of a KRaft Kafka cluster into ZooKeeper. With --http-addr (or --metrics-port) it
    serves its metrics, health probes and the read-only console."""
    setup_logging(log_format=log_format, level=logging.getLevelName(log_level.upper()), timestamps=True)
    source = config_file or "options"
    startup = {"zk": zk, "node_id": node_id, "zk_timeout": zk_timeout or DEFAULT_ZK_TIMEOUT, "wait_for_zk": wait_for_zk,
               "metrics_port": metrics_port, "http_addr": http_addr,
               "http_allowed_hosts": list(http_allowed_hosts) or None, "http_tls_cert": http_tls_cert,
               "http_tls_key": http_tls_key, "http_tls_client_ca": http_tls_client_ca, "console": console,
               "lag_interval": lag_interval, "data_dir": data_dir,
               "lag_bootstrap_servers": lag_bootstrap_servers, "zk_tls": zk_tls}
    values = _read_config_file(config_file, source, startup)
    values["zk_tls"] = startup["zk_tls"]
    config, lag_kafka = _node_config(values, options, kafka_config, startup["lag_bootstrap_servers"], source)
    metrics = CoordinatorMetrics()
    parts = {"node": None, "console": None}
    server, ends = _serve_http(startup, source, metrics, parts, config, lag_kafka,
                               port_given=metrics_port is not None, addr_given=http_addr is not None)
    stop = threading.Event()
    on_stop_signals(stop.set)
    node = parts["node"] = _start_node(startup, config, metrics, stop)
    if node is None:
        log.info("stopped while waiting for ZooKeeper")
        return
    if server is not None and server.app is not None:
        parts["console"] = _serve_console(server, node, ends, startup)
    log.info("node %s started (zk %s)%s", node.node_id, startup["zk"],
             f"; while leading it mirrors the topics of Kafka at {config.bootstrap_servers} every "
             f"{config.mirror_interval_ms} ms" if config.bootstrap_servers else "",
             extra={"node": node.node_id, "zk": startup["zk"]})
    while not stop.wait(0.5):
        pass
    for part in (parts["console"], node, server, ends):
        if part is not None:
            part.close()


def _read_config_file(config_file: Optional[str], source: str, startup: dict) -> dict:
    """The ``--config`` file's node settings (its startup keys go into ``startup`` where the
    command line and the environment left the default)."""
    if not config_file:
        return {}
    values = dict(cfg.load_toml(config_file, "coordinator"))
    from_file = _startup_from_file(values, source)
    # [zookeeper.tls] sits beside [coordinator] (shared with the other tools) or inside it.
    tls = take_tls(values if "zookeeper" in values else dict(cfg.load_toml(config_file)), source)
    if startup["zk_tls"] is None:
        startup["zk_tls"] = tls
    ctx = click.get_current_context()
    for name, value in from_file.items():
        if value is not None and ctx.get_parameter_source(name) in (None, click.core.ParameterSource.DEFAULT):
            startup[name] = value
    return values


def _node_config(values: dict, options: dict, kafka_config: Optional[str], lag_servers: Optional[str],
                 source: str) -> Tuple[CoordinatorConfig, dict]:
    """The node's configuration (file < command line; ``--kafka-config`` replaces the file's
    ``kafka`` table), checked, and the librdkafka properties of the console's lag reader when
    they are for it alone (``--lag-bootstrap-servers`` without a mirror)."""
    values.update({k: v for k, v in options.items() if v is not None})
    if kafka_config:
        values["kafka"] = cfg.check_kafka_properties(cfg.load_toml(kafka_config, "kafka"), kafka_config)
    lag_kafka = {}
    if lag_servers and not values.get("bootstrap_servers") and "kafka" in values:
        lag_kafka = cfg.check_kafka_properties(values.pop("kafka"), "kafka")  # for the lag reader alone
    config = cfg.build(CoordinatorConfig, values, source)
    for name, limit in LIMITS.items():
        if getattr(config, name) > limit:
            raise InvalidConfig(f"{source}: {name} must be at most {limit}, got {getattr(config, name)}")
    if config.bootstrap_servers:
        check_mirror_config(config.bootstrap_servers, config.kafka)
    return config, lag_kafka


def _serve_http(startup: dict, source: str, metrics: CoordinatorMetrics, parts: dict, config: CoordinatorConfig,
                lag_kafka: dict, port_given: bool, addr_given: bool):
    """The node's HTTP server, before ZooKeeper (a port in use is one line at once), and the
    console's reader of log ends: (server, ends), each None when not served."""
    settings = _http_settings(startup, source, port_given, addr_given)
    if settings is None:
        return None, None
    server = NodeHttpServer(settings, metrics.registry, lambda: node_health(parts["node"], parts["console"]),
                            lambda: node_readiness(parts["node"], parts["console"]),
                            app=_starting if startup["console"] is not False else None).start()
    log.info("metrics served at %s", server.url, extra={"port": server.port})
    ends = _log_ends(startup, config, lag_kafka) if startup["console"] is not False else None
    return server, ends


def _start_node(startup: dict, config: CoordinatorConfig, metrics: CoordinatorMetrics,
                stop: threading.Event) -> Optional[Coordinator]:
    """Wait for ZooKeeper as told (kazoo's own retry lines muted meanwhile), then start the
    node; None if stopped while waiting."""
    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.setLevel(logging.CRITICAL)  # while waiting: one line of our own, not kazoo's retries
    try:
        zk = startup["zk"]
        reachable = wait_for_zookeeper(
            zk, None if startup["wait_for_zk"] else startup["zk_timeout"], stop,
            lambda waited: log.warning("ZooKeeper at %s not reachable yet (%.0f s); waiting", zk, waited,
                                       extra={"zk": zk, "duration_ms": int(waited * 1000)}),
            report_every=startup["zk_timeout"], tls=config.zk_tls)
        if not reachable:
            return None
        return Coordinator(zk, startup["node_id"], config, metrics).start()
    finally:
        kazoo_log.setLevel(logging.WARNING)


def _serve_console(server: NodeHttpServer, node: Coordinator, ends, startup: dict) -> NodeConsole:
    """The console, in place of the server's "still connecting" answer."""
    console = NodeConsole(node, ends, startup["lag_interval"] or DEFAULT_INTERVAL_S).start()
    server.app = console.app.route
    log.info("console at %s (read-only; lag from %s)", server.console_url,
             ends.describe() if ends is not None else "nowhere", extra={"port": server.port})
    return console


def _starting(path: str, query: str):
    """The console's answer until the node has connected to ZooKeeper."""
    return Response.text("the node is still connecting to ZooKeeper; the console starts once it has", 503)


def _http_settings(startup: dict, source: str, port_given: bool, addr_given: bool) -> Optional[HttpSettings]:
    """Where to serve HTTP: --http-addr, or --metrics-port (never both), else nowhere."""
    port, addr = startup["metrics_port"], startup["http_addr"]
    if port is not None and addr is not None:
        raise InvalidConfig(f"{source}: give --http-addr or --metrics-port (metrics_port), not both: "
                            "the node serves one port")
    tls = {"tls_cert": startup["http_tls_cert"], "tls_key": startup["http_tls_key"],
           "tls_client_ca": startup["http_tls_client_ca"]}
    if bool(tls["tls_cert"]) != bool(tls["tls_key"]):
        raise InvalidConfig(f"{source}: HTTPS needs both --http-tls-cert and --http-tls-key")
    if tls["tls_client_ca"] and not tls["tls_cert"]:
        raise InvalidConfig(f"{source}: --http-tls-client-ca needs HTTPS: give --http-tls-cert and --http-tls-key too")
    hosts = tuple(startup["http_allowed_hosts"] or ())
    if addr is not None:
        return HttpSettings.for_http_addr(addr, hosts, source="--http-addr" if addr_given else f"{source}: http_addr",
                                          **tls)
    if port is not None:
        return HttpSettings.for_metrics_port(check_port(port, "--metrics-port" if port_given
                                                        else f"{source}: metrics_port"), hosts, **tls)
    if any(tls.values()) or hosts:
        raise InvalidConfig(f"{source}: the HTTP options need --http-addr (or --metrics-port)")
    return None


def _log_ends(startup: dict, config: CoordinatorConfig, lag_kafka: dict):
    """Where the console reads log ends: Kafka (--lag-bootstrap-servers, else the mirror's
    --bootstrap-servers), else the embedded log under --data-dir."""
    servers = startup["lag_bootstrap_servers"] or config.bootstrap_servers
    if servers:
        servers = check_bootstrap_servers(servers)
    data_dir = startup["data_dir"] or default_data_dir()
    if _open_log_ends is None:
        log.warning("this node was started without a data plane (python -m coordinator.cli.coordinatord): the "
                    "console shows no log ends and no lag; start it as coordinatord")
        return None
    if not servers and not os.path.isdir(data_dir):
        log.warning("the console reads log ends from the embedded log under %s, which does not exist here: give "
                    "--data-dir (or --lag-bootstrap-servers for Kafka), or lag will be wrong", data_dir)
    return _open_log_ends(servers, config.kafka or lag_kafka, data_dir)


#: How the console reads log ends: ``opener(bootstrap servers, kafka properties, data dir)``,
#: handed in by the daemon's entry point on the client side (:mod:`consumer.cli.coordinatord`,
#: which has the data plane); None: the console shows no log ends.
_open_log_ends: Optional[Callable[[str, dict, str], object]] = None


def with_log_ends(opener: Callable[[str, dict, str], object]) -> click.Command:
    """``main``, its console reading log ends through ``opener`` (a
    :class:`~coordinator.console.lag.LogEnds` of the data plane)."""
    global _open_log_ends
    _open_log_ends = opener
    return main


def _startup_from_file(values: dict, source: str) -> dict:
    """Take the startup keys (zk, node_id, zk_timeout, wait_for_zk, metrics_port and the HTTP and
    console keys) out of the file's values, checked; None for those it does not set."""
    found = {"zk": take_connect(values, source), "node_id": cfg.take(values, "node_id", str, source),
             "zk_timeout": cfg.take(values, "zk_timeout", float, source),
             "wait_for_zk": cfg.take(values, "wait_for_zk", bool, source),
             "metrics_port": cfg.take(values, "metrics_port", int, source),
             "http_addr": cfg.take(values, "http_addr", str, source),
             "http_allowed_hosts": cfg.take(values, "http_allowed_hosts", list, source),
             "http_tls_cert": cfg.take(values, "http_tls_cert", str, source),
             "http_tls_key": cfg.take(values, "http_tls_key", str, source),
             "http_tls_client_ca": cfg.take(values, "http_tls_client_ca", str, source),
             "console": cfg.take(values, "console", bool, source),
             "lag_interval": cfg.take(values, "lag_interval", float, source),
             "data_dir": cfg.take(values, "data_dir", str, source),
             "lag_bootstrap_servers": cfg.take(values, "lag_bootstrap_servers", str, source)}
    if found["http_allowed_hosts"] is not None and not all(isinstance(h, str) for h in found["http_allowed_hosts"]):
        raise InvalidConfig(f"{source}: http_allowed_hosts must be a list of host names")
    if found["lag_interval"] is not None and not 0 < found["lag_interval"] <= MAX_WAIT_S:
        raise InvalidConfig(f"{source}: lag_interval must be > 0 and at most {MAX_WAIT_S:g} seconds")
    if found["zk_timeout"] is not None and not 0 < found["zk_timeout"] <= MAX_WAIT_S:
        raise InvalidConfig(f"{source}: zk_timeout must be > 0 and at most {MAX_WAIT_S:g} seconds")
    return found


if __name__ == "__main__":
    main(prog_name="coordinatord")
