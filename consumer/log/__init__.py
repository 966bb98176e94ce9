"""An embedded, durable, partitioned log: where topics keep their records (Kafka is not used).

Layout of a partition directory::

    <data_dir>/<topic>-<partition>/00000000000000000000.log   segments, named by base offset
    <data_dir>/<topic>-<partition>/writer.lock                flock'ed by whoever appends

A segment is a sequence of *batches*; one :meth:`Log.append` call writes exactly one batch
(a 40-byte header, then the records in columns, checksummed as a whole).

Modules, from the bottom up (each imports only the ones above it: ``log`` → ``segment`` →
``batch``):

* :mod:`~consumer.log.batch` — the batch format: its byte layout, encoding, checksums,
  decoding into records. Pure: bytes in, bytes or records out.
* :mod:`~consumer.log.segment` — one segment file and its in-memory index of batch headers:
  scanning, naming, telling a torn tail from damage and finding the next valid batch after it.
* :mod:`~consumer.log.log` — :class:`Log`: partitions, reads, appends, recovery under the
  writer lock, retention, fsync policies. Its docstring states what the log guarantees and
  what it does not.

The public API is what this package exports (:class:`Log`, its options' constants, the
format's constants, and :class:`Columns`, what :meth:`Log.fetch_columns` returns). Names without a leading underscore in ``batch`` and ``segment`` that are
not exported here (``Encoded``, ``Batch``, ``decode``, ``Segment``, ...) are package-internal:
the modules' API to one another, free to change with them.
"""
from consumer.log.batch import (FLAG_FIXED_VALUES, Columns, FLAG_HEADERS, FLAG_KEYS, FLAG_TIMESTAMP_RUNS,
                                FLAG_TIMESTAMPS, HEADER, HEADER_SIZE, MAGIC, MAX_BATCH_BYTES, Record)
from consumer.log.log import DEFAULT_SEGMENT_BYTES, FSYNC_POLICIES, LOCK_FILE, Log
from consumer.log.segment import SEGMENT_SUFFIX

__all__ = ["Log", "Record", "Columns", "FSYNC_POLICIES", "DEFAULT_SEGMENT_BYTES", "LOCK_FILE", "SEGMENT_SUFFIX",
           "MAGIC", "HEADER", "HEADER_SIZE", "MAX_BATCH_BYTES", "FLAG_TIMESTAMPS", "FLAG_KEYS",
           "FLAG_HEADERS", "FLAG_FIXED_VALUES", "FLAG_TIMESTAMP_RUNS"]
