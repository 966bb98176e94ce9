"""Configuration as dataclasses of defaults: unknown keys are rejected with a clear error.

Keys may use dashes or underscores (``rebalance-timeout-ms`` or ``rebalance_timeout_ms``), so
one TOML file can serve the CLIs and the library. Every problem with a file (missing, a
directory, unreadable, too large, not TOML, a section that is not a table, a value of the
wrong type) is an :class:`InvalidConfig` whose one-line message names the file.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
from typing import Any, Mapping, Optional, Type, TypeVar

from coordinator.errors import InvalidConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")

#: Environment variables every tool and the library read for their defaults.
ENV_ZK_CONNECT = "ZK_CONNECT"
ENV_DATA_DIR = "ZKGROUPS_DATA_DIR"
DEFAULT_CONNECT = "127.0.0.1:2181"
DEFAULT_DATA_DIR = "./data"
#: The ZooKeeper session timeout of every node, member and tool unless configured otherwise.
DEFAULT_SESSION_TIMEOUT_MS = 6000


def default_connect() -> str:
    """``$ZK_CONNECT``, else 127.0.0.1:2181."""
    return os.environ.get(ENV_ZK_CONNECT) or DEFAULT_CONNECT


def default_data_dir() -> str:
    """``$ZKGROUPS_DATA_DIR``, else ./data."""
    return os.environ.get(ENV_DATA_DIR) or DEFAULT_DATA_DIR

MAX_CONFIG_BYTES = 1 << 20  # a configuration file is small; this bounds reading a wrong path (/dev/zero)


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def refuse_unknown(source: str, raw_key: str, known, hints: Optional[Mapping[str, str]] = None) -> None:
    """Raise InvalidConfig for an unknown key: what to use instead if ``hints`` knows the key,
    else the closest known key if one is close."""
    key = raw_key.replace("-", "_")
    if hints and key in hints:
        raise InvalidConfig(f"{source}: {raw_key!r} is not taken here: {hints[key]}")
    close = difflib.get_close_matches(key, known, n=1)
    raise InvalidConfig(f"{source}: unknown key {raw_key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))


def build(cls: Type[T], values: Mapping[str, Any], source: str = "config",
          hints: Optional[Mapping[str, str]] = None) -> T:
    """Instantiate dataclass ``cls`` from ``values``, rejecting unknown keys and wrong types.
    ``hints``: {a key another client takes: what to use here instead}, for its refusal."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_")
        if key not in fields:
            refuse_unknown(source, raw_key, fields, hints)
        default = fields[key].default
        if default is not None and default is not dataclasses.MISSING and value is not None:
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if expected is tuple and isinstance(value, list):
                value = tuple(value)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise InvalidConfig(f"{source}: {raw_key} must be {expected.__name__}, got {_shown(value)}")
            if expected is float and not math.isfinite(value):
                raise InvalidConfig(f"{source}: {raw_key} must be a finite number, got {value!r}")
        kwargs[key] = value
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate:
        validate()
    return obj


def read_small_file(path: str, what: str, limit: int) -> bytes:
    """The bytes of a file of at most ``limit`` bytes; every problem is one InvalidConfig line
    naming ``what`` and the path (never the content)."""
    if os.path.isdir(path):
        raise InvalidConfig(f"{what} {path} is a directory")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise InvalidConfig(f"{what} {path} does not exist") from None
    except PermissionError:
        raise InvalidConfig(f"{what} {path} is not readable (permission denied)") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise InvalidConfig(f"{what} {path} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) > limit:
        raise InvalidConfig(f"{what} {path} is larger than {limit // 1024 or limit} {'KiB' if limit >= 1024 else 'bytes'}")
    return raw


def load_toml(path: str, table: str = "") -> dict:
    """Read a TOML file: its ``[table]`` if it has one, else the whole file (the one rule for
    every tool and the library: settings at the top level, or in the tool's own table)."""
    raw = read_small_file(path, "config file", MAX_CONFIG_BYTES)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidConfig(f"config file {path} is not valid TOML: it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidConfig(f"config file {path} is not valid TOML: {e}") from None
    if table in data:
        data = data[table]
        if not isinstance(data, dict):
            raise InvalidConfig(f"config file {path}: [{table}] must be a table, got {_shown(data)}")
    return data


def take(values: dict, key: str, kind: type, source: str, default=None):
    """Remove ``key`` (spelled with dashes or underscores) from ``values`` and return it, or
    ``default`` when absent; a value that is not a ``kind`` raises InvalidConfig."""
    found = [k for k in dict.fromkeys((key, key.replace("_", "-"))) if k in values]
    if len(found) > 1:
        raise InvalidConfig(f"{source}: {found[0]} is given twice (as {found[0]} and {found[1]})")
    if not found:
        return default
    value = values.pop(found[0])
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise InvalidConfig(f"{source}: {found[0]} must be {_TYPE_NAMES.get(kind, kind.__name__)}, got {_shown(value)}")
    if kind is float and not math.isfinite(value):
        raise InvalidConfig(f"{source}: {found[0]} must be a finite number, got {value!r}")
    return value


_TYPE_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}


def positive(obj, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise InvalidConfig(f"{name} must be > 0, got {getattr(obj, name)!r}")


def check_kafka_properties(properties, source: str) -> dict:
    """librdkafka properties: a table of names to strings, numbers or booleans (the values are
    never shown: they may be secrets). TOML reads an unquoted ``security.protocol = "SSL"`` as
    a nested table; it is flattened back into the dotted name."""
    if not isinstance(properties, dict):
        raise InvalidConfig(f"{source} must be a table of librdkafka properties")
    flat = {}
    for key, value in properties.items():
        if isinstance(value, dict):
            for inner, inner_value in check_kafka_properties(value, f"{source}: {key}").items():
                flat[f"{key}.{inner}"] = inner_value
        elif isinstance(value, (str, int, float, bool)):
            flat[key] = value
        else:
            raise InvalidConfig(f"{source}: {key} must be a string, number or boolean, got a {type(value).__name__}")
    return flat
