"""The fuzz targets: each takes the fuzzer's bytes to one decoder of outside input and lets only
that decoder's documented errors through; anything else (or a hang, or unbounded memory, which
libFuzzer's limits turn into a failure) is a bug. ``SEEDS`` are valid inputs made with the
encoders, the corpus each run starts from.

Imported by :mod:`tests.fuzz.run` under atheris' instrumentation, so the project's modules
must be imported here (not before), for coverage to guide the fuzzer through them.
"""
from __future__ import annotations

import os
import struct
import tempfile
import zlib
from typing import Callable, Dict, List

from coordinator import config as cfg
from coordinator import protocol
from coordinator.coordinator import CoordinatorConfig
from coordinator.errors import CorruptZnode, InvalidConfig, LogCorrupted
from consumer.config import build_consumer_config
from consumer.log import Log
from consumer.log import batch as log_batch

_CRC_FROM = 8
FETCH = 500  # records a fetch returns at most (max_poll_records' default)


def fix_checksum(buf: bytes) -> bytes:
    """``buf`` as a batch whose length and CRC fields are right (else the decoder stops at the
    checksum and the fuzzer never reaches the columns)."""
    if len(buf) < log_batch.HEADER_SIZE:
        return buf
    crc = zlib.crc32(buf[_CRC_FROM:log_batch.HEADER_SIZE], zlib.crc32(buf[log_batch.HEADER_SIZE:]))
    return struct.pack("<II", len(buf) - 4, crc) + buf[_CRC_FROM:]


def _encoded(records, base: int = 0) -> bytes:
    enc = log_batch.Encoded(records)
    return enc.header(base) + b"".join(enc.parts)


def _read_batch(buf: bytes) -> None:
    b = log_batch.decode(buf, "t", 0, "t-0/0.log", 0)
    if b is not None:
        # As the log reads a batch: windows of at most a fetch's records (a batch of empty
        # fixed-size values holds any count in a few bytes), at its start and its end.
        for i in {0, max(0, b.count - FETCH)}:
            j, _ = b.take(i, FETCH, 1 << 20, True)
            b.records(i, j)
            b.columns(i, j).records("t", 0)


def batch(data: bytes) -> None:
    """The batch decoder: ``decode`` (documented: None for a bad checksum, ValueError or
    struct.error for inconsistent columns), then every record and column (LogCorrupted)."""
    try:
        _read_batch(fix_checksum(data))
    except (ValueError, struct.error, LogCorrupted):
        pass


def log(data: bytes) -> None:
    """A segment file of these bytes (each piece ``\\xff\\xfe``-separated made a checksummed
    batch) read through by a :class:`~consumer.log.Log`: only LogCorrupted may come out."""
    pieces = data.split(b"\xff\xfe")
    raw = b"".join(fix_checksum(p) if k % 2 == 0 else p for k, p in enumerate(pieces))
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "t-0"))
        with open(os.path.join(root, "t-0", "00000000000000000000.log"), "wb") as f:
            f.write(raw)
        with Log(root, fsync="never") as lg:
            try:
                offset, end = lg.earliest_offset("t", 0), lg.latest_offset("t", 0)
                for _ in range(64):
                    if offset >= end:
                        break
                    got = lg.fetch("t", 0, offset, max_records=100)
                    if not got:
                        break
                    offset = got[-1].offset + 1
            except LogCorrupted:
                pass


_ZNODE_DECODERS: List[Callable[[bytes], object]] = [
    lambda raw: protocol.Registration.decode(raw, "/ids/m"),
    lambda raw: protocol.Command.decode(raw, "/channel/m/cmd-0000000001"),
    lambda raw: protocol.GroupState.decode(raw, "/state"),
    lambda raw: protocol.decode_timeline(raw, "/timeline"),
    lambda raw: protocol.decode_offset(raw, "/offsets/t/0"),
    lambda raw: protocol.decode_completed(raw, "/completed/t/0"),
    lambda raw: protocol.decode_topic_znode(raw, "/brokers/topics/t"),
    lambda raw: protocol.decode_topic(raw, "/brokers/topics/t"),
    lambda raw: protocol.ShardsInfo.decode(raw),
    lambda raw: protocol.ShardAssignment.decode(raw, "/shards/0"),
    lambda raw: protocol.NodeInfo.decode(raw, "/nodes/n"),
    lambda raw: protocol.LeaderInfo.decode(raw),
    lambda raw: protocol.AclPolicy.decode(raw, "/acl"),
    lambda raw: protocol.decode_spark_progress(raw, "/progress/m"),
    protocol.decode_spark_error,
    lambda raw: protocol.ShareGroupConfig.decode(raw, "/share-groups/g"),
    lambda raw: protocol.ShareMember.decode(raw, "/share-groups/g/members/m"),
    lambda raw: protocol.SharePartitionState.decode(raw, "/share-groups/g/partitions/t/0"),
]


def znode(data: bytes) -> None:
    """Every znode decoder (the first byte picks one): only CorruptZnode may come out."""
    if not data:
        return
    decoder = _ZNODE_DECODERS[data[0] % len(_ZNODE_DECODERS)]
    try:
        decoder(data[1:])
    except CorruptZnode:
        pass


def config(data: bytes) -> None:
    """A TOML file read as coordinatord and the consumer read theirs (``load_toml``, then the
    node's and the consumer's settings built from it): only InvalidConfig may come out."""
    with tempfile.NamedTemporaryFile(suffix=".toml") as f:
        f.write(data)
        f.flush()
        for table in ("coordinator", "consumer"):
            try:
                values = dict(cfg.load_toml(f.name, table))
                kafka = values.pop("kafka", None)
                if kafka is not None:
                    cfg.check_kafka_properties(kafka, "kafka")
                if table == "coordinator":
                    cfg.build(CoordinatorConfig, values, f.name)
                else:
                    for key in ("zk", "data_dir"):
                        cfg.take(values, key, str, f.name)
                    build_consumer_config(values)
            except InvalidConfig:
                pass


TARGETS: Dict[str, Callable[[bytes], None]] = {"batch": batch, "log": log, "znode": znode, "config": config}


def _znode_seeds() -> List[bytes]:
    g = protocol
    objs = [
        (0, g.Registration({"t": 1}, strategies=["range"], host="h", client_id="c").encode()),
        (0, g.Registration({"t": 2}, group_instance_id="i", session_timeout_ms=6000, static_grace_ms=1000).encode()),
        (2, b'{"version":1,"generation":3,"state":"Stable","members":["m"],"assignment":{}}'),
        (4, b"42"), (4, b""),
        (5, g.encode_topic(3)), (6, g.encode_mirrored_topic({0: [1], 1: [2]}, "cluster")),
        (7, g.ShardsInfo(4).encode()), (8, g.ShardAssignment("n", 3, 1).encode()),
        (12, g.encode_spark_progress(g.SparkProgress(10, 2, None, 1.5))),
        (13, g.encode_spark_error("Traceback: boom")),
    ]
    return [bytes([k]) + raw for k, raw in objs]


def seeds(target: str) -> List[bytes]:
    """Valid inputs for ``target``, made with the encoders."""
    if target in ("batch", "log"):
        one = _encoded([(b"k", b"v", 1, [("h", b"x")]), (None, b"vv", 2, [])])
        fixed = _encoded([(None, b"abcd", 5, [])] * 4, base=2)
        runs = _encoded([(None, b"v%d" % i, 10 + i // 16, []) for i in range(64)], base=6)
        return [one, fixed, runs] if target == "batch" else [one + fixed, one + b"\xff\xfe" + b"torn" + fixed]
    if target == "znode":
        return _znode_seeds()
    return [b'[coordinator]\nrebalance_timeout_ms = 30000\n[consumer]\nzk = "127.0.0.1:2181"\n'
            b'max_poll_records = 10\n[consumer.kafka]\n"bootstrap.servers" = "k:9092"\n',
            b'session-timeout-ms = 6000\nauto_offset_reset = "earliest"\n']
