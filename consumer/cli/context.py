"""What every ``groupctl`` and ``pipeline`` command shares: the global options (``--zk``,
``--data-dir``, ``--zk-timeout``, ``-v``) and the :class:`CliContext` they build, which opens
the ZooKeeper client and the embedded log on first use and closes them when the command ends.

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
from typing import Iterable

import click

from consumer.log import Log
from coordinator.cli.common import DEFAULT_ZK_TIMEOUT, MAX_WAIT_S, ZK_CONNECT, Seconds, setup_logging
from coordinator.config import DEFAULT_CONNECT, DEFAULT_DATA_DIR, ENV_DATA_DIR, ENV_ZK_CONNECT
from coordinator.topics import TopicRegistry
from coordinator.zkclient import close_client, start_client

log = logging.getLogger(__name__)


class CliContext:
    """What every subcommand needs; ZooKeeper client and log are opened on first use.

    ``given`` names the global options the user set (command line or environment), so a
    command can let them win over a configuration file and the file win over defaults.
    """

    def __init__(self, zk_connect: str = DEFAULT_CONNECT, data_dir: str = DEFAULT_DATA_DIR,
                 zk_timeout: float = DEFAULT_ZK_TIMEOUT, given: Iterable[str] = ()):
        self.zk_connect, self.data_dir, self.zk_timeout = zk_connect, data_dir, zk_timeout
        self.given = frozenset(given)
        self._zk = None
        self._log = None
        self._warned_no_data = set()

    @property
    def zk(self):
        """A started kazoo client; raises ZooKeeperUnavailable after ``zk_timeout`` seconds."""
        if self._zk is None:
            self._zk = start_client(self.zk_connect, connect_timeout=self.zk_timeout)
        return self._zk

    @property
    def topics(self) -> TopicRegistry:
        return TopicRegistry(self.zk)

    def log(self, **options) -> Log:
        """The embedded log under ``--data-dir`` (one per command; ``options`` apply on first use)."""
        if self._log is None:
            self._log = Log(self.data_dir, **options)
        return self._log

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
        the command shows would look empty without a word."""
        if topic in self._warned_no_data:
            return
        if not any(os.path.isdir(self.partition_dir(topic, p)) for p in partitions):
            self._warned_no_data.add(topic)
            click.echo(f"warning: topic {topic} has no data under {self.data_dir} (is --data-dir right?)", err=True)

    def close(self) -> None:
        """Release the log and the client; errors here are logged, never raised."""
        if self._log is not None:
            _quietly(self._log.close, "the log")
            self._log = None
        if self._zk is not None:
            _quietly(functools.partial(close_client, self._zk), "the ZooKeeper client")
            self._zk = None


def _quietly(close, what: str) -> None:
    try:
        close()
    except Exception as e:  # the command's outcome is already decided
        log.warning("closing %s failed: %s", what, e)


pass_cli = click.make_pass_decorator(CliContext)

_GLOBAL_OPTIONS = (
    click.option("--zk", envvar=ENV_ZK_CONNECT, default=DEFAULT_CONNECT, show_default=True, show_envvar=True,
                 type=ZK_CONNECT, help="ZooKeeper connect string, optionally with a chroot (host:port,host:port/app)."),
    click.option("--data-dir", envvar=ENV_DATA_DIR, default=DEFAULT_DATA_DIR, show_default=True,
                 show_envvar=True, type=click.Path(file_okay=False), help="Where topics' data lives."),
    click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", default=DEFAULT_ZK_TIMEOUT, show_default=True,
                 show_envvar=True, type=Seconds(), metavar="SECONDS",
                 help=f"How long to wait for ZooKeeper to answer (at most {MAX_WAIT_S:g})."),
    click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug)."),
)


def global_options(f):
    """Add the shared options to a group or command callback and set up ``ctx.obj``."""

    @functools.wraps(f)
    def callback(*args, zk: str, data_dir: str, zk_timeout: float, verbose: int, **kwargs):
        setup_logging(verbose)
        ctx = click.get_current_context()
        given = [name for name in ("zk", "data_dir", "zk_timeout")
                 if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
        ctx.obj = CliContext(zk, data_dir, zk_timeout, given)
        ctx.call_on_close(ctx.obj.close)
        return f(*args, **kwargs)

    for option in reversed(_GLOBAL_OPTIONS):
        callback = option(callback)
    return callback
