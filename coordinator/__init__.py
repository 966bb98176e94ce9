"""zkgroups' ZooKeeper side: the contract both sides share, and the elected coordinator.

Modules, from the bottom up (each imports only those above it):

* :mod:`~coordinator.errors` — the error hierarchy (one-line messages; ``RetriableError``).
* :mod:`~coordinator.kafka` — librdkafka clients the zkgroups way (bootstrap servers checked,
  ``[kafka]`` properties merged); confluent-kafka is imported only when Kafka is used.
* :mod:`~coordinator.config` — configuration as dataclasses that reject unknown keys; TOML
  files; the environment defaults (``ZK_CONNECT``, ``ZKGROUPS_DATA_DIR``).
* :mod:`~coordinator.protocol` — **the contract**: every ZooKeeper path and JSON schema, with
  validating decoders; group states and their transitions.
* :mod:`~coordinator.zkclient` — kazoo clients the way zkgroups wants them (bounded retries,
  connect strings checked, transactions that raise).
* :mod:`~coordinator.topics` — the topic registry (``/brokers/topics``, Kafka's format).
* :mod:`~coordinator.assignors` — assignment strategies as pure functions (range,
  roundrobin, sticky) and the group's vote on one.
* :mod:`~coordinator.rebalance` — one group's rebalance: read → compute → diff → write → wait.
* :mod:`~coordinator.mirror` — the topic mirror: a KRaft Kafka cluster's topics written into
  ``/brokers/topics`` by the leader, fenced by its epoch.
* :mod:`~coordinator.timeline` — the rebalance timeline: each group's last rebalances, kept in
  ZooKeeper by the node leading it.
* :mod:`~coordinator.documents` — the JSON documents of the read views (``groupctl --output
  json`` and the console's API), as pure functions.
* :mod:`~coordinator.coordinator` — the node: election, epoch, watches, the request queue
  and its handler threads.
* :mod:`~coordinator.metrics` — the node's Prometheus metrics.
* :mod:`~coordinator.http` — the node's one HTTP server: metrics, health probes, the console.
* :mod:`~coordinator.console` — the read-only operator console: a watched snapshot, lag, pages and API.
* :mod:`~coordinator.cli` — ``coordinatord`` and the one-line-error plumbing every tool shares.
* :mod:`~coordinator.testing` — ZooKeeper and Kafka servers for tests, benchmarks and the demo.

The import rule: ``coordinator`` never imports ``consumer`` (the client side builds on this
package, never the other way round), but for ``coordinatord`` (:mod:`coordinator.cli.coordinatord`,
the composition root), which gives the console a reader of the data plane's log ends; and no
runtime module imports ``tests`` (``tests/test_layering.py`` checks both).
"""

#: The version of the zkgroups distribution (setup.cfg reads it from here; every tool's --version prints it).
__version__ = "0.1.0"
