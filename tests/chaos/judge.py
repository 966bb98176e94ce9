"""Judge a finished chaos run from its directory alone.

The harness (:mod:`tests.chaos.run`) leaves in the run directory ``run.json`` (the options,
the faults made, how every process ended, what the producer said it sent, the committed
offsets ZooKeeper answered at the end), the consumers' outputs under ``logs/``, the
servers' data under ``zk/`` and the topic: the embedded log under ``data/``, or on Kafka
every record's value as read back from the brokers (``kafka-topic.json``,
:mod:`tests.chaos.kafkatopic`). :func:`judge` reads only those,
runs every check of :mod:`tests.chaos.referee`, the transactions replayed as model steps
(:mod:`tests.model.trace`), and with a share round :mod:`tests.chaos.share_referee`'s checks and
every share-partition write replayed as share-model steps (:mod:`tests.model.share_trace`), and
writes ``referee/``: one file per check,
``ownership.txt`` (the evidence in readable form) and ``verdict.txt``. So a kept run can be
judged again (``bin/chaos --judge RUN_DIR``), and the referee never sees the harness's memory.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from consumer.log import Log
from tests.chaos import kafkatopic, referee, share_referee, txnlog
from tests.chaos.history import GroupHistory, group_history
from tests.model.share_trace import check_share_model
from tests.model.trace import check_model

RECORD = "run.json"
#: Processes killed or frozen, ZooKeeper servers killed (any machine).
PROCESS_KINDS = ("kill", "term", "pause", "leader-kill", "zk-restart", "quorum-loss")
#: Links cut (network namespaces: :mod:`tests.chaos.network`).
PARTITION_KINDS = ("cut-consumer", "cut-oneway", "cut-controller", "cut-node", "zk-minority")
#: On the Kafka data plane.
KAFKA_KINDS = ("broker-down",)
KINDS = PROCESS_KINDS + PARTITION_KINDS + KAFKA_KINDS


@dataclass
class ShareRound:
    """The share round's settings (:mod:`tests.chaos.run`), for :mod:`tests.chaos.share_referee`."""
    group: str
    dead_letter_topic: str
    dead_letter_partitions: int
    delivery_limit: int
    lock_ms: int
    release_delay_ms: int
    reject_key: str
    retry_key: str
    outputs: List[str]                                  # the workers' stdout, relative to the run directory
    live: Optional[Dict[int, Optional[list]]] = None    # partition -> [start, end] ZooKeeper answered at the end


@dataclass
class RunRecord:
    """What the harness knows that the logs do not say."""
    seed: int
    duration: float
    group: str
    topic: str
    partitions: int
    chroot: str
    faults: Dict[str, int]
    processes: List[referee.ProcessEnd]
    consumer_outputs: List[str]                  # relative to the run directory
    produced_count: Optional[int] = None         # what the producer said it sent
    live_committed: Optional[Dict[int, Optional[int]]] = None  # partition -> offset ZooKeeper answered
    notes: List[str] = field(default_factory=list)
    kinds: List[str] = field(default_factory=lambda: list(PROCESS_KINDS))  # the fault kinds of the run
    data_plane: str = "embedded"                 # embedded | kafka
    network: str = "shared"                      # namespaces | shared (no links cut)
    resets_at_heal: int = 0                      # heals that reset the victim's connections
    share: Optional[ShareRound] = None           # the share round, if the run had one

    def save(self, run_dir: str) -> None:
        with open(os.path.join(run_dir, RECORD), "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, run_dir: str) -> "RunRecord":
        with open(os.path.join(run_dir, RECORD)) as f:
            obj = json.load(f)
        obj["processes"] = [referee.ProcessEnd(**p) for p in obj["processes"]]
        if obj.get("live_committed") is not None:
            obj["live_committed"] = {int(p): v for p, v in obj["live_committed"].items()}
        if obj.get("share") is not None:
            share = ShareRound(**obj["share"])
            if share.live is not None:
                share.live = {int(p): v for p, v in share.live.items()}
            obj["share"] = share
        return cls(**obj)


@dataclass
class Outcome:
    results: List[referee.CheckResult]
    verdict: str        # the verdict line, then one line per failed check
    passed: bool


def judge(run_dir: str) -> Outcome:
    record = RunRecord.load(run_dir)
    out_dir = os.path.join(run_dir, "referee")
    os.makedirs(out_dir, exist_ok=True)
    servers = sorted(glob.glob(os.path.join(run_dir, "zk", "server*", "data")))
    logs = txnlog.read_logs(servers, quorum=len(servers) // 2 + 1)
    history = group_history(logs.txns, record.group, record.chroot)
    printed, bad_lines, cut = [], [], 0
    for path in record.consumer_outputs:
        f = referee.read_printed(os.path.join(run_dir, path))
        printed.extend(f.records)
        bad_lines.extend(f.bad_lines)
        cut += f.cut_last_line
    if record.data_plane == "kafka":
        produced, topic_problems = read_kafka_dump(run_dir, record.topic, record.partitions)
    else:
        produced, topic_problems = read_topic(os.path.join(run_dir, "data"), record.topic, record.partitions), []
    live = None if record.live_committed is None else \
        {(record.topic, p): v for p, v in record.live_committed.items()}
    results = [
        referee.check_lost(produced, printed, record.produced_count),
        referee.check_duplicates(printed, history),
        referee.check_ownership(printed, history),
        referee.check_exits(record.processes),
        referee.check_offsets({tp: len(v) for tp, v in produced.items()}, history, live),
        referee.check_evidence(history, logs.conflicts, list(bad_lines) + topic_problems),
        check_model(logs.txns, record.group, record.chroot),  # every step one the protocol model allows
    ]
    if record.share is not None:
        results += share_referee.judge_share(run_dir, record.share, logs.txns, record.chroot, record.topic,
                                             record.partitions, produced)
        ends = {p: len(produced.get((record.topic, p), ())) for p in range(record.partitions)}
        # every share-partition write a step the share model allows
        results.append(check_share_model(logs.txns, record.share.group, record.topic, record.chroot, ends))
    passed = all(r.ok for r in results)
    figures = " ".join(r.summary for r in results if r.summary and r.name != "offsets")
    faults = " ".join(f"{kind}:{record.faults.get(kind, 0)}" for kind in KINDS if kind in record.kinds)
    lines = [f"chaos {'PASS' if passed else 'FAIL'} seed={record.seed} duration={record.duration:.0f}s "
             f"data-plane={record.data_plane} network={record.network} "
             f"produced={sum(len(v) for v in produced.values())} consumed={len(printed)} {figures} "
             f"resets-at-heal={record.resets_at_heal} faults={faults}"]
    for r in results:
        path = os.path.join(out_dir, f"{r.name}.txt")
        with open(path, "w") as f:
            f.write("\n".join([r.summary] + r.details) + "\n")
        if not r.ok:
            lines.append(f"  FAIL {r.name}: {r.details[0] if r.details else r.summary} (details: {path})")
    with open(os.path.join(out_dir, "ownership.txt"), "w") as f:
        write_ownership(f, history, logs, cut, record.notes)
    with open(os.path.join(out_dir, "verdict.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return Outcome(results, "\n".join(lines), passed)


def read_topic(data_dir: str, topic: str, partitions: int) -> Dict:
    """Every value in the topic's log: {(topic, partition): [value by offset]}."""
    log = Log(data_dir)
    try:
        out = {}
        for p in range(partitions):
            values, offset, end = [], log.earliest_offset(topic, p), log.latest_offset(topic, p)
            while offset < end:
                batch = log.fetch(topic, p, offset, max_records=10_000)
                values.extend(r.value.decode() for r in batch)
                offset += len(batch)
            out[(topic, p)] = values
        return out
    finally:
        log.close()


def read_kafka_dump(run_dir: str, topic: str, partitions: int) -> Tuple[Dict, List[str]]:
    """The topic as read back from Kafka at the end: ({(topic, partition): [value by offset]},
    problems). A partition whose log no longer starts at 0 (the mock cluster keeps ~5 MiB a
    partition) cannot be judged for loss: that is a problem of the evidence."""
    dumped_topic, dump = kafkatopic.load(run_dir)
    problems = [f"{kafkatopic.DUMP} holds topic {dumped_topic}, not {topic}"] if dumped_topic != topic else []
    out = {}
    for p in range(partitions):
        part = dump.get(p, {"start": 0, "values": []})
        if part["start"] != 0:
            problems.append(f"Kafka's log of {topic}/{p} starts at {part['start']}: older records were dropped")
        out[(topic, p)] = part["values"]
    return out, problems


def write_ownership(f, history: GroupHistory, logs: txnlog.History, cut_lines: int, notes: List[str]) -> None:
    """The evidence in readable form: who held which partition when; commits per partition."""
    f.write(f"transaction logs: {len(logs.files)} files, {len(logs.txns)} txns; "
            f"torn tails: {', '.join(logs.torn_tails) or 'none'}\n")
    for txn in logs.never_committed:
        f.write(f"never committed (logged by fewer servers than a quorum): {txn.describe()}\n")
    f.write(f"consumer outputs whose last line was cut short (killed mid-write): {cut_lines}\n")
    for note in notes:
        f.write(f"harness: {note}\n")
    f.write("\n")
    for member, sessions in sorted(history.sessions_of.items()):
        f.write(f"{member}: sessions {', '.join(f'{s:#x}' for s in sessions)}\n")
    committed = history.committed()
    for tp in sorted(history.ownerships):
        f.write(f"\n{tp[0]}/{tp[1]}: {len(history.commits.get(tp, ()))} offset writes, last {committed.get(tp)}\n")
        for o in history.ownerships[tp]:
            f.write(f"  {history.member_of_session.get(o.session, '?')}: {o.describe()}\n")
