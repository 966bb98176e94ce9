"""The zkgroups source with its stream's driver-side calls timed, for telling a streaming
query's fixed cost that is the source's own from Spark's (:mod:`tests.benchmarks.bench_spark_source`).

Spark answers those calls in a Python planner process of its own, whose start (a fresh
interpreter importing pyspark) varies between queries by more than the source's calls take;
so the source's share is measured where it is spent: each call's seconds are appended to the
file the ``timingFile`` option names, one line a call.
"""
import time

from consumer.spark.source import StreamReader, ZkGroupsDataSource

NAME = "zkgroups_bench_timed"
#: The calls Spark makes in its planner process (the executors' ``read`` is not one).
DRIVER_CALLS = ("initialOffset", "prepareForTriggerAvailableNow", "getDefaultReadLimit", "latestOffset",
                "reportLatestOffset", "partitions", "commit", "stop")


class TimedSource(ZkGroupsDataSource):
    """The zkgroups source; the option ``timingFile`` is where its stream's calls are timed."""

    def __init__(self, options):
        options = dict(options)
        self.timing_file = options.pop(next(k for k in options if k.lower() == "timingfile"))  # Spark lowers keys
        super().__init__(options)

    @classmethod
    def name(cls):
        return NAME

    def streamReader(self, schema):
        return _TimedStreamReader(self.checked, self.timing_file)


class _TimedStreamReader(StreamReader):
    def __init__(self, options, timing_file: str):
        super().__init__(options)
        self.timing_file = timing_file


def _timed(name: str):
    call = getattr(StreamReader, name)

    def timed(self, *args):
        started = time.perf_counter()
        try:
            return call(self, *args)
        finally:
            with open(self.timing_file, "a") as f:
                f.write(f"{name} {time.perf_counter() - started:.6f}\n")
    timed.__name__ = name
    return timed


for _name in DRIVER_CALLS:
    setattr(_TimedStreamReader, _name, _timed(_name))


def seconds_spent(timing_file: str) -> float:
    """The seconds the calls written to ``timing_file`` took, in all."""
    with open(timing_file) as f:
        return sum(float(line.split()[1]) for line in f if line.strip())
