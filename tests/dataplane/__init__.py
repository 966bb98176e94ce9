"""The data planes: the embedded log (format, recovery, damage), the producers, and librdkafka's mock Kafka cluster."""
