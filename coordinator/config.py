"""Configuration as dataclasses of defaults: unknown keys are rejected with a clear error.

Keys may use dashes or underscores (``rebalance-timeout-ms`` or ``rebalance_timeout_ms``), so
one TOML file can serve the CLIs and the library.
"""
from __future__ import annotations

import dataclasses
import difflib
import sys
from typing import Any, Mapping, Type, TypeVar

from coordinator.errors import InvalidConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")


def build(cls: Type[T], values: Mapping[str, Any], source: str = "config") -> T:
    """Instantiate dataclass ``cls`` from ``values``, rejecting unknown keys and wrong types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_")
        if key not in fields:
            hint = difflib.get_close_matches(key, fields, n=1)
            raise InvalidConfig(f"{source}: unknown key {raw_key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        default = fields[key].default
        if default is not None and default is not dataclasses.MISSING and value is not None:
            expected = type(default)
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if expected is tuple and isinstance(value, list):
                value = tuple(value)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise InvalidConfig(f"{source}: {raw_key} must be {expected.__name__}, got {value!r}")
        kwargs[key] = value
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate:
        validate()
    return obj


def load_toml(path: str, section: str = "") -> dict:
    """Read a TOML file (optionally one table of it)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidConfig(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidConfig(f"config file {path} is not valid TOML: {e}") from None
    if section:
        data = data.get(section, {})
        if not isinstance(data, dict):
            raise InvalidConfig(f"config file {path}: [{section}] must be a table")
    return data


def positive(obj, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise InvalidConfig(f"{name} must be > 0, got {getattr(obj, name)!r}")
