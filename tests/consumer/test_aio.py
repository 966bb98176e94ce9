"""AsyncConsumer against a real ZooKeeper, a running coordinator and the embedded log: the
consumer tests' scenarios that apply, through the async API, and the event loop never held by
a blocking call (asyncio's debug mode names any callback that ran longer than a bound)."""
from __future__ import annotations

import asyncio
import logging

import pytest

from consumer import AsyncConsumer, ConsumerRebalanceListener, TopicPartition
from tests.support.helpers import committed, fill

#: A callback running this long on the loop is a blocking call (a poll waits 200 ms): far above
#: a scheduling hiccup, far below any wait of the consumer's.
BLOCKED_S = 0.1


def run(coro):
    """Run ``coro`` in debug mode; fail if any callback held the loop for BLOCKED_S or more."""
    slow = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "Executing" in record.getMessage():
                slow.append(record.getMessage())
    handler = Catch()
    logging.getLogger("asyncio").addHandler(handler)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = BLOCKED_S
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
        logging.getLogger("asyncio").removeHandler(handler)
        assert slow == [], slow


@pytest.fixture
def make(zk_connect, data_dir):
    def build(group="g", topics=("t",), **config):
        config.setdefault("auto_offset_reset", "earliest")
        return AsyncConsumer(group, list(topics), zk=zk_connect, data_dir=data_dir, session_timeout_ms=2000, **config)
    return build


def test_async_for_consumes_everything_and_commits(cluster, zk, data_dir, make):
    cluster.node("n")
    fill(data_dir, "t", [100] * 3, zk=zk)

    async def main():
        got = []
        async with make(consumer_timeout_ms=3000) as c:
            async for record in c:
                got.append((record.partition, record.offset))
                if len(got) == 300:
                    break
            await c.commit()
        return got
    got = run(main())
    assert sorted(got) == [(p, o) for p in range(3) for o in range(100)]
    assert committed(zk, "g", "t", 3) == {0: 100, 1: 100, 2: 100}


def test_break_leaves_the_position_after_the_last_record_seen(cluster, zk, data_dir, make):
    cluster.node("n")
    fill(data_dir, "t", [50], zk=zk)

    async def main():
        async with make() as c:
            seen = []
            async for record in c:
                seen.append(record.offset)
                if len(seen) == 10:
                    break
            await c.commit()  # what the loop saw, not what the poll fetched
            first = await c.committed(TopicPartition("t", 0))
            batch = {}
            while not batch:
                batch = await c.poll(500)
            return seen, first, [r.offset for r in batch[TopicPartition("t", 0)]]
    seen, first, rest = run(main())
    assert seen == list(range(10)) and first == 10 and rest[0] == 10


def test_poll_batches_and_coroutine_callbacks_through_a_rebalance(cluster, zk, data_dir, make):
    cluster.node("n")
    fill(data_dir, "t", [200] * 4, zk=zk)
    calls = []

    class Listener(ConsumerRebalanceListener):
        def __init__(self, name):
            self.name = name

        async def on_partitions_assigned(self, assigned):
            await asyncio.sleep(0)  # a coroutine, awaited on the loop
            calls.append((self.name, "assigned", len(assigned)))

        async def on_partitions_revoked(self, revoked):
            calls.append((self.name, "revoked", len(revoked)))

    async def main():
        a = await make(listener=Listener("a"), max_poll_records=50).start()
        seen = set()
        while len(seen) < 100:
            for records in (await a.poll(200)).values():
                seen |= {(r.partition, r.offset) for r in records}
        await a.commit()
        b = await make(listener=Listener("b")).start()
        # both keep polling (so both take part in the rebalance) until b has partitions
        while not await b.assignment() or len(await a.assignment()) == 4:
            await asyncio.gather(a.poll(50), b.poll(50))
        await a.close()
        await b.close()
        return seen
    run(main())
    assert calls[0] == ("a", "assigned", 4)
    assert any(name == "a" and what == "revoked" for name, what, _ in calls)
    assert any(name == "b" and what == "assigned" for name, what, _ in calls)
