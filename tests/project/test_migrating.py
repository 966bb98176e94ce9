"""docs/guides/migrating.md: kafka-python's README examples, moved as the guide says, run as
written (against this test's ZooKeeper, with its coordinator, on the embedded log), and its
tables name every keyword that the consumer and the producer refuse with a hint."""
import os
import re

import pytest

from consumer.kafka_python import KAFKA_PYTHON_CONSUMER, KAFKA_PYTHON_PRODUCER
from coordinator.topics import TopicRegistry
from tests.support.helpers import fill

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(ROOT, "docs", "guides", "migrating.md")


def guide() -> str:
    with open(GUIDE) as f:
        return f.read()


EXAMPLES = [b for b in re.findall(r"```python\n(.*?)```", guide(), re.S) if b.startswith("# zkgroups:")]


def test_the_guide_has_runnable_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_a_moved_example_runs(index, cluster, zk, zk_connect, data_dir, monkeypatch, capsys):
    cluster.node("n")
    fill(data_dir, "my_favorite_topic", [0], zk=zk)
    with __import__("consumer").Log(data_dir) as log:
        log.append("my_favorite_topic", 0, [(None, v, 1000, ()) for v in (b"a", b"stop", b"c")])
    TopicRegistry(zk).create("json-foo", 1)
    monkeypatch.chdir(os.path.dirname(data_dir))  # the examples write ./data
    exec(compile(EXAMPLES[index].replace('"127.0.0.1:2181"', repr(zk_connect)), f"migrating.md #{index}", "exec"), {})
    out = capsys.readouterr().out
    assert {0: "value=b'stop'", 1: "resume at 2", 2: "ping {'foo': 'bar'}", 3: "sent 5"}[index] in out


@pytest.mark.parametrize("table", [KAFKA_PYTHON_CONSUMER, KAFKA_PYTHON_PRODUCER])
def test_every_refused_keyword_is_in_the_guide(table):
    text = guide()
    missing = [k for k in table if f"`{k}`" not in text and not (k.startswith(("ssl_", "sasl_")) and "`ssl_*`" in text)]
    assert missing == []


#: kafka-python 3.1's KafkaConsumer and KafkaProducer keywords (their DEFAULT_CONFIG keys).
KAFKA_PYTHON_CONSUMER_KEYWORDS = """bootstrap_servers client_id client_rack group_id group_instance_id key_deserializer
value_deserializer enable_incremental_fetch_sessions fetch_max_wait_ms fetch_min_bytes fetch_max_bytes
max_partition_fetch_bytes request_timeout_ms default_api_timeout_ms retry_backoff_ms reconnect_backoff_ms
reconnect_backoff_max_ms max_in_flight_requests_per_connection auto_offset_reset enable_auto_commit
auto_commit_interval_ms default_offset_commit_callback check_crcs isolation_level allow_auto_create_topics
metadata_max_age_ms client_dns_lookup partition_assignment_strategy max_poll_records max_poll_interval_ms
session_timeout_ms heartbeat_interval_ms receive_buffer_bytes send_buffer_bytes receive_message_max_bytes
socket_options consumer_timeout_ms security_protocol ssl_context ssl_check_hostname ssl_cafile ssl_certfile
ssl_keyfile ssl_crlfile ssl_password ssl_ciphers api_version bootstrap_timeout_ms connections_max_idle_ms
metric_reporters metrics_enabled metrics_num_samples metrics_sample_window_ms metric_group_prefix selector
exclude_internal_topics sasl_mechanism sasl_plain_username sasl_plain_password sasl_kerberos_name
sasl_kerberos_service_name sasl_kerberos_domain_name sasl_oauth_token_provider socket_connection_setup_timeout_ms
socket_connection_setup_timeout_max_ms proxy_url socks5_proxy kafka_client net""".split()
KAFKA_PYTHON_PRODUCER_KEYWORDS = """bootstrap_servers client_id key_serializer value_serializer enable_idempotence
transactional_id transaction_timeout_ms delivery_timeout_ms acks compression_type retries batch_size linger_ms
partitioner connections_max_idle_ms max_block_ms max_request_size allow_auto_create_topics metadata_max_age_ms
client_dns_lookup retry_backoff_ms request_timeout_ms default_api_timeout_ms receive_message_max_bytes
receive_buffer_bytes send_buffer_bytes socket_options reconnect_backoff_ms reconnect_backoff_max_ms
max_in_flight_requests_per_connection security_protocol ssl_context ssl_check_hostname ssl_cafile ssl_certfile
ssl_keyfile ssl_crlfile ssl_password ssl_ciphers api_version bootstrap_timeout_ms metric_reporters metrics_enabled
metrics_num_samples metrics_sample_window_ms selector sasl_mechanism sasl_plain_username sasl_plain_password
sasl_kerberos_name sasl_kerberos_service_name sasl_kerberos_domain_name sasl_oauth_token_provider
socket_connection_setup_timeout_ms socket_connection_setup_timeout_max_ms proxy_url socks5_proxy kafka_client
net""".split()


def test_every_kafka_python_consumer_keyword_is_taken_or_refused_with_a_hint():
    import dataclasses
    from consumer.config import ConsumerConfig
    fields = {f.name for f in dataclasses.fields(ConsumerConfig)}
    assert [k for k in KAFKA_PYTHON_CONSUMER_KEYWORDS if k not in fields and k not in KAFKA_PYTHON_CONSUMER] == []


def test_every_kafka_python_producer_keyword_is_taken_or_refused_with_a_hint():
    from consumer.producer import PRODUCER_KEYWORDS
    assert [k for k in KAFKA_PYTHON_PRODUCER_KEYWORDS if k not in PRODUCER_KEYWORDS and k not in KAFKA_PYTHON_PRODUCER] == []
