"""One partition's side of the fetcher (:mod:`consumer.partition_buffer`): records handed out
across chunks with the log's lists never changed, what a poll took given back, a refetch that
keeps a parked error only when no record before it is dropped. Pure: no server, no log."""
from consumer.partition_buffer import PartitionBuffer, rest_of
from consumer.records import ConsumerRecord, TopicPartition

TP = TopicPartition("t", 0)


def records(first, n):
    return [ConsumerRecord("t", 0, o, 0, None, b"v%d" % o) for o in range(first, first + n)]


def buffer(*chunks):
    b = PartitionBuffer(TP, chunks[0][0].offset if chunks else 0, epoch=1)
    for chunk in chunks:
        b.chunks.append(chunk)
        b.count += len(chunk)
    return b


def test_records_are_taken_in_order_across_chunks_and_the_logs_lists_are_never_changed():
    first, second = records(0, 3), records(3, 2)
    b = buffer(first, second)
    assert [r.offset for r in b.take(2)] == [0, 1] and (b.position, b.count, b.idx) == (2, 3, 2)
    assert [r.offset for r in b.take(10)] == [2, 3, 4] and (b.position, b.count) == (5, 0)
    assert [r.offset for r in first] == [0, 1, 2] and [r.offset for r in second] == [3, 4]
    whole = records(5, 2)
    assert buffer(whole).take(2) is whole  # a whole chunk is handed out as it is: no copy


def test_what_a_poll_took_is_given_back_as_the_chunks_to_put_in_front():
    b = buffer(records(0, 4))
    taken = b.take(3)
    assert b.given_back(taken) == (0, 3, [taken])
    assert [r.offset for r in rest_of(records(0, 4), 1)] == [1, 2, 3]


def test_a_refetch_reads_again_from_the_position_and_keeps_an_error_only_with_nothing_dropped():
    b = buffer(records(0, 4))
    b.take(1)
    b.error, b.unreported = OSError("disk"), 4
    b.refetch(epoch=2)  # records before the error were dropped: read again, they lead to it again
    assert (b.fetch_offset, b.count, list(b.chunks), b.epoch) == (1, 0, [], 2) and b.error is None
    b.error = OSError("disk")
    b.refetch(epoch=3)  # nothing buffered: the error stays parked
    assert b.error is not None
    b.reset(10, epoch=4)
    assert (b.position, b.fetch_offset, b.error, b.epoch) == (10, 10, None, 4)
