"""The claim and release transactions as built (consumer.ownership): which operation is which,
in what order, split how. Pure: no ZooKeeper."""
from coordinator import protocol
from consumer.ownership import Role, add_ops, claim_transactions, partition_numbers, release_one, release_transactions
from consumer.records import TopicPartition

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


def kinds(part):
    return [(op.role, op.kind, op.path) for op in part.ops]


def test_a_claim_creates_owner_nodes_then_writes_tokens_then_acks():
    current = {T0: (b"7", 3), T1: (protocol.NO_OFFSET, None)}
    [part] = claim_transactions("g", {T0: "s0", T1: "s1"}, current, ["/ack"])
    assert kinds(part) == [
        (Role.OWN, "create", protocol.owners_path("g", "t", 0)),
        (Role.OWN, "create", protocol.owners_path("g", "t", 1)),
        (Role.TOKEN, "set_data", protocol.offsets_path("g", "t", 0)),
        (Role.TOKEN, "create", protocol.offsets_path("g", "t", 1)),
        (Role.DELETE, "delete", "/ack"),
    ]
    own = part.ops[0]
    assert own.ephemeral and own.data == b"s0" and own.partition == T0
    rewrite = part.ops[2]
    assert (rewrite.data, rewrite.version) == (b"7", 3)          # the same data, compare-and-set
    assert part.ops[3].data == protocol.NO_OFFSET
    assert part.tokens == {T0: 4, T1: 0}                         # the versions the writes leave
    assert part.partitions == {T0: "s0", T1: "s1"}


def test_a_failed_index_names_its_operation():
    """What `e.index >= 2 * len(part)` said before: an index past the owner nodes and the
    tokens is an ack."""
    current = {tp: (b"", 0) for tp in (T0, T1)}
    [part] = claim_transactions("g", {T0: "s", T1: "s"}, current, ["/a1", "/a2"])
    assert [part.role(i) for i in range(len(part.ops))] == [Role.OWN, Role.OWN, Role.TOKEN, Role.TOKEN,
                                                           Role.DELETE, Role.DELETE]


def test_a_large_claim_is_split_and_acks_go_with_the_last_part():
    claim = {TopicPartition("t", p): "s" for p in range(5)}
    parts = claim_transactions("g", claim, {tp: (b"", None) for tp in claim}, ["/ack"], per=2)
    assert [list(p.partitions) for p in parts] == [list(claim)[i:i + 2] for i in (0, 2, 4)]
    assert [sum(op.role is Role.DELETE for op in p.ops) for p in parts] == [0, 0, 1]
    assert all(p.ops[-1].role is not Role.DELETE for p in parts[:-1])


def test_nothing_to_claim_is_one_part_with_only_the_acks_or_nothing():
    [acks_only] = claim_transactions("g", {}, {}, ["/ack"])
    assert kinds(acks_only) == [(Role.DELETE, "delete", "/ack")] and acks_only.partitions == {}
    [empty] = claim_transactions("g", {}, {})
    assert empty.ops == []


def test_a_release_writes_first_then_checks_or_writes_each_token_then_deletes():
    writes = [(T0, b"10", 4), (T2, b"30", 9)]          # T2 is kept: its offset goes with the first part
    [part] = release_transactions("g", {T0: 4, T1: 6}, writes, ["/ack", "/id"])
    assert kinds(part) == [
        (Role.COMMIT, "set_data", protocol.offsets_path("g", "t", 2)),
        (Role.COMMIT, "set_data", protocol.offsets_path("g", "t", 0)),
        (Role.RELEASE, "delete", protocol.owners_path("g", "t", 0)),     # T0's token is its write
        (Role.CHECK, "check", protocol.offsets_path("g", "t", 1)),
        (Role.RELEASE, "delete", protocol.owners_path("g", "t", 1)),
        (Role.DELETE, "delete", "/ack"),
        (Role.DELETE, "delete", "/id"),
    ]
    assert part.ops[0].version == 9 and part.ops[3].version == 6
    assert part.writes == [(T2, b"30", 9), (T0, b"10", 4)]
    assert set(part.partitions) == {T0, T1}


def test_a_large_release_is_split_with_its_writes_and_the_deletes_in_the_last():
    tokens = {TopicPartition("t", p): p for p in range(5)}
    writes = [(TopicPartition("t", 3), b"1", 3), (TopicPartition("u", 0), b"2", 1)]
    parts = release_transactions("g", tokens, writes, ["/ack"], per=2)
    assert [sorted(p.partitions) for p in parts] == [sorted(list(tokens)[i:i + 2]) for i in (0, 2, 4)]
    assert [[w[0] for w in p.writes] for p in parts] == [[TopicPartition("u", 0)], [TopicPartition("t", 3)], []]
    assert [p.role(0) for p in parts[:2]] == [Role.COMMIT, Role.COMMIT]
    assert [op.role for op in parts[-1].ops] == [Role.CHECK, Role.RELEASE, Role.DELETE]


def test_releasing_one_partition_checks_its_token():
    assert [(op.role, op.version) for op in release_one("g", T1, 5)] == [(Role.CHECK, 5), (Role.RELEASE, -1)]


def test_the_ops_go_into_a_transaction_in_order():
    class Recorder:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    [part] = release_transactions("g", {T0: 2}, [(T1, b"5", 7)], ["/ack"])
    t = Recorder()
    add_ops(t, part.ops)
    assert t.calls == [("set_data", (protocol.offsets_path("g", "t", 1), b"5"), {"version": 7}),
                       ("check", (protocol.offsets_path("g", "t", 0), 2), {}),
                       ("delete", (protocol.owners_path("g", "t", 0),), {}),
                       ("delete", ("/ack",), {})]


def test_partition_numbers_skip_anything_else():
    assert partition_numbers(["0", "12", "x", "٣", "-1", "3"]) == {0, 3, 12}
