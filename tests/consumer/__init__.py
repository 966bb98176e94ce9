"""Consumers against a real ZooKeeper and a coordinator: the Consumer API, the fetcher, ownership safety, static membership."""
