"""``bin/chaos``: a randomized fault run of a whole deployment and its referee.

* :mod:`tests.chaos.run` — the cluster, the nemesis, the command line;
* :mod:`tests.chaos.network` — network namespaces per process, and the cuts between them;
* :mod:`tests.chaos.producer` — the producer process (uniquely numbered records);
* :mod:`tests.chaos.kafkatopic` — a topic on Kafka as the referee reads it (watermarks, every value);
* :mod:`tests.chaos.txnlog` — ZooKeeper's transaction logs, read in Python;
* :mod:`tests.chaos.history` — one group's sessions, ownerships and commits, from those logs;
* :mod:`tests.chaos.referee` — the checks; :mod:`tests.chaos.judge` — a run directory judged.
"""
