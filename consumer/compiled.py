"""Whether the compiled code runs: :mod:`consumer._speedups` (C, built by ``setup.py`` where a
compiler and Python's headers are present) or, where it was not built or
``ZKGROUPS_NO_EXTENSIONS`` is set (not to 0), the pure-Python code it stands in for: the
per-record steps of :mod:`consumer.records` and the send fast path of
:mod:`consumer.send_path`. Both behave the same; only their speed differs. Imports nothing
of the project."""
from __future__ import annotations

import os


def extensions_disabled() -> bool:
    """Whether ``ZKGROUPS_NO_EXTENSIONS`` asks for pure Python (set, and not to 0)."""
    return os.environ.get("ZKGROUPS_NO_EXTENSIONS", "") not in ("", "0")


def _load():
    """:mod:`consumer._speedups`, or None: not built, or extensions disabled."""
    if extensions_disabled():
        return None
    try:
        from consumer import _speedups
    except ImportError:
        return None
    return _speedups


SPEEDUPS = _load()
#: Whether the compiled :mod:`consumer._speedups` is in use.
COMPILED = SPEEDUPS is not None
