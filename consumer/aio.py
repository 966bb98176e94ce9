"""``AsyncConsumer``: the :class:`~consumer.consumer.Consumer` for asyncio applications.

``async with AsyncConsumer(group, topics, ...) as consumer:`` then ``await consumer.poll(timeout_ms)``
(a batch, as ``Consumer.poll``), ``async for record in consumer``, ``await consumer.commit()``.
The same groups, fencing, static membership and cooperative rebalancing as ``Consumer``: it is
one, run on a thread of its own.

Guarantees
----------
* **Nothing blocks the event loop.** Every call that may wait (joining the group, ZooKeeper,
  the data plane, a poll's wait) runs on the consumer's own thread (one executor thread, so
  the calls keep the ``Consumer``'s one-thread rule); the loop only awaits it.
* **Iteration hands records out one at a time**, as ``Consumer``'s: ``async for`` takes a
  batch on the consumer's thread and yields it a record at a time; records not yielded yet
  when another call comes (``poll``, ``commit``, ``seek``, ``close``) are given back (their
  partitions sought to the first of them), so no commit passes a record the loop did not see.
* **Rebalance callbacks** run on the consumer's thread inside its poll, as ``Consumer``'s
  do; a callback that is a coroutine function runs on the event loop, and the poll waits
  for it (so on_partitions_revoked can commit before the partitions move).

Thread rule: the event loop's thread calls the public methods (one task at a time, as a
``Consumer`` from one thread); ``_held`` is the loop thread's alone. The consumer's thread
runs every ``Consumer`` call and the listener callbacks.
"""
from __future__ import annotations

import asyncio
import enum
import inspect
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Optional, Set

from coordinator.errors import IllegalStateError, ZkGroupsError
from coordinator.lifecycle import Lifecycle
from consumer.config import Topics
from consumer.consumer import Consumer, ConsumerRebalanceListener
from consumer.records import ConsumerRecord, TopicPartition

#: How long one wait of ``async for`` for records lasts on the consumer's thread (it waits again).
POLL_MS = 200


class AsyncState(enum.Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class _Listener(ConsumerRebalanceListener):
    """Runs the application's callbacks; coroutines on the event loop, waited for."""

    def __init__(self, user, loop: asyncio.AbstractEventLoop):
        self._user, self._loop = user, loop

    def _call(self, name: str, partitions: Set[TopicPartition]) -> None:
        result = getattr(self._user, name)(partitions)
        if inspect.isawaitable(result):
            asyncio.run_coroutine_threadsafe(_awaited(result), self._loop).result()

    def on_partitions_revoked(self, revoked):
        self._call("on_partitions_revoked", revoked)

    def on_partitions_assigned(self, assigned):
        self._call("on_partitions_assigned", assigned)

    def on_partitions_lost(self, lost):
        self._call("on_partitions_lost", lost)


async def _awaited(awaitable):
    return await awaitable


class AsyncConsumer(Lifecycle[AsyncState]):
    """A :class:`~consumer.consumer.Consumer` (the same arguments) whose calls are awaited.
    ``listener``'s callbacks may be coroutine functions.

    States: NEW ──start() (or ``async with``)──▶ STARTED ──close()──▶ CLOSED; NEW ──close()──▶
    CLOSED. Threads: the module docstring's thread rule."""

    TRANSITIONS = {
        AsyncState.NEW: {AsyncState.STARTED, AsyncState.CLOSED},
        AsyncState.STARTED: {AsyncState.CLOSED},
        AsyncState.CLOSED: set(),
    }

    def __init__(self, group_id: str, topics: Topics = None, pattern: Optional[str] = None, *,
                 listener: Optional[ConsumerRebalanceListener] = None, **kwargs: Any) -> None:
        super().__init__(AsyncState.NEW)
        self._args = (group_id, topics, pattern)
        self._kwargs = kwargs
        self._user_listener = listener or ConsumerRebalanceListener()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aio-consumer")
        self._held: Deque[ConsumerRecord] = deque()
        self.consumer: Optional[Consumer] = None
        self._timeout_ms = kwargs.get("consumer_timeout_ms")

    async def _run(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self) -> "AsyncConsumer":
        """Join the group (the Consumer is built on the consumer's thread)."""
        if not self._set_state(AsyncState.STARTED, expect={AsyncState.NEW}):
            return self
        listener = _Listener(self._user_listener, asyncio.get_running_loop())
        try:
            self.consumer = await self._run(lambda: Consumer(*self._args, listener=listener, **self._kwargs))
        except BaseException:
            self._set_state(AsyncState.CLOSED)
            self._thread.shutdown(wait=False)
            raise
        return self

    def _open(self) -> Consumer:
        if self.consumer is None or self._state is not AsyncState.STARTED:
            raise IllegalStateError("consumer is not started" if self._state is AsyncState.NEW
                                    else "consumer is closed")
        return self.consumer

    # ------------------------------------------------------------ records

    async def poll(self, timeout_ms: int = 0, max_records: Optional[int] = None
                   ) -> Dict[TopicPartition, List[ConsumerRecord]]:
        """``Consumer.poll`` on the consumer's thread (rebalance callbacks run inside it)."""
        consumer = self._open()
        await self._give_back()
        return await self._run(consumer.poll, timeout_ms, max_records)

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record, waiting up to ``consumer_timeout_ms`` (default: until closed)."""
        if self._held:
            return self._held.popleft()
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout_ms is None else loop.time() + self._timeout_ms / 1000.0
        while self._state is AsyncState.STARTED:
            wait = POLL_MS if deadline is None else max(0, min(POLL_MS, (deadline - loop.time()) * 1000.0))
            batch = await self._run(self._open().poll, wait, None)
            for records in batch.values():
                self._held.extend(records)
            if self._held:
                return self._held.popleft()
            if deadline is not None and loop.time() >= deadline:
                break
        raise StopAsyncIteration

    async def _give_back(self) -> None:
        """Seek the partitions of records held and not yielded back to the first of them."""
        if not self._held:
            return
        first: Dict[TopicPartition, int] = {}
        for r in self._held:
            first.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        self._held.clear()
        await self._run(self._seek_all, first)

    def _seek_all(self, first: Dict[TopicPartition, int]) -> None:
        for tp, offset in first.items():
            try:
                self.consumer.seek(tp, offset)
            except ZkGroupsError:  # no longer owned: its next owner starts at the committed offset
                continue

    # ------------------------------------------------------------ offsets and the rest

    async def commit(self, offsets: Optional[Dict[TopicPartition, int]] = None) -> None:
        """``Consumer.commit``: by default the positions of every record handed out."""
        consumer = self._open()
        await self._give_back()
        await self._run(consumer.commit, offsets)

    async def committed(self, tp: TopicPartition) -> Optional[int]:
        return await self._run(self._open().committed, tp)

    async def position(self, tp: TopicPartition) -> int:
        await self._give_back()
        return await self._run(self._open().position, tp)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        await self._give_back()
        await self._run(self._open().seek, tp, offset)

    async def assignment(self) -> Set[TopicPartition]:
        return await self._run(self._open().assignment)

    async def pause(self, *partitions: TopicPartition) -> None:
        await self._give_back()
        await self._run(self._open().pause, *partitions)

    async def resume(self, *partitions: TopicPartition) -> None:
        await self._run(self._open().resume, *partitions)

    def wakeup(self) -> None:
        """Interrupt a poll waiting on the consumer's thread (safe from anywhere)."""
        if self.consumer is not None:
            self.consumer.wakeup()

    async def close(self, autocommit: bool = True) -> None:
        """Give back what was not yielded, then ``Consumer.close`` on the consumer's thread."""
        if self._set_state(AsyncState.CLOSED, expect={AsyncState.NEW}):
            self._thread.shutdown(wait=False)
            return
        if self.consumer is None or self.consumer.closing:
            return
        await self._give_back()
        self._set_state(AsyncState.CLOSED, expect={AsyncState.STARTED})
        try:
            await self._run(self.consumer.close, autocommit)
        finally:
            self._thread.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncConsumer":
        return await self.start()

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        """Close; without committing when an exception leaves the block (as ``Consumer``)."""
        await self.close(autocommit=exc_type is None)
