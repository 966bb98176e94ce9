"""zkgroups' ZooKeeper side: the contract both sides share, and the elected coordinator.

Modules, from the bottom up (each imports only those above it):

* :mod:`~coordinator.errors` — the error hierarchy (one-line messages; ``RetriableError``).
* :mod:`~coordinator.lifecycle` — the one way a stateful class is written: a state enum, a
  table of legal moves, one ``_set_state``, start-once/close-once.
* :mod:`~coordinator.signals` — SIGTERM and SIGINT acted on by a thread, never in the handler
  (which may run while the main thread holds a lock the action takes).
* :mod:`~coordinator.shards` — how groups are spread over nodes: shard placement (pure).
* :mod:`~coordinator.kafka` — librdkafka clients the zkgroups way (bootstrap servers checked,
  ``[kafka]`` properties merged); confluent-kafka is imported only when Kafka is used.
* :mod:`~coordinator.config` — configuration as dataclasses that reject unknown keys (the
  machinery; each component's dataclass sits next to it); TOML files; the environment
  defaults (``ZK_CONNECT``, ``ZKGROUPS_DATA_DIR``).
* :mod:`~coordinator.protocol` — **the contract**: every ZooKeeper path and JSON schema, with
  validating decoders (a package: paths, codec, groups, cluster, spark; every name imported
  at its top).
* :mod:`~coordinator.zktls` — TLS to ZooKeeper: the one setting every client takes, its files
  checked up front, the server's refusals explained in one line, a certificate's x509 identity.
* :mod:`~coordinator.acl` — ZooKeeper identities and the ACL each znode gets.
* :mod:`~coordinator.zkclient` — kazoo clients the way zkgroups wants them (bounded retries,
  connect strings checked, transactions that raise, an ephemeral znode made ours).
* :mod:`~coordinator.read` — the one read API of the layout, for the tools and the console.
* :mod:`~coordinator.fencing` — who may write: the controller and shard epochs, fences
  checked in every leader transaction (``Deposed`` when one failed), terms of leadership.
* :mod:`~coordinator.topics` — the topic registry (``/brokers/topics``, Kafka's format).
* :mod:`~coordinator.assignors` — assignment strategies as pure functions (range,
  roundrobin, sticky) and the group's vote on one.
* :mod:`~coordinator.static` — static membership's pure rules (who is held while away).
* :mod:`~coordinator.share_partition` — a share group's records in flight: acquire,
  acknowledge, expire, dead letters, as pure functions on a share-partition's state.
* :mod:`~coordinator.plan` — the pure part of a rebalance: the snapshot, the plan computed
  from it, the reasons to rebalance, the group state each step writes.
* :mod:`~coordinator.verify` — verification: fingerprints of verified groups, "still as
  recorded" for a shard taken over, owner nodes as assigned.
* :mod:`~coordinator.rebalance` — one group's rebalance: read → compute → diff → write → wait,
  as named steps.
* :mod:`~coordinator.mirror` — the topic mirror: a KRaft Kafka cluster's topics written into
  ``/brokers/topics`` by the leader, fenced by its epoch.
* :mod:`~coordinator.controller` — the controller's term: the shards exist, epochs never go
  back, every shard is on a live node; the topic mirror.
* :mod:`~coordinator.timeline` — the rebalance timeline: each group's last rebalances, kept in
  ZooKeeper by the node leading it.
* :mod:`~coordinator.metrics_server` — serving a Prometheus registry, checking a metrics port
  (every process with ``--metrics-port``).
* :mod:`~coordinator.documents` — the JSON documents of the read views (``groupctl --output
  json`` and the console's API), as pure functions.
* :mod:`~coordinator.lagtime` — lag in seconds: the age of the oldest unconsumed record and
  the consumption rate's estimate (pure), the cache of records' timestamps.
* :mod:`~coordinator.requests` — the queue of groups to rebalance (each queued once, a change
  during a run noticed) and the index of which groups use which topics.
* :mod:`~coordinator.metrics` — the node's Prometheus metrics.
* :mod:`~coordinator.shard_terms` — the shards a node leads, as both its threads see them:
  terms, groups not verified yet, retries due (one lock).
* :mod:`~coordinator.shard_follower` — a node's event thread: registration, the shards'
  placement and terms, the watches of topics and members, the requests it queues.
* :mod:`~coordinator.rebalance_handlers` — a node's handler threads: take a queued group and
  rebalance it.
* :mod:`~coordinator.share_decider` — the clock of a node's share groups: locks and delays that
  end, members that left (judged by this node alone, written fenced).
* :mod:`~coordinator.groups` — the groups a node leads (its shards'): the follower and the
  handlers wired together.
* :mod:`~coordinator.coordinator` — the node (and its ``CoordinatorConfig``): the controller
  election and epoch, the connection's state, the groups it leads.
* :mod:`~coordinator.http` — the node's one HTTP server: metrics, health probes, the console.
* :mod:`~coordinator.console` — the read-only operator console: a watched snapshot, lag, pages and API.
* :mod:`~coordinator.cli` — ``coordinatord`` and the one-line-error plumbing every tool shares.
* :mod:`~coordinator.testing` — ZooKeeper and Kafka servers for tests, benchmarks and the demo.

Layers, bottom up; a module imports only modules of its own layer and those below (the
module map's order within a layer), and ``tests/project/test_layering.py`` reads this list:

* **contract**: ``errors``, ``lifecycle``, ``signals``, ``shards``, ``kafka``, ``config``, ``protocol``,
  ``acl``, ``zktls``, ``zkclient``, ``read``, ``fencing``, ``topics``, ``assignors``, ``static``,
  ``share_partition``, ``lagtime``, ``metrics_server``, ``documents``
* **node**: ``plan``, ``verify``, ``rebalance``, ``mirror``, ``controller``, ``timeline``,
  ``requests``, ``metrics``, ``shard_terms``, ``shard_follower``, ``rebalance_handlers``,
  ``share_decider``, ``groups``, ``coordinator``, ``http``, ``console``
* **tools**: ``cli``, ``testing``

The contract is **the clients' API**: the client side's library (:mod:`consumer`, but its tools)
imports those modules of this package and no others; its tools (``consumer.cli``,
``consumer.spark.cluster``) may import the tools here too (the one-line-error plumbing, the test
servers of the demo and the Spark testbed). The node is never imported by the client side.

The import rule the other way: ``coordinator`` never imports ``consumer`` (the client side
builds on this package, never the other way round) — the daemon's console reads the data plane
through a reader its entry point hands in (``coordinatord`` is :mod:`consumer.cli.coordinatord`);
and no runtime module imports ``tests``.
"""

#: The version of the zkgroups distribution (setup.cfg reads it from here; every tool's --version prints it).
__version__ = "0.1.0"
