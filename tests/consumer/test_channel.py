"""A member's command channel (:mod:`consumer.channel`): commands read in the listing's round
trip when their names can be guessed, in a second one when not, the epoch and generation read
after them. Real ZooKeeper (what the guess relies on: how ZooKeeper numbers sequential nodes),
then the shard epoch's path and a state that cannot be read against a fake client."""
from __future__ import annotations

from kazoo.exceptions import NoNodeError

from consumer.channel import CommandChannel, decode_commands
from consumer.member import GroupMember
from coordinator import protocol
from tests.support.fakes import Answer


def test_commands_are_numbered_one_after_the_last_created(zk):
    """What a member relies on to read its commands in the listing's round trip: ZooKeeper
    numbers a sequential node one after the last child created under its parent, whatever was
    deleted since, also inside one transaction (a coordinator writes stop and start at once)."""
    zk.ensure_path(protocol.channel_path("g", "m"))
    last = -1
    for _ in range(3):
        t = zk.transaction()
        for _ in range(2):
            t.create(protocol.command_prefix("g", "m"), b"{}", sequence=True)
        created = t.commit()
        assert created == [protocol.command_path("g", "m", last + i) for i in (1, 2)]
        assert protocol.command_sequence(created[-1]) == last + 2
        last += 2
        for path in created:
            zk.delete(path)


def test_a_member_reads_its_commands_whether_or_not_their_names_were_guessed(zk):
    """The channel listed empty and its last command known: the next two are read with the
    listing. A command the guess missed (someone else's node was created in the channel
    meanwhile) is read in a second round trip; the epoch and generation are always read after
    the commands."""
    member = GroupMember(zk, "g", {"t": 1}, consumer_id="m")
    member._channel.last_command = -1  # as after start() made the channel
    zk.ensure_path(protocol.channel_path("g", "m"))
    assert member._channel.read() == ([], None, None)

    def write(generation):  # as a coordinator does: the state, then stop and start
        state = protocol.GroupState(generation=generation).encode()
        if zk.exists(protocol.state_path("g")):
            zk.set(protocol.state_path("g"), state)
        else:
            zk.create(protocol.state_path("g"), state, makepath=True)
        t = zk.transaction()
        t.create(protocol.command_prefix("g", "m"), protocol.Command(protocol.STOP_FETCHER, generation, 1,
                                                                     consumer_id="m").encode(), sequence=True)
        t.create(protocol.command_prefix("g", "m"), protocol.Command(protocol.START_FETCHER, generation, 1, {},
                                                                     consumer_id="m").encode(), sequence=True)
        return t.commit()

    for generation, disturb in ((1, False), (2, False), (3, True)):
        if disturb:  # the guess is now wrong
            zk.delete(zk.create(protocol.command_prefix("g", "m"), b"", sequence=True))
        paths = write(generation)
        commands, _, seen_generation = member._channel.read()
        assert [p for p, _ in commands] == paths and seen_generation == generation
        assert [c.option for _, c in commands] == [protocol.STOP_FETCHER, protocol.START_FETCHER]
        for path in paths:  # the acks
            zk.delete(path)
        assert member._channel.read() == ([], None, None)


# ---------------------------------------------------------------- against a fake client, no server

def test_a_command_gone_is_skipped_and_one_that_cannot_be_read_is_kept_with_why():
    good = protocol.Command(protocol.STOP_FETCHER, 2, 1, consumer_id="m")
    base = protocol.channel_path("g", "m")
    commands = decode_commands([(f"{base}/a", Answer((good.encode(), None))), (f"{base}/b", Answer(error=NoNodeError())),
                                (f"{base}/c", Answer((b"{not json", None)))])
    assert [p for p, _ in commands] == [f"{base}/a", f"{base}/c"]
    assert commands[0][1] == good and isinstance(commands[1][1], str) and commands[1][1]


def test_the_shard_epoch_path_is_learnt_from_the_shards_znode_once_it_can_be_read():
    channel = CommandChannel(None, "g", "m", watch=lambda event: None)
    for unreadable in (Answer(error=NoNodeError()), Answer((b"garbage", None))):
        channel.learn_epoch_path(unreadable)  # no coordinator yet, or a damaged znode: not known
        assert channel.epoch_path is None
    channel.learn_epoch_path(Answer((protocol.ShardsInfo(4).encode(), None)))
    assert channel.epoch_path == protocol.shard_epoch_path(protocol.shard_of("g", 4))


class Stat:
    version = 5


def test_a_state_that_cannot_be_read_leaves_the_generation_unchecked_and_the_epoch_still_read():
    channel = CommandChannel(None, "g", "m", watch=lambda event: None)
    state = protocol.GroupState(generation=3).encode()
    assert channel._epoch_and_generation(Answer(Stat()), Answer((state, None))) == (5, 3)
    assert channel._epoch_and_generation(Answer(Stat()), Answer((b"{", None))) == (5, None)
    assert channel._epoch_and_generation(None, Answer(error=NoNodeError())) == (None, None)
