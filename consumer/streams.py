"""The streams of a ``{topic: n}`` subscription (:meth:`consumer.consumer.Consumer.streams`):
n iterators, each over the partitions assigned to its stream id, fed by one thread that polls.

Threads: the dispatcher thread (:class:`Streams`) polls the consumer and puts batches on the
streams' queues; each :class:`Stream` is iterated by one application thread; ``_lock`` guards
what the streams handed out. The dispatcher uses the consumer's package-internal interface
(``owned_streams``, ``throttle``), never its fields.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Set

from consumer.records import ConsumerRecord, TopicPartition

if TYPE_CHECKING:
    from consumer.consumer import Consumer

log = logging.getLogger("zkgroups.consumer")


class Streams:
    """The dispatcher behind :meth:`Consumer.streams`: polls and hands batches to per-stream
    queues. A stream whose queue is full has its partitions paused, so polling (and with it
    liveness and rebalancing) never waits for a slow stream."""

    QUEUE_BATCHES = 4

    def __init__(self, consumer: Consumer, count: int):
        self.consumer = consumer
        self.queues = [queue.Queue() for _ in range(count)]
        self.iterators = [Stream(self, i) for i in range(count)]
        self._consumed: Dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._throttled: Set[TopicPartition] = set()
        self._thread = threading.Thread(target=self._run, name="streams", daemon=True)
        self._thread.start()

    def consumed(self, partitions) -> Dict[TopicPartition, int]:
        with self._lock:
            return {tp: self._consumed[tp] for tp in partitions if tp in self._consumed}

    def handed_out(self, tp: TopicPartition, offset: int) -> bool:
        """Record that a stream returns this record; False if the partition is gone."""
        if tp not in self.consumer.owned_streams():
            return False
        with self._lock:
            self._consumed[tp] = offset + 1
        return True

    def stop(self) -> None:
        self._stopped.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        for q in self.queues:
            q.put(None)  # wake the iterators: the consumer is closing

    def _run(self) -> None:
        c = self.consumer
        while not self._stopped.is_set():
            owned = c.owned_streams()
            full = {tp for tp, stream in owned.items()
                    if self.queues[_stream_index(stream) % len(self.queues)].qsize() >= self.QUEUE_BATCHES}
            if full != self._throttled:
                c.throttle(full - self._throttled, self._throttled - full)
                self._throttled = full
            try:
                batch = c.poll(timeout_ms=200)
            except Exception as e:  # surface to the stream threads' logs; keep the group alive
                log.error("consumer %s streams: %s", c.consumer_id, e)
                continue
            for tp, records in batch.items():
                stream = owned.get(tp) or c.owned_streams().get(tp)
                if stream is not None:
                    self.queues[_stream_index(stream) % len(self.queues)].put((tp, records))


class Stream:
    """One stream's records, in order per partition; iteration ends when the consumer closes."""

    def __init__(self, streams: Streams, index: int):
        self._streams, self.index = streams, index
        self._batch: List[ConsumerRecord] = []
        self._tp: Optional[TopicPartition] = None
        self._pos = 0

    def __iter__(self):
        return self

    def __next__(self) -> ConsumerRecord:
        while True:
            while self._pos < len(self._batch):
                record = self._batch[self._pos]
                self._pos += 1
                if self._streams.handed_out(self._tp, record.offset):
                    return record
                self._pos = len(self._batch)  # the partition moved: drop the rest
            item = self._streams.queues[self.index].get()
            if item is None:
                self._streams.queues[self.index].put(None)
                raise StopIteration
            self._tp, self._batch = item
            self._pos = 0


def _stream_index(stream: str) -> int:
    return int(stream.rsplit("-", 1)[1])
