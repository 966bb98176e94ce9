"""The tests, in folders by area; a new test file goes in the folder of its area.

- ``unit/``: pure logic, no server and no process (assignors, protocol codecs, rebalance plans
  and steps, fencing terms, lifecycles, ownership transactions, reset plans, Spark batching
  and deaths, the console's pure parts): all in the fast subset, which also takes the pure
  tests of the other folders.
- ``coordinator/``: the coordinator node against a real ZooKeeper: election, rebalances, shards,
  ACLs, topics and the topic mirror, bad znodes, scale and growth, the kazoo client, the
  ZooKeeper harness.
- ``consumer/``: consumers against a real ZooKeeper and a coordinator: the Consumer API on both
  data planes, the fetcher, the columnar poll, ownership safety, static membership, uncertain
  commits, the benchmark's light members.
- ``dataplane/``: the embedded log (batch format, recovery, damaged files), the producers, and
  librdkafka's mock Kafka cluster.
- ``cli/``: the tools as processes: ``groupctl``'s commands, ``coordinatord``'s command line, bad
  input to every tool, structured logs.
- ``spark/``: consumer groups on Spark: the sink and ``bin/pipeline``, the data source, streams,
  Spark on Kafka (``spark`` marker; needs pyspark and a Java runtime).
- ``faults/``: short chaos rounds and the chaos referee and network, ``coordinatord`` failover,
  end-to-end accounting under membership changes.
- ``console/``: the console's HTTP server, API and browser views, Prometheus metrics, the
  shipped dashboard and alert rules.
- ``project/``: the project as a whole: the import layering, one lifecycle idiom, function and
  module lengths, the docs build and the README's examples, installation, the container run's
  logic.
- ``model/``: the protocol's model (rebalance, fencing, zombies) checked exhaustively in a
  small scope, each mutation caught (``model`` marker; ``bin/model`` runs the full scope).
- ``fuzz/``: coverage-guided fuzzers of the decoders (``fuzz`` marker; short fixed-budget runs;
  ``bin/fuzz`` runs longer).
- ``support/``: shared code, no tests: bounded waits and process helpers, the ``cluster``
  fixture's coordinators and members, the headless browser, programs the tests start.

Run as modules, not collected as tests: ``chaos/`` (``bin/chaos``), ``benchmarks/``
(``bin/bench``), ``containers/`` (``bin/test-containers``). ``conftest.py`` holds the fixtures
every folder shares (ZooKeeper, chroots, processes) and adds the ``zk`` and ``process`` markers.
"""
