"""What a Spark job's workers record under ``/zkgroups-spark/runs/<run id>``: each attempt's
progress and the error line a failed attempt left."""
from __future__ import annotations

from typing import NamedTuple, Optional

from coordinator.errors import CorruptZnode
from coordinator.protocol.codec import dump, load


#: A worker attempt's recorded error is cut to this many characters.
MAX_SPARK_ERROR_CHARS = 500


def encode_spark_error(line: str) -> bytes:
    return _spark_error_line(line).encode("utf-8")


def decode_spark_error(raw: bytes) -> str:
    """The recorded error line ("" if none): any bytes give one line of bounded length."""
    return _spark_error_line(raw.decode("utf-8", "replace"))


def _spark_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:MAX_SPARK_ERROR_CHARS] if lines else ""


class SparkProgress(NamedTuple):
    """A Spark worker attempt's progress: records and batches it processed (and committed or
    handed on), its partitions' lag (records behind their end offsets) and when it wrote this."""
    records: int
    batches: int
    lag: Optional[int]
    at: float


def encode_spark_progress(progress: SparkProgress) -> bytes:
    return dump(progress._asdict())


def decode_spark_progress(raw: bytes, path: str) -> SparkProgress:
    obj = load(raw, path, "Spark worker progress")
    try:
        records, batches, lag, at = int(obj["records"]), int(obj["batches"]), obj.get("lag"), float(obj["at"])
        return SparkProgress(records, batches, None if lag is None else int(lag), at)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptZnode(path, f"Spark worker progress is malformed ({e!r})") from None
