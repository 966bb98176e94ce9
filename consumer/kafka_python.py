"""kafka-python's ``KafkaConsumer`` and ``KafkaProducer`` keywords that zkgroups does not take,
each with what to write instead: the consumer's and the producer's refusal of such a key names
it (``docs/guides/migrating.md`` lists every keyword and call).

Also :func:`serializer_function`, which takes a producer's ``key_serializer`` or
``value_serializer`` either way kafka-python does. No imports of the consumer's modules, so the
producer can use it alone.
"""
from typing import Callable, Dict, Optional

from coordinator.errors import InvalidConfig

_LIBRDKAFKA = "on Kafka pass librdkafka's property in kafka={...}"
_SECURITY = "security of Kafka connections: kafka={'security.protocol': ..., 'ssl.*'/'sasl.*': ...}"
_NOT_NEEDED = "not needed: zkgroups' coordinator and ZooKeeper do this"

#: kafka-python's KafkaConsumer keywords that zkgroups does not take, and why / what instead.
KAFKA_PYTHON_CONSUMER: Dict[str, str] = {
    "group_id": "the group id is Consumer's first argument",
    "partition_assignment_strategy": "use assignment_strategy=['sticky', 'range'] (strategy names)",
    "heartbeat_interval_ms": "liveness is the ZooKeeper session: session_timeout_ms",
    "default_offset_commit_callback": "pass callback= to commit_async()",
    "allow_auto_create_topics": "topics are created with groupctl topics create",
    "exclude_internal_topics": "a pattern matches whole topic names: pattern='__.*', exclude=True leaves '__' topics out",
    "metadata_max_age_ms": "topics and partitions are watched in ZooKeeper: changes arrive at once",
    "api_version": "not needed: librdkafka negotiates with the brokers",
    "client_rack": f"{_LIBRDKAFKA} ('client.rack')",
    "isolation_level": f"{_LIBRDKAFKA} ('isolation.level')",
    "fetch_min_bytes": f"{_LIBRDKAFKA} ('fetch.min.bytes')",
    "check_crcs": f"{_LIBRDKAFKA} ('check.crcs'); the embedded log always checks its CRCs",
    "request_timeout_ms": f"{_LIBRDKAFKA} ('socket.timeout.ms'); ZooKeeper: connect_timeout_s",
    "default_api_timeout_ms": "ZooKeeper calls are bounded by session_timeout_ms",
    "retry_backoff_ms": f"{_LIBRDKAFKA} ('retry.backoff.ms')",
    "reconnect_backoff_ms": f"{_LIBRDKAFKA} ('reconnect.backoff.ms')",
    "reconnect_backoff_max_ms": f"{_LIBRDKAFKA} ('reconnect.backoff.max.ms')",
    "max_in_flight_requests_per_connection": f"{_LIBRDKAFKA} ('max.in.flight')",
    "receive_buffer_bytes": f"{_LIBRDKAFKA} ('socket.receive.buffer.bytes')",
    "send_buffer_bytes": f"{_LIBRDKAFKA} ('socket.send.buffer.bytes')",
    "connections_max_idle_ms": f"{_LIBRDKAFKA} ('connections.max.idle.ms')",
    "enable_incremental_fetch_sessions": "not needed: librdkafka uses fetch sessions",
    **{k: _SECURITY for k in ("security_protocol", "ssl_context", "ssl_check_hostname", "ssl_cafile",
                              "ssl_certfile", "ssl_keyfile", "ssl_crlfile", "ssl_password", "ssl_ciphers",
                              "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                              "sasl_kerberos_name", "sasl_kerberos_service_name", "sasl_kerberos_domain_name",
                              "sasl_oauth_token_provider")},
    **{k: "use metrics_port=PORT (Prometheus) and metrics()" for k in (
        "metric_reporters", "metrics_enabled", "metrics_num_samples", "metrics_sample_window_ms",
        "metric_group_prefix")},
    **{k: _NOT_NEEDED for k in ("selector", "net", "kafka_client", "socket_options", "sock_chunk_bytes",
                                "sock_chunk_buffer_count", "client_dns_lookup", "bootstrap_timeout_ms",
                                "receive_message_max_bytes", "socket_connection_setup_timeout_ms",
                                "socket_connection_setup_timeout_max_ms", "proxy_url", "socks5_proxy")},
}

#: kafka-python's KafkaProducer keywords that zkgroups does not take, and why / what instead.
KAFKA_PYTHON_PRODUCER: Dict[str, str] = {
    **{k: v for k, v in KAFKA_PYTHON_CONSUMER.items() if v in (_SECURITY, _NOT_NEEDED)},
    "client_id": f"{_LIBRDKAFKA} ('client.id')",
    "acks": f"{_LIBRDKAFKA} ('acks'); the embedded log writes every batch before its futures resolve",
    "enable_idempotence": f"{_LIBRDKAFKA} ('enable.idempotence')",
    "compression_type": f"{_LIBRDKAFKA} ('compression.type')",
    "retries": f"{_LIBRDKAFKA} ('retries')",
    "delivery_timeout_ms": f"{_LIBRDKAFKA} ('message.timeout.ms')",
    "max_request_size": f"{_LIBRDKAFKA} ('message.max.bytes')",
    "partitioner": "keys are placed by murmur2 as Java clients place them; pass partition= to choose",
    "allow_auto_create_topics": "use auto_create_topics=True",
    "transactional_id": "transactions are not offered",
    "transaction_timeout_ms": "transactions are not offered",
    **{k: v for k, v in KAFKA_PYTHON_CONSUMER.items() if k in (
        "api_version", "request_timeout_ms", "retry_backoff_ms", "reconnect_backoff_ms",
        "reconnect_backoff_max_ms", "max_in_flight_requests_per_connection", "receive_buffer_bytes",
        "send_buffer_bytes", "connections_max_idle_ms", "default_api_timeout_ms")},
    **{k: "not offered: the producer keeps no metrics beyond metrics()" for k in (
        "metric_reporters", "metrics_enabled", "metrics_num_samples", "metrics_sample_window_ms")},
}


def serializer_function(name: str, serializer) -> Optional[Callable]:
    """``serializer`` (a function of the value, or kafka-python 3's object with
    ``serialize(topic, headers, data)``) as a function of (topic, headers, data)."""
    if serializer is None:
        return None
    serialize = getattr(serializer, "serialize", None)
    if callable(serialize):
        return lambda topic, headers, data: serialize(topic, list(headers or ()), data)
    if not callable(serializer):
        raise InvalidConfig(f"{name} must be callable (value -> bytes) or have serialize(), "
                            f"got {type(serializer).__name__}")
    return lambda topic, headers, data: serializer(data)
