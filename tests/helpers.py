"""Small helpers shared by the tests: bounded waits on conditions, never blind sleeps."""
from __future__ import annotations

import time


def wait_for(condition, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition()`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # a condition may read state that is not there yet
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {message}"
                         + (f" (last error: {last_error!r})" if last_error else ""))
