"""What every ``groupctl`` and ``pipeline`` command shares: the global options (``--zk``,
``--data-dir``, ``--bootstrap-servers``, ``--kafka-config``, ``--zk-timeout``, ``-v``,
``--log-format``) and the
:class:`CliContext` they build, which opens the ZooKeeper client and the data plane (the
embedded log, or Kafka when bootstrap servers are given) on first use and closes them when the
command ends.

``--kafka-config FILE`` is TOML: its ``[kafka]`` table, or else the whole file, holds librdkafka
properties (``security.protocol``, ``sasl.*``, ``ssl.*``, tuning), passed to librdkafka as they
are; dotted keys may be written as nested tables. ``bootstrap.servers`` there is used when
neither ``--bootstrap-servers`` nor ``KAFKA_BOOTSTRAP_SERVERS`` is given. The values may be
secrets: no message shows them. librdkafka's own log lines go to Python logging
(``zkgroups.kafka``) and are shown with ``-v``.

A new command::

    @main.command()
    @pass_cli
    def status(cli):
        click.echo(cli.topics.list())
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Dict, Iterable, Optional, Tuple

import click

from consumer.dataplane import ENV_BOOTSTRAP_SERVERS, DataPlane, open_data_plane
from consumer.log import Log
from coordinator import config as _config
from coordinator.cli.common import (DEFAULT_ZK_TIMEOUT, LOG_FORMAT_OPTION, MAX_WAIT_S, ZK_CONNECT, ZK_SASL_OPTION, ZK_TLS_OPTIONS,
                                    CliUsageError, Seconds, setup_logging)
from coordinator.config import DEFAULT_CONNECT, DEFAULT_DATA_DIR, ENV_DATA_DIR, ENV_ZK_CONNECT
from coordinator.errors import InvalidConfig, UnknownTopic
from coordinator.kafka import check_bootstrap_servers
from coordinator.topics import TopicRegistry
from coordinator import zktls
from coordinator.acl import ENV_ZK_AUTH, parse_auth
from coordinator.zktls import parse_tls
from coordinator.zkclient import close_client, start_client

log = logging.getLogger("zkgroups.cli")


class CliContext:
    """What every subcommand needs; the ZooKeeper client and the data plane are opened on first use.

    ``given`` names the global options the user set (command line or environment), so a
    command can let them win over a configuration file and the file win over defaults.
    ``bootstrap_servers`` ("" for the embedded log) and ``kafka`` (librdkafka properties) say
    where the records are; ``zk_timeout`` also bounds each request to Kafka. ``verbose`` and
    ``log_format`` are how logging was set up.
    """

    def __init__(self, zk_connect: str = DEFAULT_CONNECT, data_dir: str = DEFAULT_DATA_DIR,
                 zk_timeout: float = DEFAULT_ZK_TIMEOUT, given: Iterable[str] = (),
                 bootstrap_servers: str = "", kafka: Optional[Dict[str, object]] = None,
                 verbose: int = 0, log_format: str = "text", zk_auth=None, zk_tls=None, zk_sasl=None):
        self.zk_connect, self.data_dir, self.zk_timeout = zk_connect, data_dir, zk_timeout
        self.zk_auth = parse_auth(zk_auth)  # a Credential (never shown) or None
        self.zk_tls = parse_tls(zk_tls)  # TLS to ZooKeeper (a ZkTls) or None
        self.zk_sasl = parse_auth(zk_sasl, "--zk-sasl")  # a SASL user's Credential or None
        self.verbose, self.log_format = verbose, log_format
        self.given = frozenset(given)
        self.bootstrap_servers = bootstrap_servers
        self.kafka: Dict[str, object] = dict(kafka or {})
        self._zk = None
        self._plane: Optional[DataPlane] = None
        self._warned_no_data = set()

    @property
    def zk(self):
        """A started kazoo client; raises ZooKeeperUnavailable after ``zk_timeout`` seconds."""
        if self._zk is None:
            # No policy yet is fine here: an admin creates it with `groupctl acl apply`.
            self._zk = start_client(self.zk_connect, connect_timeout=self.zk_timeout, auth=self.zk_auth,
                                    require_policy=False, tls=self.zk_tls, sasl=self.zk_sasl)
        return self._zk

    @property
    def topics(self) -> TopicRegistry:
        return TopicRegistry(self.zk)

    @property
    def on_kafka(self) -> bool:
        return bool(self.bootstrap_servers)

    @property
    def data_plane(self) -> DataPlane:
        """Kafka at ``--bootstrap-servers``, else the embedded log under ``--data-dir``."""
        return self.open_data_plane()

    def open_data_plane(self, **log_options) -> DataPlane:
        """The data plane (one per command; ``log_options`` apply to the embedded log on first use)."""
        if self._plane is None:
            self._plane = open_data_plane(data_dir=self.data_dir, bootstrap_servers=self.bootstrap_servers,
                                          kafka=self.kafka, zk=None if self.on_kafka else self.zk,
                                          log_options=log_options, timeout_s=self.zk_timeout)
        return self._plane

    def log(self, **options) -> Log:
        """The embedded log under ``--data-dir`` (``options`` apply on first use)."""
        if self.on_kafka:
            raise CliUsageError("this command works on the embedded log only (not with --bootstrap-servers)")
        return self.open_data_plane(**options).log

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has: ZooKeeper's topic registry for the embedded log,
        Kafka's metadata on Kafka. Raises UnknownTopic (or CorruptZnode)."""
        if not self.on_kafka:
            return self.topics.partitions(topic)
        count = self.data_plane.partition_counts([topic]).get(topic)
        if count is None:
            raise UnknownTopic(topic)
        return count

    def partition_dir(self, topic: str, partition: int) -> str:
        """Where the log keeps a partition under ``--data-dir`` (consumer.log's layout)."""
        return os.path.join(self.data_dir, f"{topic}-{partition}")

    def make_partition_dirs(self, topic: str, partitions: Iterable[int]) -> None:
        """Create the partitions' directories, so a topic without records yet is known to have
        its data here. Best effort: a failure is one warning (the topic itself exists)."""
        try:
            for p in partitions:
                os.makedirs(self.partition_dir(topic, p), exist_ok=True)
        except OSError as e:
            log.warning("could not create the partition directories of %s under %s: %s",
                        topic, self.data_dir, e.strerror or e)

    def warn_if_no_data(self, topic: str, partitions: Iterable[int]) -> None:
        """Warn once when none of these partitions has a directory under ``--data-dir``: the
        topic's data is somewhere else (another directory, a wrong ``--data-dir``), and what
        the command shows would look empty without a word. Nothing to say on Kafka."""
        if self.on_kafka or topic in self._warned_no_data:
            return
        if not any(os.path.isdir(self.partition_dir(topic, p)) for p in partitions):
            self._warned_no_data.add(topic)
            click.echo(f"warning: topic {topic} has no data under {self.data_dir} (is --data-dir right?)", err=True)

    def close(self) -> None:
        """Release the data plane and the client; errors here are logged, never raised."""
        if self._plane is not None:
            _quietly(self._plane.close, "the data plane")
            self._plane = None
        if self._zk is not None:
            _quietly(functools.partial(close_client, self._zk), "the ZooKeeper client")
            self._zk = None


def _quietly(close, what: str) -> None:
    try:
        close()
    except Exception as e:  # the command's outcome is already decided
        log.warning("closing %s failed: %s", what, e)


pass_cli = click.make_pass_decorator(CliContext)


class _BootstrapServersType(click.ParamType):
    """``host:port[,host:port...]``, checked before anything connects."""

    name = "HOST:PORT[,...]"

    def convert(self, value, param, ctx):
        try:
            return check_bootstrap_servers(value)
        except InvalidConfig as e:
            self.fail(str(e), param, ctx)


BOOTSTRAP_SERVERS = _BootstrapServersType()
_KAFKA_VALUE_TYPES = (str, int, float, bool)


def load_kafka_config(path: str) -> Dict[str, object]:
    """librdkafka properties from a TOML file: its ``[kafka]`` table, else the whole file."""
    return kafka_properties(_config.load_toml(path, "kafka"), path)


def kafka_properties(raw: dict, path: str) -> Dict[str, object]:
    """librdkafka properties of a TOML table; nested tables become dotted names. Errors name
    the file and the property, never a value."""
    props: Dict[str, object] = {}

    def flatten(table: dict, prefix: str) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                flatten(value, name + ".")
            elif isinstance(value, _KAFKA_VALUE_TYPES):
                props[name] = value
            else:
                raise InvalidConfig(f"{path}: librdkafka property {name} must be a string, number or "
                                    f"true/false, not a {type(value).__name__}")
    flatten(raw, "")
    return props


_GLOBAL_OPTIONS = (
    click.option("--zk", envvar=ENV_ZK_CONNECT, default=DEFAULT_CONNECT, show_default=True, show_envvar=True,
                 type=ZK_CONNECT, help="ZooKeeper connect string, optionally with a chroot (host:port,host:port/app)."),
    click.option("--zk-auth", envvar=ENV_ZK_AUTH, show_envvar=True, metavar="USER:PASSWORD|@FILE",
                 help="ZooKeeper digest identity (an admin's, or a group's for consume), or @FILE holding it "
                      "(keeps it out of ps). Without it znodes are created open."),
    click.option("--data-dir", envvar=ENV_DATA_DIR, default=DEFAULT_DATA_DIR, show_default=True,
                 show_envvar=True, type=click.Path(file_okay=False), help="Where the embedded log's data lives."),
    click.option("--bootstrap-servers", envvar=ENV_BOOTSTRAP_SERVERS, show_envvar=True, type=BOOTSTRAP_SERVERS,
                 help="Kafka brokers: records are on Kafka instead of the embedded log."),
    click.option("--kafka-config", type=click.Path(dir_okay=False), metavar="FILE",
                 help="TOML file of librdkafka properties ([kafka] table or top level: security.protocol, "
                      "sasl.*, ssl.*, ...)."),
    click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", default=DEFAULT_ZK_TIMEOUT, show_default=True,
                 show_envvar=True, type=Seconds(), metavar="SECONDS",
                 help=f"How long to wait for ZooKeeper, or Kafka, to answer (at most {MAX_WAIT_S:g})."),
    click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug)."),
    LOG_FORMAT_OPTION,
)


def kafka_settings(bootstrap_servers: Optional[str], kafka_config: Optional[str]) -> Tuple[str, Dict[str, object]]:
    """(the brokers, "" for the embedded log; librdkafka properties) from the options:
    ``bootstrap.servers`` in the file counts when neither the option nor the environment gives them."""
    kafka = load_kafka_config(kafka_config) if kafka_config else {}
    in_file = kafka.pop("bootstrap.servers", None)
    if not bootstrap_servers and in_file is not None:
        try:
            bootstrap_servers = check_bootstrap_servers(str(in_file))
        except InvalidConfig as e:
            raise InvalidConfig(f"{kafka_config}: {e}") from None
    if kafka_config and not bootstrap_servers:
        raise CliUsageError("--kafka-config needs Kafka's brokers: --bootstrap-servers, KAFKA_BOOTSTRAP_SERVERS "
                            "or bootstrap.servers in the file")
    return bootstrap_servers or "", kafka


def global_options(f):
    """Add the shared options to a group or command callback and set up ``ctx.obj``."""

    @functools.wraps(f)
    def callback(*args, zk: str, data_dir: str, bootstrap_servers: Optional[str], kafka_config: Optional[str],
                 zk_timeout: float, verbose: int, log_format: str, zk_auth: Optional[str], zk_tls_ca, zk_tls_cert,
                 zk_tls_key, zk_tls_key_password_file, zk_tls_no_verify_hostname, zk_sasl, **kwargs):
        setup_logging(verbose, log_format)
        # librdkafka's own lines (connection retries, ...) are detail: the tools say what failed.
        logging.getLogger("zkgroups.kafka").setLevel(logging.CRITICAL if verbose <= 0 else logging.NOTSET)
        ctx = click.get_current_context()
        given = [name for name in ("zk", "data_dir", "zk_timeout", "bootstrap_servers")
                 if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
        bootstrap_servers, kafka = kafka_settings(bootstrap_servers, kafka_config)
        zk_tls = zktls.from_options(zk_tls_ca, zk_tls_cert, zk_tls_key, zk_tls_key_password_file,
                                    zk_tls_no_verify_hostname)
        ctx.obj = CliContext(zk, data_dir, zk_timeout, given, bootstrap_servers, kafka, verbose, log_format,
                             zk_auth, zk_tls, zk_sasl)
        ctx.call_on_close(ctx.obj.close)
        return f(*args, **kwargs)

    for option in reversed(_GLOBAL_OPTIONS + ZK_TLS_OPTIONS + (ZK_SASL_OPTION,)):
        callback = option(callback)
    return callback
