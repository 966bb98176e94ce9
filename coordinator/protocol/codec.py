"""The rules every zkgroups znode follows: compact JSON with sorted keys, a ``version``, and
decoders that raise :class:`~coordinator.errors.CorruptZnode` with the path and what was
wrong (so a znode written by someone else never takes down more than the thing it describes)."""
from __future__ import annotations

import json
import math
import time

from coordinator.errors import CorruptZnode


def dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: int() of it would raise OverflowError in a decoder
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def load(raw: bytes, path: str, what: str) -> dict:
    """The JSON object of a znode; anything else (not UTF-8, not JSON, NaN or an infinite number,
    nested too deep for the parser) is CorruptZnode."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptZnode(path, f"{what} is not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorruptZnode(path, f"{what} is not a JSON object")
    return obj


def require(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise CorruptZnode(path, message)


def check_version(obj: dict, path: str, what: str, supported=(1,)) -> None:
    require(obj.get("version") in supported, path,
             f"{what} has unsupported version {obj.get('version')!r} (supported: {list(supported)})")


def now_ms() -> int:
    return int(time.time() * 1000)


def is_int(value) -> bool:
    """A JSON whole number (not a boolean, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)
