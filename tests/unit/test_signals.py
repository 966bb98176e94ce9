"""Stop signals acted on by a thread (coordinator.signals): real signals to this process."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from coordinator.signals import on_stop_signals


class Stopping(Exception):
    pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sent_while_the_main_thread_is_inside_an_events_lock_sets_it_from_another_thread(sig):
    """An Event's set() takes its condition's lock: run in a handler that came while the main
    thread held it (as wait() returns), it would hang the process. The action runs elsewhere."""
    stop, acted_on = threading.Event(), []

    def action():
        acted_on.append(threading.current_thread().name)
        stop.set()
    restore = on_stop_signals(action, name="test-signals")
    try:
        with stop._cond:   # what the main thread holds inside Event.wait()
            os.kill(os.getpid(), sig)
            for _ in range(1000):   # a few bytecodes: the handler runs between them
                pass
        assert stop.wait(5) and acted_on == ["test-signals"]
    finally:
        restore()


def test_in_handler_may_raise_on_the_main_thread_and_the_action_still_runs():
    """What the main thread waits in (a join that blocks on ZooKeeper) is broken by an exception
    raised in the handler; the byte was written first, so the action runs too."""
    stop = threading.Event()

    def interrupt():
        raise Stopping()
    restore = on_stop_signals(stop.set, in_handler=interrupt)
    try:
        with pytest.raises(Stopping):
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(5)
        assert stop.wait(5)
    finally:
        restore()


def test_the_undo_puts_the_previous_handlers_back_and_ends_the_thread():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    restore = on_stop_signals(lambda: None, name="test-undo")
    assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    restore()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    thread = next((t for t in threading.enumerate() if t.name == "test-undo"), None)
    if thread is not None:
        thread.join(5)
        assert not thread.is_alive()


def test_off_the_main_thread_nothing_is_installed():
    before, undo = signal.getsignal(signal.SIGTERM), []
    worker = threading.Thread(target=lambda: undo.append(on_stop_signals(lambda: None)))
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGTERM) is before
    undo[0]()
