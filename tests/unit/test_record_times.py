"""The timestamps of records at given offsets (:mod:`consumer.dataplane.record_times`): one record
read per spot, the earliest held below a deleted one, Kafka's rounds never holding a partition
twice. Against a fake data plane: no server."""


class FakePlane:
    """An embedded-like data plane: partition p of "t" holds offsets 3..9 stamped 1000 * offset."""
    name = "embedded"

    def __init__(self):
        self.fetched = []

    def earliest_offsets(self, tps):
        if any(tp.topic != "t" for tp in tps):
            from coordinator.errors import UnknownTopic
            raise UnknownTopic(tps[0].topic)
        return {tp: 3 for tp in tps}

    def fetch(self, tp, offset, max_records, max_bytes):
        self.fetched.append((tp.topic, tp.partition, offset, max_records))
        from consumer.records import ConsumerRecord
        return [ConsumerRecord(tp.topic, tp.partition, offset, 1000 * offset, None, b"")] if offset < 10 else []


def test_the_reader_reads_one_record_a_spot_and_the_earliest_held_below_it():
    from consumer.dataplane.record_times import RecordTimesReader
    plane = FakePlane()
    reader = RecordTimesReader(plane)
    # offset 1 was deleted by retention: the oldest record the group can still consume is 3
    assert reader([("t", 0, 5), ("t", 1, 1), ("gone", 0, 4), ("t", 0, 12), ("t", 1, 2)]) == \
        {("t", 0, 5): 5000, ("t", 1, 1): 3000, ("t", 1, 2): 3000}
    assert plane.fetched == [("t", 0, 5, 1), ("t", 1, 3, 1), ("t", 0, 12, 1)]  # 3 of t-1 read once for both


def test_kafka_rounds_never_hold_a_partition_twice():
    from consumer.dataplane.record_times import _rounds
    assert _rounds([("t", 0, 5), ("t", 1, 7), ("t", 0, 9), ("u", 0, 1), ("t", 0, 2)]) == \
        [[("t", 0, 5), ("t", 1, 7), ("u", 0, 1)], [("t", 0, 9)], [("t", 0, 2)]]
