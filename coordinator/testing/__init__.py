"""Servers for tests, the demo and benchmarks; never used by runtime paths.

* :mod:`coordinator.testing.zkserver` — a real ZooKeeper on demand: ``ZK_CONNECT``, a local
  install (Debian's package) started as a child on a free loopback port, or testcontainers (any
  image with the official one's environment, ``ZKGROUPS_ZK_IMAGE``);
  1- or 3-server ensembles whose servers can be killed and restarted.
* :mod:`coordinator.testing.kafkamock` — librdkafka's mock Kafka cluster in a child process,
  reached over TCP like real brokers and steered (topics, broker down/up, injected errors)
  through :class:`~coordinator.testing.kafkamock.MockKafkaCluster`.
* :mod:`coordinator.testing.dockerengine` — a Docker engine on demand for ``bin/test-containers``:
  one that answers, else a ``dockerd`` of its own on a private socket and data root (Debian's
  ``docker.io`` installed where missing), stopped again by whoever started it.

Runtime code (``coordinator``, ``consumer``) never imports this package — except the live demo
(:mod:`consumer.cli.demo`), which starts its own ZooKeeper: brokers and servers are chosen by
configuration alone, so nothing on a runtime path knows whether it talks to a test server.
"""
