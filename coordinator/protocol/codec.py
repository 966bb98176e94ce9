"""The rules every zkgroups znode follows: compact JSON with sorted keys, a ``version``, and
decoders that raise :class:`~coordinator.errors.CorruptZnode` with the path and what was
wrong (so a znode written by someone else never takes down more than the thing it describes)."""
from __future__ import annotations

import json
import time

from coordinator.errors import CorruptZnode


def dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def load(raw: bytes, path: str, what: str) -> dict:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
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
