"""A member's command channel: what is in it, read with the epoch and the group's generation
after it (:meth:`CommandChannel.read`); :mod:`consumer.commands` decides which commands apply.

Threads: the member thread only (the watch it sets is kazoo's: it only queues an event).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple, Union

from kazoo.exceptions import NoNodeError

from coordinator import protocol
from coordinator.errors import CorruptZnode
from coordinator.protocol import Command
from coordinator.zkclient import wait_in_order


def decode_commands(gets) -> List[Tuple[str, Union[Command, str]]]:
    """``gets``: (path, its async get) of a channel's commands, in channel order. Returns
    (path, Command or why it cannot be read) for each, skipping the ones already gone."""
    commands: List[Tuple[str, Union[Command, str]]] = []
    for path, a in gets:
        try:
            raw, _ = a.get()
        except NoNodeError:
            continue
        try:
            commands.append((path, Command.decode(raw, path)))
        except CorruptZnode as e:
            commands.append((path, e.problem))
    return commands


class CommandChannel:
    """The channel ``channel/<consumer_id>`` of ``consumer_id`` in ``group``; ``watch`` is called
    (on kazoo's thread) when it changes after a :meth:`read`."""

    def __init__(self, client, group: str, consumer_id: str, watch: Callable):
        self.client, self.group, self.consumer_id, self._watch = client, group, consumer_id, watch
        self.epoch_path: Optional[str] = None   # this group's shard epoch znode, once known
        # The number of the last command seen in the channel (-1: a channel the member made,
        # none yet; None: not known), and whether its last listing found it empty.
        self.last_command: Optional[int] = None
        self.empty = False

    def paths(self) -> List[str]:
        """The paths of the commands in the channel now, in order (a plain listing)."""
        base = protocol.channel_path(self.group, self.consumer_id)
        try:
            return [f"{base}/{c}" for c in sorted(self.client.get_children(base))]
        except NoNodeError:
            return []

    def read(self) -> Tuple[List[Tuple[str, Union[Command, str]]], Optional[int], Optional[int]]:
        """The channel's commands (decoded, or why not), then the epoch and the group's
        generation as read after them.

        One pipelined round trip when the channel was empty at its last listing and its last
        command is known: the next ones are numbered after it (:func:`~coordinator.protocol.command_path`),
        so the listing (which re-arms the watch), the gets of the two commands a coordinator
        writes at once (a stop and a start) and the reads of the epoch and the state go out
        together. ZooKeeper answers one session's requests in order, so the epoch and the
        state are read after the commands. Commands the guess missed take a second round
        trip, with the epoch and the state read again after them. (A non-empty last listing
        means this wake-up is most likely our own acks: no guess, no wasted gets.)"""
        base = protocol.channel_path(self.group, self.consumer_id)
        listing = self.client.get_children_async(base, watch=self._watch)
        guessed = {}
        if self.empty and self.last_command is not None:
            guessed = {path: self.client.get_async(path) for path in
                       (protocol.command_path(self.group, self.consumer_id, self.last_command + i) for i in (1, 2))}
        after = self._epoch_and_state_async() if guessed else None
        if after is not None:
            wait_in_order([after[1]])  # the state: read last
        try:
            paths = [f"{base}/{c}" for c in sorted(listing.get())]
        except NoNodeError:
            paths = []
        self.empty = not paths
        if not paths:
            return [], None, None
        self.last_command = protocol.command_sequence(paths[-1])
        missing = [p for p in paths if p not in guessed]
        if missing or after is None:
            guessed.update((p, self.client.get_async(p)) for p in missing)
            after = self._epoch_and_state_async()
            wait_in_order([after[1]])
        commands = decode_commands([(p, guessed[p]) for p in paths])
        return (commands,) + self._epoch_and_generation(*after)

    def _epoch_and_state_async(self):
        """Ask for the shard epoch znode's stat and the group state (answers: see :meth:`_epoch_and_generation`)."""
        epoch_path = self._shard_epoch_path()
        return (self.client.exists_async(epoch_path) if epoch_path else None,
                self.client.get_async(protocol.state_path(self.group)))

    def _epoch_and_generation(self, epoch_async, state_async) -> Tuple[Optional[int], Optional[int]]:
        stat = epoch_async.get() if epoch_async is not None else None
        epoch = stat.version if stat is not None else None
        try:
            raw, _ = state_async.get()
            generation = protocol.GroupState.decode(raw, protocol.state_path(self.group)).generation
        except (NoNodeError, CorruptZnode):
            generation = None  # not checked: the epoch check still applies
        return epoch, generation

    def _shard_epoch_path(self) -> Optional[str]:
        """The epoch znode of this group's shard (its version bounds the epoch of any command a
        coordinator could have written); None while no coordinator has created the shards."""
        if self.epoch_path is None:
            self.learn_epoch_path(self.client.get_async(protocol.SHARDS))
        return self.epoch_path

    def learn_epoch_path(self, shards) -> None:
        """Record the shard epoch path from a read of the shards znode (``shards``: its async get)."""
        try:
            raw, _ = shards.get()
            count = protocol.ShardsInfo.decode(raw).count
        except (NoNodeError, CorruptZnode):
            return
        self.epoch_path = protocol.shard_epoch_path(protocol.shard_of(self.group, count))
