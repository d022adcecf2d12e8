"""What the Kafka source and sink share: librdkafka's clients (``confluent-kafka``), their
settings, and offsets asked of the brokers as a read_committed consumer sees them.

Nothing here goes onto Spark's classpath: the driver and the Python tasks talk to the
brokers through librdkafka, so any Spark cluster reads and writes Kafka after ``pip install``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from batchline.errors import ConfigurationError, SourceError

__all__ = ["kafka_module", "client_settings", "admin_client", "TopicPartitionKey", "list_offsets", "topic_partitions"]

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
"""A topic and one of its partitions."""

_ADMIN_TIMEOUT_S = 30.0


def kafka_module() -> Any:
    """``confluent_kafka``, or what to install to have it."""
    try:
        import confluent_kafka
    except ImportError as error:
        raise ConfigurationError("reading or writing Kafka needs confluent-kafka: pip install 'batchline[kafka]'") \
            from error
    return confluent_kafka


def client_settings(bootstrap_servers: str, config: Mapping[str, Any] | None, **defaults: Any) -> dict[str, Any]:
    """librdkafka settings: ``defaults`` (dots written as underscores), then the user's
    ``config`` (which wins, except for the bootstrap servers given on their own)."""
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise ConfigurationError(f"bootstrap_servers is 'host:port[,host:port...]'; got {bootstrap_servers!r}")
    settings = {name.replace("_", "."): value for name, value in defaults.items()}
    for name, value in dict(config or {}).items():
        if name == "bootstrap.servers":
            raise ConfigurationError("give the brokers as bootstrap_servers=, not in config")
        settings[name] = value
    settings["bootstrap.servers"] = bootstrap_servers
    return settings


def admin_client(bootstrap_servers: str, config: Mapping[str, Any] | None) -> Any:
    """An ``AdminClient`` of the brokers (metadata, offsets, topics)."""
    kafka_module()
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_settings(bootstrap_servers, config))


def topic_partitions(admin: Any, what: str) -> dict[str, list[int]]:
    """Every topic the cluster has (internal ones left out), with its partitions."""
    try:
        metadata = admin.list_topics(timeout=_ADMIN_TIMEOUT_S)
    except kafka_module().KafkaException as error:
        raise SourceError(f"{what}: the Kafka brokers did not answer ({error}); check that they are up and "
                          "reachable from the driver") from error
    return {name: sorted(topic.partitions) for name, topic in metadata.topics.items()
            if not name.startswith("__") and topic.error is None}


def list_offsets(admin: Any, partitions: Iterable[TopicPartitionKey], latest: bool,
                 what: str) -> dict[TopicPartitionKey, int]:
    """The earliest offset of each partition (its log start: older records were deleted), or
    the latest a read_committed consumer may read (the last stable offset: records of a
    transaction still open lie beyond it)."""
    kafka = kafka_module()
    from confluent_kafka.admin import OffsetSpec

    wanted = list(partitions)
    if not wanted:
        return {}
    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
    request = {kafka.TopicPartition(topic, partition): spec for topic, partition in wanted}
    found: dict[TopicPartitionKey, int] = {}
    try:
        futures = admin.list_offsets(request, isolation_level=kafka.IsolationLevel.READ_COMMITTED,
                                     request_timeout=_ADMIN_TIMEOUT_S)
        for tp, future in futures.items():
            found[(tp.topic, tp.partition)] = int(future.result().offset)
    except kafka.KafkaException as error:
        raise SourceError(f"{what}: asking the Kafka brokers for the {'latest' if latest else 'earliest'} offsets "
                          f"failed ({error}); check that they are up and that every partition has a leader") \
            from error
    return found
