"""The child half of :mod:`coordinator.testing.kafkamock`: librdkafka's mock Kafka cluster, made
through ``ctypes`` on the librdkafka that confluent-kafka bundles, steered by JSON-line
commands on stdin (the line protocol, the guarantees and what the mock does not prove are in
:mod:`coordinator.testing.kafkamock`).

Run by :class:`~coordinator.testing.kafkamock.MockKafkaCluster` as
``python -m coordinator.testing.kafkamock_server --brokers N [--parent-pid PID]``.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import importlib.util
import json
import os
import signal
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from coordinator.testing.kafkamock import (ADVERTISED_HOST, ALL_BROKERS, INSTALL_HINT, MAX_BROKERS, TOPIC_NAME,
                                           MockKafkaUnavailable)

_ptr = ctypes.c_void_p
_int = ctypes.c_int  # also rd_kafka_resp_err_t, an enum
_i16, _i32, _i64 = ctypes.c_int16, ctypes.c_int32, ctypes.c_int64
_size = ctypes.c_size_t
_str = ctypes.c_char_p

# Every librdkafka function the server calls: name -> (restype, argtypes).
SIGNATURES: Dict[str, tuple] = {
    "rd_kafka_version_str": (_str, []),
    "rd_kafka_err2name": (_str, [_int]),
    "rd_kafka_err2str": (_str, [_int]),
    "rd_kafka_conf_new": (_ptr, []),
    "rd_kafka_conf_set": (_int, [_ptr, _str, _str, _str, _size]),
    "rd_kafka_new": (_ptr, [_int, _ptr, _str, _size]),
    "rd_kafka_destroy": (None, [_ptr]),
    "rd_kafka_mock_cluster_new": (_ptr, [_ptr, _int]),
    "rd_kafka_mock_cluster_destroy": (None, [_ptr]),
    "rd_kafka_mock_cluster_bootstraps": (_str, [_ptr]),
    "rd_kafka_mock_topic_create": (_int, [_ptr, _str, _int, _int]),
    "rd_kafka_mock_topic_delete": (_int, [_ptr, _str]),
    "rd_kafka_mock_broker_set_down": (_int, [_ptr, _i32]),
    "rd_kafka_mock_broker_set_up": (_int, [_ptr, _i32]),
    "rd_kafka_mock_broker_set_rtt": (_int, [_ptr, _i32, _int]),
    "rd_kafka_mock_broker_set_host_port": (None, [_ptr, _i32, _str, _int]),
    "rd_kafka_mock_push_request_errors_array": (None, [_ptr, _i16, _size, ctypes.POINTER(_int)]),
    "rd_kafka_mock_clear_request_errors": (None, [_ptr, _i16]),
    # Variadic: the error codes follow ``cnt`` as C ints.
    "rd_kafka_mock_partition_push_request_errors": (_int, [_ptr, _str, _i32, _i16, _size]),
    "rd_kafka_mock_partition_set_leader": (_int, [_ptr, _str, _i32, _i32]),
    "rd_kafka_mock_partition_delete_records": (_int, [_ptr, _str, _i32, _i64]),
    "rd_kafka_mock_start_request_tracking": (None, [_ptr]),
    "rd_kafka_mock_stop_request_tracking": (None, [_ptr]),
    "rd_kafka_mock_clear_requests": (None, [_ptr]),
    "rd_kafka_mock_get_requests": (ctypes.POINTER(_ptr), [_ptr, ctypes.POINTER(_size)]),
    "rd_kafka_mock_request_id": (_i32, [_ptr]),
    "rd_kafka_mock_request_api_key": (_i16, [_ptr]),
    "rd_kafka_mock_request_timestamp": (_i64, [_ptr]),
    "rd_kafka_mock_request_destroy_array": (None, [ctypes.POINTER(_ptr), _size]),
}

RD_KAFKA_PRODUCER = 0
PR_SET_PDEATHSIG = 1
MAX_ERRORS_PER_COMMAND = 1000
_VARARGS_CHUNK = 64  # error codes passed per variadic call


def find_librdkafka() -> str:
    """Path of the librdkafka that confluent-kafka uses (the wheel bundles its own copy)."""
    if importlib.util.find_spec("confluent_kafka") is None:
        raise MockKafkaUnavailable(f"confluent-kafka is not installed: {INSTALL_HINT}")
    try:
        import confluent_kafka  # loads librdkafka into this process
    except ImportError as e:
        raise MockKafkaUnavailable(f"confluent-kafka cannot be imported ({e}): {INSTALL_HINT}") from None
    # The copy already mapped into this process is the one confluent-kafka was built with.
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("librdkafka"):
                    return path
    package = os.path.dirname(confluent_kafka.__file__)
    candidates = sorted(glob.glob(os.path.join(package + ".libs", "librdkafka*"))  # auditwheel
                        + glob.glob(os.path.join(package, ".dylibs", "librdkafka*")))  # delocate
    if candidates:
        return candidates[0]
    import ctypes.util
    system = ctypes.util.find_library("rdkafka")
    if system:
        return system
    raise MockKafkaUnavailable(f"no librdkafka found next to confluent_kafka in {package}")


def missing_symbols(lib: Any, names: Sequence[str]) -> List[str]:
    return [name for name in names if not hasattr(lib, name)]


def bind_librdkafka(lib: Any, signatures: Dict[str, tuple], where: str) -> None:
    """Set restype/argtypes of every function in ``signatures``; one-line error if any is missing."""
    missing = missing_symbols(lib, list(signatures))
    if missing:
        raise MockKafkaUnavailable(
            f"librdkafka at {where} lacks {', '.join(missing)}: its mock API is experimental "
            f"and changes between releases; {INSTALL_HINT}")
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes


class CommandError(Exception):
    """Bad input or a refused command; becomes ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, code: Optional[int] = None):
        super().__init__(error)
        self.code = code


class MockServer:
    """The child's mock cluster and its command handlers.

    Thread rules: only the thread that runs :func:`serve` calls :meth:`handle`; librdkafka runs
    the brokers on threads of its own, and its mock functions are safe to call from any thread.
    """

    def __init__(self, lib: Any, brokers: int):
        self.lib, self.brokers = lib, brokers
        self.topics: Dict[str, int] = {}  # made with create_topic: name -> partition count
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        for key, value in (("client.id", "zkgroups-kafkamock"), ("log_level", "4")):
            lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, len(errstr))
        self.rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))  # takes conf
        if not self.rk:
            raise MockKafkaUnavailable(f"rd_kafka_new failed: {errstr.value.decode(errors='replace')}")
        self.cluster = lib.rd_kafka_mock_cluster_new(self.rk, brokers)
        if not self.cluster:
            lib.rd_kafka_destroy(self.rk)
            raise MockKafkaUnavailable(f"rd_kafka_mock_cluster_new({brokers}) failed")
        self.bootstrap_servers = lib.rd_kafka_mock_cluster_bootstraps(self.cluster).decode()
        self.handlers: Dict[str, Callable[[dict], dict]] = {
            "create_topic": self._create_topic,
            "delete_topic": self._delete_topic,
            "broker_down": lambda req: self._check(self.lib.rd_kafka_mock_broker_set_down(
                self.cluster, self._broker(req, allow_all=True))),
            "broker_up": lambda req: self._check(self.lib.rd_kafka_mock_broker_set_up(
                self.cluster, self._broker(req, allow_all=True))),
            "set_rtt": lambda req: self._check(self.lib.rd_kafka_mock_broker_set_rtt(
                self.cluster, self._broker(req, allow_all=True), _field(req, "ms", int, 0, 600_000))),
            "advertise": self._advertise,
            "push_request_errors": self._push_request_errors,
            "clear_request_errors": self._clear_request_errors,
            "push_partition_errors": self._push_partition_errors,
            "set_partition_leader": self._set_partition_leader,
            "delete_records": self._delete_records,
            "start_request_tracking": self._void(lib.rd_kafka_mock_start_request_tracking),
            "stop_request_tracking": self._void(lib.rd_kafka_mock_stop_request_tracking),
            "requests": self._requests,
        }

    def close(self) -> None:
        self.lib.rd_kafka_mock_cluster_destroy(self.cluster)
        self.lib.rd_kafka_destroy(self.rk)

    def handle(self, line: str) -> dict:
        """One request line -> one reply; never raises."""
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not a JSON line"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "a command is a JSON object"}
        reply: Dict[str, Any] = {"id": request["id"]} if "id" in request else {}
        handler = self.handlers.get(request.get("cmd"))  # type: ignore[arg-type]
        try:
            if handler is None:
                raise CommandError(f"unknown command {request.get('cmd')!r}; "
                                   f"commands: {', '.join(sorted(self.handlers))}")
            reply.update({"ok": True}, **handler(request))
        except CommandError as e:
            reply.update(ok=False, error=str(e), **({"code": e.code} if e.code is not None else {}))
        except Exception as e:  # a bug here must not take the cluster down with it
            reply.update(ok=False, error=f"internal error: {e!r}")
        return reply

    # ---- validation

    def _broker(self, request: dict, allow_all: bool = False) -> int:
        broker = _field(request, "broker", int)
        if not (1 <= broker <= self.brokers or (allow_all and broker == ALL_BROKERS)):
            raise CommandError(f"broker must be a broker id, 1..{self.brokers}"
                               + (" (or -1: every broker)" if allow_all else ""))
        return broker

    def _partition(self, request: dict) -> tuple:
        """The (topic as bytes, partition) of a per-partition command, known to exist."""
        topic = _topic(request)
        if topic not in self.topics:
            raise CommandError(f"unknown topic {topic!r}: create it with create_topic first")
        partition = _field(request, "partition", int, 0, self.topics[topic] - 1)
        return topic.encode(), partition

    def _check(self, err: int) -> dict:
        if err:
            name = self.lib.rd_kafka_err2name(err).decode()
            text = self.lib.rd_kafka_err2str(err).decode()
            raise CommandError(f"{name}: {text}", code=err)
        return {}

    # ---- handlers

    def _create_topic(self, request: dict) -> dict:
        topic = _topic(request)
        partitions = _field(request, "partitions", int, 1, 100_000)
        replication_factor = _field(request, "replication_factor", int, 1, self.brokers)
        self._check(self.lib.rd_kafka_mock_topic_create(
            self.cluster, topic.encode(), partitions, replication_factor))
        self.topics[topic] = partitions
        return {}

    def _delete_topic(self, request: dict) -> dict:
        topic = _topic(request)
        self._check(self.lib.rd_kafka_mock_topic_delete(self.cluster, topic.encode()))
        self.topics.pop(topic, None)
        return {}

    def _advertise(self, request: dict) -> dict:
        host = _field(request, "host", str)
        if not ADVERTISED_HOST.match(host):
            raise CommandError(f"bad host {host!r}: a host name or an IPv4 address")
        self.lib.rd_kafka_mock_broker_set_host_port(
            self.cluster, self._broker(request), host.encode(), _field(request, "port", int, 1, 65535))
        return {}

    def _push_request_errors(self, request: dict) -> dict:
        errors = _errors(request)
        array = (_int * len(errors))(*errors)
        self.lib.rd_kafka_mock_push_request_errors_array(
            self.cluster, _field(request, "api_key", int, 0, 32767), len(errors), array)
        return {}

    def _clear_request_errors(self, request: dict) -> dict:
        self.lib.rd_kafka_mock_clear_request_errors(self.cluster, _field(request, "api_key", int, 0, 32767))
        return {}

    def _push_partition_errors(self, request: dict) -> dict:
        topic, partition = self._partition(request)
        api_key = _field(request, "api_key", int, 0, 32767)
        errors = _errors(request)
        for start in range(0, len(errors), _VARARGS_CHUNK):
            chunk = errors[start:start + _VARARGS_CHUNK]
            self._check(self.lib.rd_kafka_mock_partition_push_request_errors(
                self.cluster, topic, partition, api_key, len(chunk), *(_int(e) for e in chunk)))
        return {}

    def _set_partition_leader(self, request: dict) -> dict:
        topic, partition = self._partition(request)
        # Never -1: a leaderless partition crashes the mock on the next Produce or Fetch.
        broker = self._broker(request)
        self._check(self.lib.rd_kafka_mock_partition_set_leader(self.cluster, topic, partition, broker))
        return {}

    def _delete_records(self, request: dict) -> dict:
        topic, partition = self._partition(request)
        before = _field(request, "before_offset", int, 0, 2 ** 63 - 1)
        self._check(self.lib.rd_kafka_mock_partition_delete_records(self.cluster, topic, partition, before))
        return {}

    def _void(self, function: Callable) -> Callable[[dict], dict]:
        """A handler for a mock function that takes only the cluster and returns nothing."""
        return lambda request: function(self.cluster) or {}

    def _requests(self, request: dict) -> dict:
        count = _size(0)
        array = self.lib.rd_kafka_mock_get_requests(self.cluster, ctypes.byref(count))
        tracked = []
        if array:
            lib = self.lib
            tracked = [[lib.rd_kafka_mock_request_id(array[i]), lib.rd_kafka_mock_request_api_key(array[i]),
                        lib.rd_kafka_mock_request_timestamp(array[i])] for i in range(count.value)]
            lib.rd_kafka_mock_request_destroy_array(array, count.value)
        if _field(request, "clear", bool, default=False):
            self.lib.rd_kafka_mock_clear_requests(self.cluster)
        return {"requests": tracked}


_MISSING = object()


def _field(request: dict, key: str, kind: type, low: Optional[int] = None, high: Optional[int] = None,
           default: Any = _MISSING) -> Any:
    value = request.get(key, default)
    if value is _MISSING:
        raise CommandError(f"missing field {key!r}")
    # JSON true/false are Python bools, and bool is an int: keep them apart.
    if type(value) is not kind:
        raise CommandError(f"{key} must be {'an integer' if kind is int else kind.__name__}, not {value!r}")
    if kind is int and ((low is not None and value < low) or (high is not None and value > high)):
        raise CommandError(f"{key} must be in {low}..{high}, not {value}")
    return value


def _topic(request: dict) -> str:
    topic = _field(request, "topic", str)
    if not TOPIC_NAME.match(topic) or topic in (".", ".."):
        raise CommandError(f"bad topic name {topic!r}: 1-249 of [a-zA-Z0-9._-]")
    return topic


def _errors(request: dict) -> List[int]:
    errors = _field(request, "errors", list)
    if not 1 <= len(errors) <= MAX_ERRORS_PER_COMMAND or not all(type(e) is int for e in errors):
        raise CommandError(f"errors must be a list of 1..{MAX_ERRORS_PER_COMMAND} integer error codes")
    return errors


def _die_with_parent(parent_pid: Optional[int]) -> None:
    # PR_SET_PDEATHSIG: SIGKILL when the thread that started us dies; if the parent is already
    # gone (it died before this call), go now.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def serve(server: MockServer, lines, out) -> None:
    """Answer each request line with one reply line until ``lines`` ends."""
    for line in lines:
        if line.strip():
            out.write(json.dumps(server.handle(line)) + "\n")
            out.flush()


def _brokers_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BROKERS:
        raise argparse.ArgumentTypeError(f"must be an integer 1..{MAX_BROKERS}, not {text!r}")
    return value


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _OneLineParser(prog="kafkamock", description="librdkafka's mock Kafka cluster, "
                            "steered by JSON-line commands on stdin (see the module docstring).")
    parser.add_argument("--brokers", type=_brokers_arg, default=3, help="number of brokers (ids 1..N)")
    parser.add_argument("--parent-pid", type=int, help="exit at once if this is no longer our parent")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    try:
        path = find_librdkafka()
        lib = ctypes.CDLL(path)
        bind_librdkafka(lib, SIGNATURES, path)
        server = MockServer(lib, args.brokers)
    except (MockKafkaUnavailable, OSError) as e:
        print(f"kafkamock: error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        print(json.dumps({"ok": True, "bootstrap_servers": server.bootstrap_servers, "brokers": args.brokers,
                          "librdkafka": lib.rd_kafka_version_str().decode(), "pid": os.getpid()}), flush=True)
        serve(server, sys.stdin, sys.stdout)
    except (BrokenPipeError, KeyboardInterrupt):
        pass  # the parent went away
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
