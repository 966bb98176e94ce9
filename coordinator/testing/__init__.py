"""Servers for tests, the demo and benchmarks; never used by runtime paths.

* :mod:`coordinator.testing.kafkamock` — librdkafka's mock Kafka cluster in a child process,
  reached over TCP like real brokers and steered (topics, broker down/up, injected errors)
  through :class:`~coordinator.testing.kafkamock.MockKafkaCluster`.

Runtime code (``coordinator``, ``consumer``) never imports this package: brokers are chosen by
configuration alone, so nothing on a runtime path knows whether it talks to a mock.
"""
