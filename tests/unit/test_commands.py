"""Which channel commands a member applies (consumer.commands.decide): a table, then properties
over random channels. Pure: no ZooKeeper."""
import random

import pytest

from consumer.commands import NOTHING_APPLIED, decide
from coordinator.protocol import START_FETCHER, STOP_FETCHER, Command

ME = "g_me-1-aaaa"
SHARE = {"t": {0: f"{ME}-0", 1: f"{ME}-0"}}


def stop(gen, epoch=3, cid=ME):
    return Command(STOP_FETCHER, gen, epoch, consumer_id=cid)


def start(gen, epoch=3, cid=ME, share=None):
    return Command(START_FETCHER, gen, epoch, SHARE if share is None else share, consumer_id=cid)


def channel(*commands):
    return [(f"/c/cmd-{i:010d}", c) for i, c in enumerate(commands)]


CASES = [
    # name, commands, applied, epoch_now, generation_now, target, applied after, ignored reasons
    ("a new generation", channel(stop(5), start(5)), (3, 4), 3, 5, SHARE, (3, 5), []),
    ("nothing applied yet", channel(stop(1), start(1)), NOTHING_APPLIED, 3, 1, SHARE, (3, 1), []),
    ("a new leader (higher epoch, lower generation)", channel(stop(1, epoch=4), start(1, epoch=4)), (3, 9), 4, 1,
     SHARE, (4, 1), []),
    ("two generations queued: the newer wins", channel(stop(5), start(5), stop(6), start(6, share={})), (3, 4), 3, 6,
     {}, (3, 6), []),
    ("a lone stop means own nothing", channel(stop(5)), (3, 4), 3, 5, {}, (3, 5), []),
    ("garbage only: nothing changes", channel("command is not JSON"), (3, 4), 3, 5, None, None, ["unreadable"]),
    ("an older generation only: nothing changes", channel(stop(4), start(4)), (3, 4), 3, 5, None, None,
     ["stale", "stale"]),
    ("an older epoch only: nothing changes", channel(stop(9, epoch=2), start(9, epoch=2)), (3, 4), 3, 9, None, None,
     ["stale", "stale"]),
    ("addressed to another member", channel(stop(5, cid="g_other"), start(5, cid="g_other")), (3, 4), 3, 5, None,
     None, ["addressed to", "addressed to"]),
    ("no addressee", channel(start(5, cid="")), (3, 4), 3, 5, None, None, ["addressed to"]),
    ("a future epoch is not a leader's", channel(stop(5, epoch=1003), start(5, epoch=1003)), (3, 4), 3, 5, None, None,
     ["from epoch 1003", "from epoch 1003"]),
    ("a generation ahead of the group's", channel(start(10 ** 12)), (3, 4), 3, 5, None, None, ["ahead of"]),
    ("unknown epoch and generation are not checked", channel(stop(5, epoch=7), start(5, epoch=7)), (3, 4), None,
     None, SHARE, (7, 5), []),
    ("garbage among real commands", channel(stop(5), "not JSON", start(5)), (3, 4), 3, 5, SHARE, (3, 5),
     ["unreadable"]),
    ("a forged future command does not block the real ones",
     channel(start(5, epoch=1003), stop(5), start(5)), (3, 4), 3, 5, SHARE, (3, 5), ["from epoch 1003"]),
    ("a stop after its own start is out of order", channel(stop(5), start(5), stop(5)), (3, 4), 3, 5, SHARE, (3, 5),
     ["out of order"]),
    ("an older generation after a newer one is out of order", channel(stop(6), start(6), start(5)), (3, 4), 3, 6,
     SHARE, (3, 6), ["out of order"]),
]


@pytest.mark.parametrize("commands,applied,epoch_now,generation_now,target,applied_after,reasons",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(commands, applied, epoch_now, generation_now, target, applied_after, reasons):
    d = decide(commands, ME, applied, epoch_now, generation_now)
    assert d.target == target
    assert d.applied == applied_after
    assert len(d.ignored) == len(reasons)
    for ignored, fragment in zip(d.ignored, reasons):
        assert fragment in ignored.reason
    # every command is accounted for exactly once: ignored, acked with the revoke, or the start applied
    handled = d.ignored_paths + d.acks + ([d.start_path] if d.start_path else [])
    assert sorted(handled) == sorted(p for p, _ in commands)


def test_stale_commands_are_marked_routine():
    d = decide(channel(stop(4), start(4), "junk"), ME, (3, 4), 3, 5)
    assert [i.stale for i in d.ignored] == [True, True, False]


def _random_command(rng, applied):
    kind = rng.random()
    if kind < 0.1:
        return "unreadable"
    epoch = applied[0] + rng.choice([-1, 0, 0, 0, 1, 500])
    gen = applied[1] + rng.choice([-2, -1, 0, 1, 1, 2, 10 ** 9])
    cid = ME if rng.random() < 0.85 else "g_stranger"
    option = rng.choice([STOP_FETCHER, START_FETCHER])
    share = {"t": {p: f"{ME}-0" for p in range(rng.randrange(4))}}
    return Command(option, gen, epoch, share if option == START_FETCHER else {}, consumer_id=cid)


def test_properties_over_random_channels():
    rng = random.Random(20261124)
    for _ in range(3000):
        applied = (rng.randrange(1, 5), rng.randrange(1, 20))
        epoch_now, generation_now = applied[0] + rng.randrange(2), applied[1] + rng.randrange(3)
        commands = channel(*(_random_command(rng, applied) for _ in range(rng.randrange(1, 6))))
        d = decide(commands, ME, applied, epoch_now, generation_now)
        handled = d.ignored_paths + d.acks + ([d.start_path] if d.start_path else [])
        assert sorted(handled) == sorted(p for p, _ in commands)
        applicable = [c for p, c in commands if p not in d.ignored_paths]
        # ownership changes only through commands that apply
        assert (d.target is None) == (not applicable)
        for c in applicable:
            assert c.consumer_id == ME and c.epoch <= epoch_now and c.generation <= generation_now
            assert (c.epoch, c.generation) > applied
        if applicable:
            last = applicable[-1]
            assert d.applied == (last.epoch, last.generation)
            assert d.target == (last.ownership if last.option == START_FETCHER else {})
            assert d.start_path == (next(p for p, c in commands if c is last) if last.option == START_FETCHER
                                    else None)
        # what is applied never goes back
        assert d.applied is None or d.applied > applied
