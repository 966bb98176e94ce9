"""The example pipeline's sink (:mod:`consumer.spark.sink`) without a Spark session: a redone
batch cut where the existing file ends, a batch's Arrow table the same from the log's columns
as from records, output of another layout refused before anything runs. (The pipeline on
Spark: ``test_spark.py``.)"""
import os

import pytest

pytest.importorskip("pyarrow")

from coordinator.errors import ZkGroupsError  # noqa: E402
from consumer.log import Log  # noqa: E402
from consumer.records import TopicPartition  # noqa: E402
from consumer.spark.sink import ParquetBatchWriter, run_pipeline  # noqa: E402


def test_redone_batch_is_cut_where_the_existing_file_ends(tmp_path):
    writer = ParquetBatchWriter(str(tmp_path / "records"), fsync=False)
    tp = TopicPartition("t", 3)
    os.makedirs(writer.partition_dir(tp))
    open(writer.path(tp, 2000, 2437), "wb").close()  # e.g. a partial batch flushed when a stream stopped
    assert writer.existing_end(tp, 2000) == 2437
    assert writer.existing_end(tp, 2437) is None
    assert writer.existing_end(TopicPartition("t", 4), 0) is None


def test_batches_read_as_columns_from_the_log_equal_those_built_from_records(tmp_path):
    """The sink's two ways to a batch's Arrow table (the embedded log's columns, or the
    records a consumer got) give the same table: fixed and varying values, keys and none,
    headers, timestamps constant, in runs and per record, ranges across stored batches."""
    from consumer.spark.sink import columns_table, records_table

    tp = TopicPartition("t", 0)
    with Log(str(tmp_path), fsync="never") as lg:
        lg.append("t", 0, [(None, b"v%05d" % i, 1000, ()) for i in range(50)])
        lg.append("t", 0, [(b"k%d" % i if i % 3 else None, b"x" * i, 2000 + i // 10, ()) for i in range(40)])
        lg.append("t", 0, [(b"", b"", 3000 + i * 7, (("h", b"1"), ("n", None)) if i % 2 else ()) for i in range(30)])
        lg.append("t", 0, [(None, b"", 5, ())] * 3)
        for a, b in [(0, 123), (10, 60), (55, 95), (89, 123), (122, 123), (3, 4)]:
            want = records_table(tp, lg.fetch("t", 0, a, max_records=b - a, max_bytes=1 << 30))
            got = columns_table(tp, lg.fetch_columns("t", 0, a, max_records=b - a, max_bytes=1 << 40))
            assert got.schema == want.schema and got.to_pylist() == want.to_pylist(), (a, b)


def test_output_of_another_layout_is_refused_before_anything_runs(tmp_path):
    os.makedirs(tmp_path / "out" / "records" / "t-0")  # <topic>-<partition>/: not this layout
    with pytest.raises(ZkGroupsError) as e:
        run_pipeline(None, zk="127.0.0.1:1", group="g", topic="t", out=str(tmp_path / "out"))
    assert "t-0" in str(e.value) and "\n" not in str(e.value)
