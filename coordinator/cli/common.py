"""Plumbing shared by the zkgroups command-line tools (coordinatord here; groupctl, pipeline and
demo in :mod:`consumer.cli`, whose :mod:`consumer.cli.context` adds the shared options).

* :class:`CliGroup` / :class:`CliCommand` (``cls=`` for ``click.group`` / ``click.command``):
  every :class:`ZkGroupsError`, ZooKeeper error, ``OSError`` or click error is reported as
  one line on stderr, ``error: ...``, with exit status 1 (2 for usage errors, with a pointer
  to ``--help``; 75 for retriable errors, e.g. ZooKeeper unreachable); never a traceback.
  Subcommands and subgroups inherit these classes. Every zkgroups tool uses them.
* Option types that check values before anything is allocated or connected:
  :data:`ZK_CONNECT` (a connect string, :func:`coordinator.zkclient.parse_connect`),
  :class:`Limited` (a bounded whole number) and :class:`Seconds` (a finite, bounded duration).
* :func:`take_connect` takes a checked connect string out of a config file's values;
  :func:`zk_tls_options` adds the ``--zk-tls-*`` options (TLS to ZooKeeper) as one ``zk_tls``
  argument, and :func:`take_tls` takes a config file's ``[zookeeper.tls]`` table.
* :func:`print_table` prints aligned columns, :func:`print_json` one JSON document (the
  ``--output json`` of the read commands).
* :func:`setup_logging` sends log records to stderr, one line each: ``level: message`` for the
  tools, time, level and logger first for a long-running node (``timestamps``), or with
  ``--log-format json`` one JSON object per line (:class:`JsonFormatter`: time, level, logger,
  message and the fields the call passed with ``extra=``, :data:`LOG_FIELDS`). A logged
  exception's traceback only with -vv (nodes: always). :func:`report` writes a line that is
  always shown (a tool's summary) in the format in use.
* :func:`version_option` is every tool's ``--version`` (the package version).

A new tool: ``@click.command(cls=CliCommand)`` (or ``click.group(cls=CliGroup)``).
"""
from __future__ import annotations

import datetime as dt
import errno
import functools
import json
import logging
import math
import re
import sys
import traceback
from typing import Any, Dict, Iterable, Optional, Sequence

import click
from kazoo.exceptions import KazooException, NoAuthError

from coordinator import __version__, config as _config, zktls
from coordinator.errors import EXIT_RETRIABLE, InvalidConfig, ZkGroupsError
from coordinator.zkclient import parse_connect

log = logging.getLogger("zkgroups.cli")

DEFAULT_ZK_TIMEOUT = 10.0
#: The upper bound of ``--zk-timeout`` and similar waits, in seconds.
MAX_WAIT_S = 3600.0
MAX_MS = 2**31 - 1   # upper bound of millisecond options: ZooKeeper's session timeout is an int32
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def version_option(command):
    """``--version`` for every tool (``@version_option``): prints ``<command> <version>`` (the
    zkgroups package version) and exits 0. A fresh option per command: click's remembers the
    first program name it printed."""
    return click.version_option(__version__, "--version", message="%(prog)s %(version)s",
                                help="Show the zkgroups version and exit.")(command)


# ---------------------------------------------------------------- errors as one line

# click >= 8.2 raises this (a UsageError that prints the help) for a bare group; keep it as is.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


class CliError(click.ClickException):
    """Shown as ``error: <message>`` on one line (a JSON line once ``--log-format json`` is in
    effect); exit status 1."""

    exit_code = 1

    def show(self, file=None) -> None:
        message = _one_line(self.format_message())
        formatter = _json_formatter()
        if formatter is not None:  # a log reader sees the last word in the same format
            click.echo(formatter.format(_record("zkgroups.cli", logging.ERROR, message)), err=True)
        else:
            click.echo(f"error: {message}", err=True)


class CliUsageError(click.UsageError):
    """A usage error shown on one line, with a pointer to ``--help``; exit status 2."""

    def show(self, file=None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"error: {_one_line(self.format_message())}{hint}", err=True)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, NoAuthError):
        return "ZooKeeper refused: this identity may not do that here (NoAuthError; see --zk-auth)"
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
        converted = CliError(_describe(exc))
        if getattr(exc, "retriable", False) or (isinstance(exc, KazooException) and not isinstance(exc, NoAuthError)):
            converted.exit_code = EXIT_RETRIABLE  # the same command may succeed later, as is
        return converted
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
            if isinstance(e, click.UsageError) and e.ctx is None:
                e.ctx = ctx  # raised by a command's own checks: point to that command's --help
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


# ---------------------------------------------------------------- option types

class _ZkConnectType(click.ParamType):
    """A ZooKeeper connect string, checked (and normalized) by ``parse_connect``."""

    name = "HOST:PORT[,...][/CHROOT]"

    def convert(self, value, param, ctx):
        try:
            return str(parse_connect(value))
        except InvalidConfig as e:
            self.fail(str(e), param, ctx)


#: Option type of a ZooKeeper connect string: checked and normalized by :func:`~coordinator.zkclient.parse_connect`.
ZK_CONNECT = _ZkConnectType()


class Limited(click.IntRange):
    """A whole number >= ``min`` and at most ``max``, where going over names the limit:
    ``Limited(1, 10_000, "the most partitions a topic may have")``."""

    def __init__(self, min: int, max: int, limit_name: str):
        super().__init__(min=min)
        self.most, self.limit_name = max, limit_name

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number > self.most:
            self.fail(f"{number} is more than {self.limit_name} ({self.most:,})", param, ctx)
        return number


class Seconds(click.FloatRange):
    """A duration in seconds: > 0, finite, at most ``max`` (default :data:`MAX_WAIT_S`)."""

    name = "seconds"

    def __init__(self, max: float = MAX_WAIT_S):
        super().__init__(min=0, max=max, min_open=True)

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


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
    """``level: message`` on one line; a logged exception is summed up at the end of the line
    (its traceback follows only with ``tracebacks``)."""

    def __init__(self, tracebacks: bool = False):
        super().__init__("%(message)s")
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks:
            return f"{record.levelname.lower()}: {super().format(record)}"
        line = _one_line(record.getMessage())
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            line += f" ({type(exc).__name__}: {_one_line(str(exc))})" if str(exc) else f" ({type(exc).__name__})"
        return f"{record.levelname.lower()}: {line}"


LOG_FORMATS = ("text", "json")
ENV_LOG_FORMAT = "ZKGROUPS_LOG_FORMAT"

#: Fields a JSON log line may carry besides time, level, logger and message: whatever a log call
#: passes with ``extra=`` is included; these are the names zkgroups uses (and documents).
LOG_FIELDS = {
    "group": "consumer group id",
    "generation": "the group's generation",
    "member": "consumer id of a group member",
    "node": "coordinator node id",
    "epoch": "the coordinator epoch",
    "reason": "why a rebalance or election happened",
    "members": "how many members (a number) or which (a list)",
    "moved": "partitions that changed owner in a rebalance",
    "duration_ms": "how long it took, milliseconds",
    "topic": "topic name",
    "partition": "partition number",
    "partitions": "how many partitions, or which",
    "offset": "an offset",
    "records": "how many records",
    "zk": "the ZooKeeper connect string",
    "port": "a TCP port (where metrics are served)",
    "error": "what went wrong (type and message)",
}

# Names of extra fields (or of keys inside them) whose values are never written: credentials
# passed by mistake stay out of the logs.
_SECRET_NAME = re.compile(r"passw|secret|token|credential|sasl\.|ssl\.key|private", re.I)
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def _redacted(name: str, value):
    if _SECRET_NAME.search(str(name)):
        return "[redacted]"
    if isinstance(value, dict):
        return {k: _redacted(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_redacted("", v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC, milliseconds), ``level`` (lower
    case), ``logger``, ``message``, then every field the call passed with ``extra=`` (values
    that are not JSON become strings; names that look like credentials are redacted). A logged
    exception adds ``error`` (``Type: message``) and, with ``tracebacks``, ``traceback``."""

    def __init__(self, tracebacks: bool = False):
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        line: Dict[str, Any] = {"time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                "level": record.levelname.lower(), "logger": record.name,
                                "message": record.getMessage()}
        for name, value in record.__dict__.items():
            if name not in _RECORD_ATTRS and not name.startswith("_") and name not in line:
                line[name] = _redacted(name, value)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            line.setdefault("error", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            if self.tracebacks:
                line["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(verbose: int = 0, log_format: str = "text", *, level: Optional[int] = None,
                  timestamps: bool = False) -> None:
    """Log to stderr, one line per record: warnings by default, info with -v, debug (and
    tracebacks of logged exceptions) with -vv; ``level`` (a logging level) overrides ``verbose``.

    ``log_format``: ``text`` is ``level: message`` (with ``timestamps``, a long-running node's
    ``time LEVEL logger: message`` and tracebacks); ``json`` is :class:`JsonFormatter`'s.

    kazoo's own connection chatter is hidden unless -v: the tools report a ZooKeeper that does
    not answer as an error of their own (a node, ``timestamps``, sets kazoo's level itself).
    """
    if log_format not in LOG_FORMATS:
        raise InvalidConfig(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if level is None:
        level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    tracebacks = timestamps or verbose >= 2
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        root.addHandler(handler)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(tracebacks=tracebacks))
    elif timestamps:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Formatter(tracebacks=tracebacks))
    root.setLevel(level)
    kazoo_quiet = verbose <= 0 and not timestamps
    logging.getLogger("kazoo").setLevel(logging.CRITICAL if kazoo_quiet else logging.NOTSET)


LOG_FORMAT_OPTION = click.option(
    "--log-format", envvar=ENV_LOG_FORMAT, type=click.Choice(LOG_FORMATS), default="text", show_default=True,
    show_envvar=True, help="Log lines on stderr as text, or as one JSON object per line.")


def _json_formatter() -> Optional[JsonFormatter]:
    """The JSON formatter of the stderr handler, if ``--log-format json`` is in effect."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler) and isinstance(handler.formatter, JsonFormatter):
            return handler.formatter
    return None


def _record(logger: str, level: int, message: str, fields: Optional[Dict[str, Any]] = None) -> logging.LogRecord:
    record = logging.LogRecord(logger, level, "", 0, message, (), None)
    record.__dict__.update(fields or {})
    return record


def report(message: str, logger: str = "zkgroups.cli", **fields) -> None:
    """A line on stderr that is always shown, whatever the log level (a tool's summary, e.g.
    ``consumed 25 records``): the text as it is, or with ``--log-format json`` a JSON line at
    level info carrying ``fields``."""
    formatter = _json_formatter()
    if formatter is None:
        click.echo(message, err=True)
    else:
        click.echo(formatter.format(_record(logger, logging.INFO, message, fields)), err=True)


def take_connect(values: dict, source: str) -> Optional[str]:
    """Remove a ``zk`` connect string from a config file's ``values``; checked and normalized
    (InvalidConfig naming ``source``), or None when the file has none."""
    connect = _config.take(values, "zk", str, source)
    if connect is None:
        return None
    try:
        return str(parse_connect(connect))
    except InvalidConfig as e:
        raise InvalidConfig(f"{source}: zk: {e}") from None


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


OUTPUT_FORMATS = ("table", "json")
#: ``--output table|json`` of every read command (the JSON documents: docs/reference/output.md).
OUTPUT_OPTION = click.option(
    "--output", "-o", type=click.Choice(OUTPUT_FORMATS), default="table", show_default=True,
    help="table for people; json: one JSON document on stdout, for scripts (field names in the docs: reference/output).")


def print_json(document: Any) -> None:
    """Print ``document`` as one JSON document (the ``--output json`` of a read command)."""
    click.echo(json.dumps(document, indent=2, ensure_ascii=False))


ZK_SASL_OPTION = click.option(
    "--zk-sasl", envvar="ZK_SASL", show_envvar=True, metavar="USER:PASSWORD|@FILE",
    help="A SASL (DIGEST-MD5) identity for ZooKeeper, or @FILE holding it (keeps it out of ps); instead of "
         "--zk-auth where ZooKeeper authenticates users with SASL.")

ZK_TLS_OPTIONS = (
    click.option("--zk-tls-ca", envvar=zktls.ENV["ca"], show_envvar=True, metavar="FILE",
                 help="TLS to ZooKeeper: the PEM file of the CA its certificate is checked against."),
    click.option("--zk-tls-cert", envvar=zktls.ENV["cert"], show_envvar=True, metavar="FILE",
                 help="TLS to ZooKeeper: this client's PEM certificate (its x509 identity)."),
    click.option("--zk-tls-key", envvar=zktls.ENV["key"], show_envvar=True, metavar="FILE",
                 help="TLS to ZooKeeper: the PEM private key of --zk-tls-cert."),
    click.option("--zk-tls-key-password-file", envvar=zktls.ENV["key_password_file"], show_envvar=True,
                 metavar="FILE", help=f"The file holding --zk-tls-key's password (or env {zktls.ENV['key_password']}; "
                                      "never on a command line)."),
    click.option("--zk-tls-no-verify-hostname", is_flag=True, default=False,
                 help="Do not check that ZooKeeper's certificate names the host connected to (logged as a "
                      "warning; the certificate is still checked against the CA)."),
)


def zk_tls_options(f):
    """Add the ``--zk-tls-*`` options to a command callback, passed on as one ``zk_tls``
    argument: a checked :class:`coordinator.zktls.ZkTls`, or None (plaintext)."""

    @functools.wraps(f)
    def callback(*args, zk_tls_ca, zk_tls_cert, zk_tls_key, zk_tls_key_password_file, zk_tls_no_verify_hostname,
                 **kwargs):
        tls = zktls.from_options(zk_tls_ca, zk_tls_cert, zk_tls_key, zk_tls_key_password_file,
                                 zk_tls_no_verify_hostname)
        return f(*args, zk_tls=tls, **kwargs)

    for option in reversed(ZK_TLS_OPTIONS):
        callback = option(callback)
    return callback


def take_tls(values: dict, source: str) -> Optional["zktls.ZkTls"]:
    """A config file's ``[zookeeper.tls]`` table (taken out of ``values``), checked; None without one."""
    table = values.pop("zookeeper", None)
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) - {"tls"}:
        raise InvalidConfig(f"{source}: [zookeeper] takes one table, [zookeeper.tls]")
    return zktls.parse_tls(table.get("tls"), f"{source}: [zookeeper.tls]")
