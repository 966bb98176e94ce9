"""Which of the commands waiting in a member's channel apply, and what they ask for (pure).

A member reads its whole channel at once, then its group's shard epoch znode and its group's
state (in that order, so both are at least as new as every command it read: a session's reads
are monotonic, the controller bumps a shard's epoch before its new leader writes, and the
group state is written in the same transaction as the commands). :func:`decide` turns that into one :class:`Decision`.

A command applies only if it is readable, addressed to this member, no newer than the epoch
and generation the member just read (a command from the future was not written by a leader),
newer than what the member already applied, and newer than the command before it in the
channel. Everything else is acked (deleted) and ignored with a reason: ownership changes only
through commands that apply. A start-fetcher carries the member's whole new share; a
stop-fetcher with no start after it means "own nothing" until the next start.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from coordinator import protocol
from coordinator.protocol import Command, Ownership

#: (epoch, generation) of a command, or of what a member applied last.
Version = Tuple[int, int]
NOTHING_APPLIED: Version = (-1, -1)


@dataclass
class Ignored:
    path: str
    reason: str
    stale: bool = False   # an older generation: routine after a failover; others are anomalies


@dataclass
class Decision:
    ignored: List[Ignored] = field(default_factory=list)   # acked, change nothing
    target: Optional[Ownership] = None    # the ownership to move to; None: leave ownership as it is
    acks: List[str] = field(default_factory=list)          # applied stops, superseded starts
    start_path: Optional[str] = None      # the start-fetcher applied (acked once its claim is done)
    applied: Optional[Version] = None     # what the member has applied once it carried this out

    @property
    def ignored_paths(self) -> List[str]:
        return [i.path for i in self.ignored]


def decide(commands: Sequence[Tuple[str, Union[Command, str]]], consumer_id: str, applied: Version,
           epoch_now: Optional[int], generation_now: Optional[int]) -> Decision:
    """``commands``: (path, Command or the reason it could not be read), in channel order.
    ``epoch_now``/``generation_now``: as read after the commands (None: unknown, not checked)."""
    out = Decision()
    newest: Optional[Tuple[int, int, int]] = None   # (epoch, generation, 0 stop / 1 start) applied so far
    for path, cmd in commands:
        why = _not_applicable(cmd, consumer_id, applied, epoch_now, generation_now)
        key = None
        if why is None:
            key = (cmd.epoch, cmd.generation, 1 if cmd.option == protocol.START_FETCHER else 0)
            if newest is not None and key <= newest:
                why = f"out of order: (epoch {cmd.epoch}, generation {cmd.generation}) after a newer command"
        if why is not None:
            stale = isinstance(cmd, Command) and why.startswith("stale")
            out.ignored.append(Ignored(path, why, stale))
            continue
        newest = key
        if out.start_path:
            out.acks.append(out.start_path)  # superseded by this later command
            out.start_path = None
        if cmd.option == protocol.START_FETCHER:
            out.target, out.start_path = cmd.ownership, path
        else:
            out.target = {}
            out.acks.append(path)
        out.applied = (cmd.epoch, cmd.generation)
    return out


def _not_applicable(cmd: Union[Command, str], consumer_id: str, applied: Version,
                    epoch_now: Optional[int], generation_now: Optional[int]) -> Optional[str]:
    if not isinstance(cmd, Command):
        return f"unreadable: {cmd}"
    if cmd.consumer_id != consumer_id:
        return f"addressed to {cmd.consumer_id or 'no member'!r}, not to this member"
    if epoch_now is not None and cmd.epoch > epoch_now:
        return f"from epoch {cmd.epoch}, but the current epoch is {epoch_now}"
    if generation_now is not None and cmd.generation > generation_now:
        return f"generation {cmd.generation} is ahead of the group's generation {generation_now}"
    if (cmd.epoch, cmd.generation) <= applied:
        return (f"stale: (epoch {cmd.epoch}, generation {cmd.generation}) is not newer than "
                f"(epoch {applied[0]}, generation {applied[1]}) already applied")
    return None
