"""Plumbing shared by the zkgroups command-line tools (groupctl, coordinatord, ...).

* :func:`global_options` gives a click group or command ``--zk``, ``--data-dir``,
  ``--zk-timeout`` and ``-v``, and puts a :class:`CliContext` on ``ctx.obj`` (get it in
  subcommands with :data:`pass_cli`). The ZooKeeper client is started on first use, with a
  bounded connect timeout, and closed when the command ends.
* :class:`CliGroup` / :class:`CliCommand` (``cls=`` for ``click.group`` / ``click.command``):
  every :class:`ZkGroupsError`, ZooKeeper error, ``OSError`` or click error is reported as
  one line on stderr, ``error: ...``, with exit status 1 (2 for usage errors); never a
  traceback. Subcommands and subgroups inherit these classes.
* :func:`load_config` reads a TOML file into a config dataclass, rejecting unknown keys.
* :func:`print_table` prints aligned columns; :func:`setup_logging` sends log records to
  stderr as ``level: message``.

A new tool::

    @click.group(cls=CliGroup)
    @global_options
    def main():
        "What the tool does."

    @main.command()
    @pass_cli
    def status(cli):
        click.echo(cli.topics.list())
"""
from __future__ import annotations

import errno
import functools
import logging
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence, Type, TypeVar

import click
from kazoo.exceptions import KazooException

from consumer.log import Log
from coordinator import config as _config
from coordinator.errors import ZkGroupsError
from coordinator.topics import TopicRegistry
from coordinator.zkclient import DEFAULT_CONNECT, close_client, start_client

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_DATA_DIR = "./data"
DEFAULT_ZK_TIMEOUT = 10.0
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# ---------------------------------------------------------------- errors as one line

# click >= 8.2 raises this (a UsageError that prints the help) for a bare group; keep it as is.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


class CliError(click.ClickException):
    """Shown as ``error: <message>`` on one line; exit status 1."""

    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"error: {_one_line(self.format_message())}", err=True)


class CliUsageError(click.UsageError):
    """A usage error shown on one line, with a pointer to ``--help``; exit status 2."""

    def show(self, file=None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"error: {_one_line(self.format_message())}{hint}", err=True)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KazooException):
        detail = str(exc)
        return f"ZooKeeper request failed: {type(exc).__name__}" + (f" ({detail})" if detail else "")
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _convert(exc: BaseException) -> Optional[click.ClickException]:
    """The one-line click exception for ``exc``; None for what click shows well already."""
    if isinstance(exc, (CliError, CliUsageError, _NO_ARGS_IS_HELP)):
        return None
    if isinstance(exc, click.UsageError):
        return CliUsageError(exc.format_message(), exc.ctx)
    if isinstance(exc, click.ClickException):
        converted = CliError(exc.format_message())
        converted.exit_code = exc.exit_code
        return converted
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        return None  # click handles a closed stdout (e.g. piped into head) quietly
    if isinstance(exc, (ZkGroupsError, KazooException, OSError)):
        return CliError(_describe(exc))
    return None


class _OneLineErrors:
    """Mixin for click commands: the conversions described in the module docstring."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except Exception as e:
            converted = _convert(e)
            if converted is None:
                raise
            raise converted from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as e:
            converted = _convert(e)
            if converted is None:
                raise
            raise converted from None


class CliCommand(_OneLineErrors, click.Command):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        super().__init__(*args, **kwargs)


class CliGroup(_OneLineErrors, click.Group):
    command_class = CliCommand
    group_class = type  # subgroups are CliGroups too

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        super().__init__(*args, **kwargs)


# ---------------------------------------------------------------- shared options and context

class CliContext:
    """What every subcommand needs; ZooKeeper client and log are opened on first use."""

    def __init__(self, zk_connect: str = DEFAULT_CONNECT, data_dir: str = DEFAULT_DATA_DIR,
                 zk_timeout: float = DEFAULT_ZK_TIMEOUT):
        self.zk_connect, self.data_dir, self.zk_timeout = zk_connect, data_dir, zk_timeout
        self._zk = None
        self._log = None

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
    click.option("--zk", envvar="ZK_CONNECT", default=DEFAULT_CONNECT, show_default=True, show_envvar=True,
                 help="ZooKeeper connect string, optionally with a chroot (host:port,host:port/app)."),
    click.option("--data-dir", envvar="ZKGROUPS_DATA_DIR", default=DEFAULT_DATA_DIR, show_default=True,
                 show_envvar=True, type=click.Path(file_okay=False), help="Where topics' data lives."),
    click.option("--zk-timeout", envvar="ZKGROUPS_ZK_TIMEOUT", default=DEFAULT_ZK_TIMEOUT, show_default=True,
                 show_envvar=True, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                 help="How long to wait for ZooKeeper to answer."),
    click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug)."),
)


def global_options(f):
    """Add the shared options to a group or command callback and set up ``ctx.obj``."""

    @functools.wraps(f)
    def callback(*args, zk: str, data_dir: str, zk_timeout: float, verbose: int, **kwargs):
        setup_logging(verbose)
        ctx = click.get_current_context()
        ctx.obj = CliContext(zk, data_dir, zk_timeout)
        ctx.call_on_close(ctx.obj.close)
        return f(*args, **kwargs)

    for option in reversed(_GLOBAL_OPTIONS):
        callback = option(callback)
    return callback


# ---------------------------------------------------------------- logging, config, output

class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (click's test runner swaps it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


def setup_logging(verbose: int = 0) -> None:
    """Log to stderr as ``level: message``: warnings by default, info with -v, debug with -vv.

    kazoo's own connection chatter is hidden unless -v: the tools report a ZooKeeper that
    does not answer as an error of their own.
    """
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL if verbose <= 0 else level)


def load_config(path: str, cls: Type[T], section: str = "", overrides: Optional[Mapping[str, Any]] = None) -> T:
    """Build dataclass ``cls`` from TOML file ``path`` (one ``[section]`` of it if given).

    Unknown keys and values of the wrong type raise InvalidConfig naming the file; keys may
    use dashes or underscores. ``overrides`` (e.g. command-line options that were given)
    win over the file.
    """
    values = dict(_config.load_toml(path, section))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return _config.build(cls, values, source=path)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print aligned columns; whole numbers get thousands separators and are right-aligned."""
    def cell(value) -> str:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)

    rows = [list(row) for row in rows]
    numeric = [bool(rows) and all(isinstance(row[i], int) and not isinstance(row[i], bool) for row in rows)
               for i in range(len(headers))]
    lines = [list(headers)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    for line in lines:
        click.echo("  ".join(c.rjust(w) if num else c.ljust(w)
                             for c, w, num in zip(line, widths, numeric)).rstrip())
