"""Stop signals (SIGTERM, SIGINT) acted on by a thread of their own, never in the handler.

Python runs a signal handler on the main thread between two bytecodes, perhaps while that
thread holds a lock the action takes (an ``Event``'s condition as ``wait()`` returns, a
consumer's fetch lock as a poll wakes up): an action run in the handler can hang the process
for good. So the handler only writes a byte to a pipe, and a daemon thread reads it and acts.
Imports: the standard library only.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable, Optional

#: The signals that ask a zkgroups process to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SIGNALLED, _ENDED = b"s", b"e"


def on_stop_signals(action: Callable[[], None], in_handler: Optional[Callable[[], None]] = None,
                    name: str = "stop-signals") -> Callable[[], None]:
    """Run ``action()`` on a thread named ``name`` at each SIGTERM or SIGINT; returns the undo
    (the previous handlers back, the thread ended). Off the main thread (where Python allows no
    handler) nothing is installed. ``in_handler()``, if given, runs in the handler itself, after
    the byte is written: it may raise, to break what the main thread waits in, and must take no
    lock."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    read_end, write_end = os.pipe()

    def act() -> None:
        while os.read(read_end, 1) == _SIGNALLED:
            action()
        os.close(read_end)
    threading.Thread(target=act, name=name, daemon=True).start()

    def handler(*_) -> None:
        os.write(write_end, _SIGNALLED)
        if in_handler is not None:
            in_handler()
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
        os.write(write_end, _ENDED)
        os.close(write_end)
    return restore
