"""Servers for tests, the demo and benchmarks; never used by runtime paths.

* :mod:`coordinator.testing.pki` — a throwaway certificate authority (``openssl``) for a
  TLS-only ZooKeeper and its clients' certificates.
* :mod:`coordinator.testing.zkserver` — a real ZooKeeper on demand: ``ZK_CONNECT``, a local
  install (Debian's package) started as a child on a free loopback port, or testcontainers (any
  image with the official one's environment, ``ZKGROUPS_ZK_IMAGE``);
  1- or 3-server ensembles whose servers can be killed and restarted, plaintext or TLS only.
* :mod:`coordinator.testing.kafkamock` — librdkafka's mock Kafka cluster in a child process,
  reached over TCP like real brokers and steered (topics, broker down/up, injected errors)
  through :class:`~coordinator.testing.kafkamock.MockKafkaCluster`; the child is
  :mod:`coordinator.testing.kafkamock_server` (``ctypes`` on the librdkafka confluent-kafka bundles).

The Docker engine ``bin/test-containers`` starts on demand is not here but in the tests
(``tests/containers/dockerengine.py``): it installs Debian's ``docker.io`` as root, which no
installed distribution should ship.

Runtime code (``coordinator``, ``consumer``) never imports this package — except the live demo
(:mod:`consumer.cli.demo`), which starts its own ZooKeeper: brokers and servers are chosen by
configuration alone, so nothing on a runtime path knows whether it talks to a test server.
"""
