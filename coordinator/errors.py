"""Errors shared by the coordinator, the consumer library and the CLIs.

Every error carries a message fit to show a user on one line. :class:`RetriableError` marks
those where the same call may succeed later without anything changing (ZooKeeper came back, a
group was tried again); its ``retriable`` flag is kafka-python's convention, and the CLIs exit
with :data:`EXIT_RETRIABLE` for them, so scripts can tell "try again" from "fix something".
"""

from typing import Any, Iterable

#: Exit status of the command-line tools for a retriable error (sysexits' EX_TEMPFAIL).
EXIT_RETRIABLE = 75


class ZkGroupsError(Exception):
    """The base of every zkgroups error; the message is one line, fit to show a user."""

    retriable = False


class RetriableError(ZkGroupsError):
    """The same call may succeed later, as is."""
    retriable = True


class InvalidName(ZkGroupsError, ValueError):
    """A topic or group name breaks Kafka's naming rules."""


class InvalidConfig(ZkGroupsError, ValueError):
    """Unknown configuration key or a value out of range."""


class AuthFailed(ZkGroupsError):
    """A ZooKeeper credential this installation does not accept (wrong password, unknown
    identity), or a write its ACLs refuse."""


class CorruptZnode(ZkGroupsError):
    """A znode holds data that is not what this protocol writes there."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnknownTopic(ZkGroupsError):
    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class TopicExists(ZkGroupsError):
    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class InvalidPartitions(ZkGroupsError, ValueError):
    """Partition counts must be >= 1 and can only grow."""


class ZooKeeperUnavailable(RetriableError):
    """ZooKeeper did not answer in time (unreachable, failing over, a session being re-established)."""


class OffsetOutOfRange(ZkGroupsError):
    """A read below the earliest retained offset (or past the end)."""

    def __init__(self, topic: str, partition: int, offset: int, earliest: int, latest: int) -> None:
        super().__init__(f"offset {offset} of {topic}-{partition} is out of range "
                         f"(earliest {earliest}, latest {latest})")
        self.topic, self.partition, self.offset = topic, partition, offset
        self.earliest, self.latest = earliest, latest


class LogCorrupted(ZkGroupsError):
    """Records of a partition cannot be read because its log files are damaged.

    ``offset`` is the offset that was asked for (the first unreadable one); ``path`` and
    ``position`` are the file and byte where the damage starts; ``resume_offset`` is the first
    offset after the damaged range: seeking there skips the records that are lost (it may
    itself be damaged, which a read from there reports the same way).
    """

    def __init__(self, topic: str, partition: int, offset: int, path: str, position: int,
                 problem: str, resume_offset: int) -> None:
        super().__init__(f"{topic}-{partition}: offset {offset} cannot be read: {problem} "
                         f"(byte {position} of {path}); reading can resume at offset {resume_offset}")
        self.topic, self.partition, self.offset = topic, partition, offset
        self.path, self.position, self.resume_offset = path, position, resume_offset


class FetchFailed(ZkGroupsError):
    """Reading a partition failed for a reason of the data plane's own (e.g. the operating
    system refused to open its files); ``cause`` is the original error, whose ``retriable``
    flag it carries (a broker that did not answer in time)."""

    def __init__(self, topic: str, partition: int, cause: BaseException) -> None:
        detail = f"{cause.strerror}: {cause.filename}" if isinstance(cause, OSError) and cause.strerror else str(cause)
        super().__init__(f"{topic}-{partition} cannot be read: {detail or type(cause).__name__}")
        self.topic, self.partition, self.cause = topic, partition, cause
        self.retriable = bool(getattr(cause, "retriable", False))


class RecordDeserializationError(ZkGroupsError):
    """A consumer's ``key_deserializer`` or ``value_deserializer`` raised on a record (Kafka's
    ``RecordDeserializationException``). The partition's position stays at that record:
    ``seek(tp, offset + 1)`` skips it; every record before it was returned first. ``cause``
    is the deserializer's exception."""

    def __init__(self, topic: str, partition: int, offset: int, which: str, cause: BaseException) -> None:
        super().__init__(f"{which} failed on {topic}-{partition} at offset {offset}: "
                         f"{type(cause).__name__}: {cause}; seek past it to go on")
        self.topic, self.partition, self.offset, self.cause = topic, partition, offset, cause


class ConsumerRebalanceFailedException(RetriableError):
    """A group could not be rebalanced within max.rebalance.retries attempts (tried again later)."""


class CommitFailedError(ZkGroupsError):
    """The offset commit was refused for ``partitions``: this member does not own them (any
    more). The commit's other partitions were written."""

    def __init__(self, message: str, partitions: Iterable[Any] = ()) -> None:
        super().__init__(message)
        self.partitions = frozenset(partitions)


class AcknowledgementRefused(ZkGroupsError):
    """A share consumer's acknowledgement of ``offsets`` of ``partition`` took no effect: their
    lock had ended (expired, or released by the group's coordinator) before it arrived. The
    records are or will be delivered again; the partition's other acknowledgements took effect."""

    def __init__(self, partition: Any, offsets: Iterable[int]) -> None:
        self.partition, self.offsets = partition, sorted(offsets)
        shown = ", ".join(map(str, self.offsets[:5])) + (", ..." if len(self.offsets) > 5 else "")
        super().__init__(f"acknowledgement of {len(self.offsets)} record(s) of {partition} refused: "
                         f"their lock had ended (offsets {shown}); they will be delivered again")


class FencedInstanceIdError(ZkGroupsError):
    """Another live process holds this consumer's ``group_instance_id`` (as Kafka's
    FENCED_INSTANCE_ID): fatal for this consumer; close it."""


class NoOffsetForPartition(ZkGroupsError):
    """No committed offset and auto_offset_reset is 'none'."""


class IllegalStateError(ZkGroupsError):
    """An API was called in a state that does not allow it (e.g. after close)."""


class NoCommonStrategy(ZkGroupsError):
    """The members of a group share no assignment strategy this coordinator knows,
    or an unknown strategy name was asked for. Not retriable as is: the group stays
    unassigned until its members' strategy lists change (e.g. a rolling upgrade completes)."""
