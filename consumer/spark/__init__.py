"""Consumer groups on Spark: every worker task is a member of a zkgroups consumer group.

The driver starts ``workers`` Spark tasks; each task runs a :class:`~consumer.consumer.Consumer`
in group ``group_id``, polls, calls the user's ``process(batch)`` and commits the batch's
offsets after ``process`` returned (at-least-once), then leaves the group cleanly. Commits
are coalesced: at most one every ``commit_interval_ms`` (100 ms; 0 commits every batch), and
always before a partition is handed over, when a partition reaches the drain snapshot and
when the worker stops. Members are ordinary group members: plain Python consumers can share
the group with them. On the embedded log workers poll columns (``Consumer.poll_columns``):
``batch.columns`` holds the log's Columns and ``batch.records`` is built only if read.

Modules:

* :mod:`~consumer.spark.driver` — what runs on the driver: :class:`GroupJob` and
  :func:`run_group_job`, the :class:`JobSummary`, :func:`local_session`,
  :func:`check_spark_conf`.
* :mod:`~consumer.spark.executor` — what runs in a Spark task: the worker (a group member),
  its loop and commits; what ``process`` gets (:class:`Batch`, :class:`WorkerContext`);
  :func:`read_committed`, the group's progress.
* :mod:`~consumer.spark.progress` — a run's progress as the driver reads it (the progress
  line, what the run's metrics serve).
* :mod:`~consumer.spark.deaths` — worker deaths counted when Spark reports them (its status
  tracker) and the death budget (:class:`~consumer.spark.deaths.DeathBudget`, pure).
* :mod:`~consumer.spark.batching` — where a partition's records are cut into batches (pure).
* :mod:`~consumer.spark.sink` — the exactly-once Parquet sink (:class:`ParquetBatchWriter`;
  Hive-style ``topic=<t>/partition=<p>/`` files Spark reads with its Kafka-source schema),
  the check of its output, per-key counts, and :func:`run_pipeline` (``bin/pipeline``).
* :mod:`~consumer.spark.source` — ``spark.read.format("zkgroups")`` / ``readStream``:
  topics as a DataFrame in the shape of Spark's Kafka source, from a start position, with a
  read limit, a stream committing its progress to a group (imports pyspark; not imported here).

Modes
-----
``drain``
    The driver snapshots the end offset of every partition of the subscribed topics when
    the job starts (from the data plane: the embedded log, or Kafka's log-end offsets). Records at or after a partition's snapshot are not processed. A worker
    keeps going until the *group's* committed offsets (read from ZooKeeper for every
    partition, not only its own; assignments move) reach the snapshot, so the job ends
    when everything that was there at the start has been processed and committed.
``stream``
    Run until ``duration_s`` has passed since the job started (a retried task does not get
    extra time), or until stopped: :meth:`GroupJob.request_stop` (a stop znode every worker
    watches) or ``stop_file`` appearing.

Batches
-------
Without ``align`` a batch is whatever one ``poll()`` returned; with ``align=N`` a
partition's records are cut at multiples of N, at the drain snapshot, or where the sink's
``batch_end`` says, so a batch redone after a failure is cut exactly as before: what an
exactly-once sink needs (the rules: :mod:`~consumer.spark.batching`).

Summary and progress
--------------------
Every worker attempt publishes a progress znode under the run's znode at most once a second
(records, batches, lag); the driver logs a progress line every ``progress_interval_s``
(logger ``zkgroups.spark.progress``) and the summary's ``records_all_attempts`` includes
what killed attempts processed, as of their last report.

Guarantees and limits
---------------------
* A worker's consumer id includes the Spark application id, a per-run token, the worker's
  index, the driver's restart count and Spark's attempt number, so a retried or restarted
  worker never collides with its dead predecessor (whose partitions move once its
  ZooKeeper session ends). Each worker is its own one-task Spark job; a failed one is
  started again until more than ``max_worker_deaths`` task attempts failed within
  ``death_window_s``. Each failed attempt counts when Spark reports it (within a fraction of
  a second), also one Spark retries inside the worker's job (``spark.task.maxFailures`` > 1),
  so the budget means the same on every master.
* Stops (stream deadline, stop znode, stop file) pass a barrier: every worker processes and
  commits what it fetched before any leaves (:mod:`~consumer.spark.executor`).
* A worker killed mid-batch loses nothing: its uncommitted batch is redone by the next owner.
* ``spark.speculation=true`` is refused: a speculative copy of a task would be an extra
  member processing the same partitions' batches concurrently with the original.
* Where the records are: Kafka when the job has ``bootstrap_servers`` (and librdkafka
  properties ``kafka``); every worker then reads the brokers with exactly those settings, so
  executors on many machines need no shared disk, and the drain snapshot is Kafka's log-end
  offsets. The ``kafka`` properties may be secrets: they reach the executors only in the
  pickled worker spec, never as Spark configuration, in the summary or in a log line.
  Otherwise the embedded log, a shared-disk log: ``data_dir`` must be the same files for the
  driver and every executor (local mode, or a shared filesystem).
* On Kafka, offsets must be contiguous: topics with gaps (transactional producers' commit
  markers, compaction) are not supported (batches are cut at offsets, and a drain ends when
  the records reach the snapshot).
* Not handled: partitions added to a topic during a drain are not drained (only the
  snapshot); a worker that keeps running while cut off from ZooKeeper (a zombie) may still
  finish the batch it had started after its partitions moved (at-least-once, as always).

Nothing here imports pyspark (or pyarrow) until a job runs, and the names below are imported
on first use: ``import consumer.spark.source`` (what Spark's Python planner and workers import
for the data source) loads the source alone, not the group-job modules.
"""
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from consumer.spark.batching import BatchCutter
    from consumer.spark.driver import (MODES, WORKER_DEFAULTS, GroupJob, JobSummary, SparkJobError,
                                       check_spark_conf, local_session, run_group_job)
    from consumer.spark.executor import Batch, WorkerContext, WorkerSummary, read_committed
    from consumer.spark.sink import (KAFKA_SCHEMA_DDL, OutputReport, ParquetBatchWriter, PipelineResult,
                                     count_keys, read_records, run_pipeline, scan_output)

_EXPORTS = {
    **dict.fromkeys(["BatchCutter"], "consumer.spark.batching"),
    **dict.fromkeys(["MODES", "WORKER_DEFAULTS", "GroupJob", "JobSummary", "SparkJobError", "check_spark_conf",
                     "local_session", "run_group_job"], "consumer.spark.driver"),
    **dict.fromkeys(["Batch", "WorkerContext", "WorkerSummary", "read_committed"], "consumer.spark.executor"),
    **dict.fromkeys(["KAFKA_SCHEMA_DDL", "OutputReport", "ParquetBatchWriter", "PipelineResult", "count_keys",
                     "read_records", "run_pipeline", "scan_output"], "consumer.spark.sink"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'consumer.spark' has no attribute {name!r}")
