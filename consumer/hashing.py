"""Kafka's key hashing, so a key lands on the same partition here as with a Kafka producer.

:func:`murmur2` is a bit-exact port of ``org.apache.kafka.common.utils.Utils.murmur2`` (a
signed 32-bit result); :func:`partition_for_key` is the default partitioner's
``toPositive(murmur2(key)) % partitions``. Both depend only on the key bytes, never on the
process, the machine or ``PYTHONHASHSEED``.
"""
from __future__ import annotations

import struct
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int (what Java's ``int`` holds)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    # All whole 4-byte little-endian words in one unpack call.
    for k in struct.unpack_from(f"<{words}I", data) if words else ():
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def _positive_hash(key: bytes) -> int:
    # Keys repeat (entity ids); caching keeps keyed sends cheap.
    return murmur2(key) & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    return _positive_hash(bytes(key)) % partitions
