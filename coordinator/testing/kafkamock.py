"""librdkafka's mock Kafka cluster as a child process, for tests, the demo and benchmarks.

Kafka brokers cannot be installed everywhere we test, but the ``confluent-kafka`` wheel bundles
librdkafka, which contains a mock cluster: real Kafka wire protocol on loopback TCP ports that
any client in any process can reach. confluent-kafka does not wrap its control API
(``rd_kafka_mock_*`` in librdkafka's ``src/rdkafka_mock.h``), so the child calls it through
``ctypes`` on the bundled shared library.

Two halves, two modules:

* the child, ``python -m coordinator.testing.kafkamock_server --brokers 3``
  (:mod:`coordinator.testing.kafkamock_server`): checks that every
  librdkafka symbol it uses exists (else one line on stderr, exit 2: the header marks the API
  experimental, hence the ``kafka`` extra pins the confluent-kafka minor version), creates a
  bare ``rd_kafka_new`` handle and ``rd_kafka_mock_cluster_new(rk, N)``, prints ONE JSON line
  ``{"ok": true, "bootstrap_servers": "127.0.0.1:p1,...", "brokers": N, "librdkafka": "2.16.0",
  "pid": ...}``, then answers JSON-line commands on stdin with one JSON line each (below). It
  exits when stdin closes and is SIGKILLed when its parent dies (PR_SET_PDEATHSIG).
* the parent, :class:`MockKafkaCluster`: starts the child, reads the bootstrap line within a
  bounded wait, and turns each method call into one command.

The line protocol (``id`` is echoed back so a late reply is never taken for the next one)::

    {"id": 7, "cmd": "create_topic", "topic": "t", "partitions": 4, "replication_factor": 1}
    {"id": 7, "ok": true}
    {"id": 8, "cmd": "set_partition_leader", "topic": "t", "partition": 0, "broker": -1}
    {"id": 8, "ok": false, "error": "broker must be a broker id, 1..3"}

    commands and their fields:
      create_topic          topic, partitions, replication_factor
      delete_topic          topic
      broker_down           broker            (-1: every broker)
      broker_up             broker            (-1: every broker)
      set_rtt               broker, ms        (-1: every broker; added to every response)
      advertise             broker, host, port   (the address Metadata gives clients for the broker)
      push_request_errors   api_key, errors   (the next len(errors) requests of that kind fail)
      clear_request_errors  api_key
      push_partition_errors topic, partition, api_key, errors   (partition-level error codes)
      set_partition_leader  topic, partition, broker
      delete_records        topic, partition, before_offset
      start_request_tracking / stop_request_tracking
      requests              clear             -> {"requests": [[broker, api_key, ts_us], ...]}

Guarantees:

* Commands take effect before their reply is sent (librdkafka applies them on the mock's own
  thread and waits); one command at a time.
* Bad input (unknown command, wrong type, out-of-range id, a leader of -1, a per-partition
  command on a topic not made with ``create_topic``, which the mock would otherwise create
  on the fly) gets ``{"ok": false, "error": ...}`` and the server keeps serving.
* The child ends with its parent: stdin EOF (a clean exit 0) or PR_SET_PDEATHSIG (SIGKILL).

What the mock does NOT prove, compared with a real broker (measured with librdkafka 2.16):

* No CreateTopics / CreatePartitions / DeleteTopics / configs / DescribeGroups / ListGroups /
  DeleteRecords requests from clients: topics come from ``create_topic`` (clients' requests
  for an unknown topic auto-create it with 4 partitions). A topic cannot grow, so partition
  growth is not testable here.
* ListOffsets by timestamp returns -1 (``offsets_for_times`` is untestable); earliest and
  latest work.
* Each partition keeps only its last 5 MiB or 100,000 batches, in memory; older data is
  dropped silently. Size test data under ~5 MiB a partition.
* A leaderless partition (leader -1) crashes the mock on the next Produce or Fetch, so this
  server refuses that command.
* Transactions do not fence a second producer with the same ``transactional.id``;
  TxnOffsetCommit is accepted but not stored.
* No replication semantics: the high watermark is the log end, and a broker "down" only
  refuses connections (its data stays; no leader moves on its own). No durability beyond the
  process, no ``__consumer_offsets``, retention, compaction, quotas, ACLs, SASL/TLS,
  controller, KRaft or ZooKeeper (``/brokers/topics`` is never written).
* Offset commits of a group that never joins are not fenced (Apache Kafka behaves the same):
  ownership fencing stays in ZooKeeper.
* kafka-python 3.x needs ``api_version=(2, 3)`` to bootstrap against it.
"""
from __future__ import annotations

import collections
import contextlib
import enum
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from coordinator.lifecycle import Lifecycle

ALL_BROKERS = -1
MAX_BROKERS = 32
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")  # Kafka's legal topic names
ADVERTISED_HOST = re.compile(r"^[a-zA-Z0-9.-]{1,253}$")
INSTALL_HINT = "pip install -e '.[kafka]' (it pins the confluent-kafka whose mock API was checked)"


class ApiKey(enum.IntEnum):
    """Kafka protocol request types (the ``api_key`` of injected errors and tracked requests)."""
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14


class ErrorCode(enum.IntEnum):
    """Kafka protocol error codes to inject, plus librdkafka's own ``_TRANSPORT``."""
    TRANSPORT = -195  # librdkafka: the mock broker drops the connection instead of answering
    OFFSET_OUT_OF_RANGE = 1
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29


class MockKafkaUnavailable(RuntimeError):
    """The mock cluster cannot run here (confluent-kafka missing, mock API missing, no start)."""


class MockKafkaError(RuntimeError):
    """A command the mock server refused or could not carry out; ``code`` is librdkafka's."""

    def __init__(self, command: str, error: str, code: Optional[int] = None):
        super().__init__(f"kafka mock {command}: {error}")
        self.command, self.error, self.code = command, error, code


class TrackedRequest(NamedTuple):
    broker_id: int
    api_key: int
    timestamp_us: int


# ================================================================ parent: the test's side

_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EOF = None


class ClusterState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class MockKafkaCluster(Lifecycle[ClusterState]):
    """A mock Kafka cluster of ``brokers`` brokers (ids 1..N) in a child process.

    ::

        with MockKafkaCluster(brokers=3) as cluster:     # start(); close() at the end
            cluster.create_topic("orders", partitions=4)
            Producer({"bootstrap.servers": cluster.bootstrap_servers, ...})
            cluster.broker_down(1); ...; cluster.broker_up(1)

    States: NEW --start()--> RUNNING --close()--> CLOSED. A failed ``start()`` ends CLOSED;
    ``start()`` twice raises; ``close()`` twice is a no-op. A command on a cluster whose child
    has exited raises :class:`MockKafkaError`.

    Thread rules: any thread may call any method. One lock covers a command's request and its
    reply, so commands from several threads run one at a time. Two reader threads own the
    child's stdout (replies, into a queue) and stderr (its last lines, for error messages).
    Call ``start()`` from a thread that lives as long as the cluster (the main thread, say):
    the kernel's parent-death signal follows the thread that started the child.

    ``preexec_fn`` runs in the child before exec (e.g. entering a network namespace). The
    brokers listen on the child's loopback; :meth:`advertise` makes Metadata name another
    address (one that reaches those ports, e.g. through a DNAT rule of the child's namespace).
    """

    TRANSITIONS = {
        ClusterState.NEW: {ClusterState.RUNNING, ClusterState.CLOSED},
        ClusterState.RUNNING: {ClusterState.CLOSED},
        ClusterState.CLOSED: set(),
    }

    def __init__(self, brokers: int = 3, command_timeout: float = 10.0,
                 preexec_fn: Optional[Callable[[], None]] = None):
        if not 1 <= brokers <= MAX_BROKERS:
            raise ValueError(f"brokers must be 1..{MAX_BROKERS}, not {brokers}")
        super().__init__(ClusterState.NEW)
        self.brokers, self.command_timeout, self.preexec_fn = brokers, command_timeout, preexec_fn
        self.librdkafka_version: Optional[str] = None
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._replies: "queue.Queue[Optional[str]]" = queue.Queue()
        self._stderr_tail: "collections.deque[str]" = collections.deque(maxlen=50)
        self._readers: Dict[str, threading.Thread] = {}
        self._bootstrap_servers: Optional[str] = None
        self._next_id = 0

    # ---- lifecycle

    def start(self, timeout: float = 10.0) -> "MockKafkaCluster":
        with self._lock:
            if not self._start_once(ClusterState.RUNNING):
                return self  # started before
            try:
                self._spawn()
                hello = self._read_reply(time.monotonic() + timeout, "start", timeout)
                if not hello.get("ok") or not isinstance(hello.get("bootstrap_servers"), str):
                    raise MockKafkaError("start", f"it said {hello!r}")
            except BaseException as e:
                self._set_state(ClusterState.CLOSED)
                self._stop_child(0)
                if isinstance(e, MockKafkaError):
                    raise MockKafkaUnavailable(f"the kafka mock server did not start: {e.error}") from None
                raise
            self._bootstrap_servers = hello["bootstrap_servers"]
            self.librdkafka_version = hello.get("librdkafka")
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Close the child's stdin (it exits by itself); SIGKILL it if it has not within ``timeout``."""
        with self._lock:
            if self._set_state(ClusterState.CLOSED):
                self._stop_child(timeout)

    def __enter__(self) -> "MockKafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def bootstrap_servers(self) -> str:
        """``host:port,...`` of every broker, for a client's ``bootstrap.servers``."""
        if self._bootstrap_servers is None:
            raise RuntimeError("MockKafkaCluster is not started")
        return self._bootstrap_servers

    @property
    def ports(self) -> List[int]:
        """The brokers' ports, broker 1 first (they listen on the child's loopback)."""
        return [int(address.rsplit(":", 1)[1]) for address in self.bootstrap_servers.split(",")]

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._state is ClusterState.RUNNING and self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> Optional[int]:
        """The child's exit status once it has ended (0: it saw stdin close), else None."""
        return self._proc.poll() if self._proc else None

    def stderr_tail(self) -> List[str]:
        """The child's last lines on stderr (librdkafka warnings, a start-up error)."""
        return list(self._stderr_tail)

    # ---- commands

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        """The only way to get a chosen partition count (clients auto-create 4-partition topics)."""
        self._command("create_topic", topic=name, partitions=partitions, replication_factor=replication_factor)

    def delete_topic(self, name: str) -> None:
        self._command("delete_topic", topic=name)

    def broker_down(self, broker_id: int) -> None:
        """Drop the broker's connections and refuse new ones; its data and leaderships stay."""
        self._command("broker_down", broker=broker_id)

    def broker_up(self, broker_id: int) -> None:
        self._command("broker_up", broker=broker_id)

    def advertise(self, host: str) -> None:
        """Metadata names ``host`` (same ports) for every broker from now on, and so does
        :attr:`bootstrap_servers`."""
        ports = self.ports
        for broker_id, port in enumerate(ports, 1):
            self._command("advertise", broker=broker_id, host=host, port=port)
        self._bootstrap_servers = ",".join(f"{host}:{port}" for port in ports)

    def set_rtt(self, broker_id: int, ms: int) -> None:
        """Delay each response of the broker (``ALL_BROKERS``: every broker) by ``ms``."""
        self._command("set_rtt", broker=broker_id, ms=ms)

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """The next ``len(errors)`` requests of ``api_key`` (to any broker) fail with these codes, in order."""
        self._command("push_request_errors", api_key=int(api_key), errors=[int(e) for e in errors])

    def clear_request_errors(self, api_key: int) -> None:
        self._command("clear_request_errors", api_key=int(api_key))

    def push_partition_errors(self, topic: str, partition: int, api_key: int, errors: Sequence[int]) -> None:
        """Partition-level error codes for the next requests of ``api_key`` naming this partition."""
        self._command("push_partition_errors", topic=topic, partition=partition, api_key=int(api_key),
                      errors=[int(e) for e in errors])

    def set_partition_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the leader; clients follow through Metadata. A leader of -1 is refused (it crashes the mock)."""
        self._command("set_partition_leader", topic=topic, partition=partition, broker=broker_id)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Advance the partition's log start to ``before_offset`` (older records are gone)."""
        self._command("delete_records", topic=topic, partition=partition, before_offset=before_offset)

    def start_request_tracking(self) -> None:
        """Record every request the brokers receive from now on (cleared at start; grows until stopped)."""
        self._command("start_request_tracking")

    def stop_request_tracking(self) -> None:
        self._command("stop_request_tracking")

    def requests(self, clear: bool = False) -> List[TrackedRequest]:
        """Requests recorded since tracking started (or the last ``clear``)."""
        reply = self._command("requests", clear=clear)
        return [TrackedRequest(*entry) for entry in reply["requests"]]

    # ---- plumbing

    def _command(self, cmd: str, **fields: Any) -> dict:
        with self._lock:
            if self._state is not ClusterState.RUNNING:
                raise MockKafkaError(cmd, f"the cluster is {self._state.value}")
            self._next_id += 1
            request_id = self._next_id
            try:
                self._proc.stdin.write(json.dumps({"id": request_id, "cmd": cmd, **fields}) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                raise MockKafkaError(cmd, self._exit_reason()) from None
            deadline = time.monotonic() + self.command_timeout
            while True:
                reply = self._read_reply(deadline, cmd, self.command_timeout)
                if reply.get("id") == request_id:
                    break  # older ids are late replies to commands that timed out
        if not reply.get("ok"):
            raise MockKafkaError(cmd, reply.get("error", "no error given"), reply.get("code"))
        return reply

    def _spawn(self) -> None:
        env = dict(os.environ)
        # The child runs this very module, whatever the parent's sys.path or working directory
        # (``-m`` puts the working directory first on the child's sys.path).
        env["PYTHONPATH"] = _PROJECT_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator.testing.kafkamock_server", "--brokers", str(self.brokers),
             "--parent-pid", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=_PROJECT_ROOT, start_new_session=True, preexec_fn=self.preexec_fn)
        for name, stream, sink in (("stdout", self._proc.stdout, self._replies.put),
                                   ("stderr", self._proc.stderr, self._stderr_tail.append)):
            reader = threading.Thread(target=_pump, args=(stream, sink, name == "stdout"),
                                      name=f"kafkamock-{name}-{self._proc.pid}", daemon=True)
            reader.start()
            self._readers[name] = reader

    def _read_reply(self, deadline: float, what: str, limit: float) -> dict:
        try:
            line = self._replies.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            raise MockKafkaError(what, f"no reply from the mock server (pid {self.pid}) within {limit:g}s") from None
        if line is _EOF:
            self._replies.put(_EOF)  # every later read sees the end too
            raise MockKafkaError(what, self._exit_reason())
        try:
            return json.loads(line)
        except ValueError:
            raise MockKafkaError(what, f"not a JSON reply: {line.strip()[:200]!r}") from None

    def _exit_reason(self) -> str:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(2)
        if "stderr" in self._readers:  # let stderr drain so its last line is there
            self._readers["stderr"].join(1)
        last = self._stderr_tail[-1].strip() if self._stderr_tail else "no message"
        return f"the mock server exited (code {code}): {last}"

    def _stop_child(self, timeout: float) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        for reader in self._readers.values():
            reader.join(2)


def _pump(stream, sink: Callable[[Optional[str]], None], mark_end: bool) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in stream:
            sink(line)
    if mark_end:
        sink(_EOF)
