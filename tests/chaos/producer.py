"""The chaos run's producer: uniquely numbered records, written continuously.

    python -m tests.chaos.producer ZK DATA_DIR TOPIC [--rate RECORDS_PER_S] [--bootstrap-servers B]
                                   [--poison-every N --partitions P]

Values are the decimal sequence numbers 0, 1, 2, ... (keys are absent, so partitions are
filled round robin on the embedded log, at random on Kafka). With ``--poison-every N`` (the
share round of :mod:`tests.chaos.run`) two records in every N carry a key for the share
group's workers: sequence numbers ``n % N == REJECT_AT`` the key ``reject`` (the worker rejects
them: archived, dead-lettered), ``n % N == RETRY_AT`` the key ``retry`` (the worker releases
them every time: archived at the delivery limit); those go to partition ``n % P``, so keyed
records are spread too. On the embedded log the topic's
partition count is read once at start: ZooKeeper may be down for seconds during the run, and
the log on disk is all the producer needs after that. With ``--bootstrap-servers`` the records
go to Kafka (ZooKeeper and DATA_DIR unused) through an idempotent producer, so a retry after a
broker went down never writes a record twice.
SIGTERM stops it: everything sent is flushed, then ``{"produced": N}`` is printed on stdout
and it exits 0.
"""
from __future__ import annotations

import argparse
import json
import signal
import threading
import time

from consumer.producer import Producer
from coordinator.zkclient import close_client, start_client
from coordinator.zktls import from_environment

TICK_S = 0.01
#: Where in every ``--poison-every`` records the keyed ones are.
REJECT_AT, RETRY_AT = 17, 41
REJECT_KEY, RETRY_KEY = b"reject", b"retry"
NEVER_REFRESH_MS = 10 ** 9  # the partition count is fixed for the whole run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.producer")
    parser.add_argument("zk")
    parser.add_argument("data_dir")
    parser.add_argument("topic")
    parser.add_argument("--rate", type=float, default=200.0, help="records per second")
    parser.add_argument("--bootstrap-servers", help="Kafka's brokers: write there instead of the embedded log")
    parser.add_argument("--poison-every", type=int, default=0,
                        help="key two records in every N (reject, retry) for the share group's workers [0: none]")
    parser.add_argument("--partitions", type=int, default=1, help="with --poison-every: the topic's partitions")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    zk = None
    if args.bootstrap_servers:
        producer = Producer(bootstrap_servers=args.bootstrap_servers, kafka={"enable.idempotence": True})
    else:
        zk = start_client(args.zk, tls=from_environment())  # ZK_TLS_* with bin/chaos --zk-tls
        producer = Producer(zk, data_dir=args.data_dir, metadata_max_age_ms=NEVER_REFRESH_MS)
    sent = 0
    started = time.monotonic()
    with producer:
        producer.send(args.topic, b"0")  # reads the partition count while ZooKeeper is surely up
        sent = 1
        while not stop.wait(TICK_S):
            due = int((time.monotonic() - started) * args.rate) + 1
            while sent < due:
                key = poison_key(sent, args.poison_every)
                if key is None:
                    producer.send(args.topic, str(sent).encode())
                else:
                    producer.send(args.topic, str(sent).encode(), key=key, partition=sent % args.partitions)
                sent += 1
    print(json.dumps({"produced": sent}), flush=True)
    if zk is not None:
        close_client(zk)


def poison_key(n: int, every: int):
    """The key of record ``n`` (None: no key)."""
    if every <= 0:
        return None
    return {REJECT_AT % every: REJECT_KEY, RETRY_AT % every: RETRY_KEY}.get(n % every)


if __name__ == "__main__":
    main()
