"""A group member in its own process, for fault tests: prints one JSON line per event.

    python -m tests.support.procs.member ZK GROUP TOPIC[,TOPIC...] [--session-ms N] [--no-ack]
"""
import argparse
import json
import sys
import threading

from coordinator.zkclient import start_client
from consumer.member import GroupMember, MemberListener


class Printer(MemberListener):
    def __init__(self):
        self.owned = set()

    def _say(self, event, parts):
        print(json.dumps({"event": event, "partitions": sorted(f"{t}-{p}" for t, p in parts)}), flush=True)

    def revoke(self, partitions):
        self.owned -= partitions
        self._say("revoked", partitions)
        return {}

    def assign(self, added, committed):
        self.owned |= set(added)
        self._say("assigned", added)

    def lost(self, partitions):
        self.owned -= partitions
        self._say("lost", partitions)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zk")
    ap.add_argument("group")
    ap.add_argument("topics")
    ap.add_argument("--session-ms", type=int, default=2000)
    args = ap.parse_args()
    client = start_client(args.zk, args.session_ms)
    member = GroupMember(client, args.group, {t: 1 for t in args.topics.split(",")}, listener=Printer()).start()
    print(json.dumps({"event": "registered", "consumer_id": member.consumer_id}), flush=True)
    for line in sys.stdin:  # "close" -> leave cleanly
        if line.strip() == "close":
            member.close()
            print(json.dumps({"event": "closed"}), flush=True)
            return
    threading.Event().wait()


if __name__ == "__main__":
    main()
