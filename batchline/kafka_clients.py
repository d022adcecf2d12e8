"""What the Kafka source and sink share: librdkafka's clients (``confluent-kafka``), their
settings, and offsets asked of the brokers as a read_committed consumer sees them.

Nothing here goes onto Spark's classpath: the driver and the Python tasks talk to the
brokers through librdkafka, so any Spark cluster reads and writes Kafka after ``pip install``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from batchline.errors import ConfigurationError, SourceError

__all__ = ["kafka_module", "client_settings", "admin_client", "TopicPartitionKey", "list_offsets", "topic_partitions"]

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
"""A topic and one of its partitions."""

_ADMIN_TIMEOUT_S = 30.0
_TRANSIENT_FOR_S = 30.0
"""How long offsets are asked again while a partition has no leader (just added, or its
broker restarting): a leader is elected within seconds."""
_TRANSIENT_CODES = frozenset({"NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART",
                              "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS", "_TIMED_OUT", "_TRANSPORT"})
# Module level, so that tests replace them with a manual clock's.
_sleep = time.sleep
_monotonic = time.monotonic


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
    deadline: float | None = None
    wait = 0.2
    while True:
        try:
            return _offsets_once(admin, request, kafka)
        except kafka.KafkaException as error:
            now = _monotonic()
            deadline = now + _TRANSIENT_FOR_S if deadline is None else deadline
            if not _transient(error) or now >= deadline:
                raise SourceError(f"{what}: asking the Kafka brokers for the {'latest' if latest else 'earliest'} "
                                  f"offsets failed ({error}); check that they are up and that every partition has a "
                                  "leader") from error
            logger.info("%s: asking for offsets again: %s", what, error)
            _sleep(min(wait, max(0.0, deadline - now)))
            wait = min(wait * 2, 2.0)


def _offsets_once(admin: Any, request: dict[Any, Any], kafka: Any) -> dict[TopicPartitionKey, int]:
    futures = admin.list_offsets(request, isolation_level=kafka.IsolationLevel.READ_COMMITTED,
                                 request_timeout=_ADMIN_TIMEOUT_S)
    return {(tp.topic, tp.partition): int(future.result().offset) for tp, future in futures.items()}


def _transient(error: Exception) -> bool:
    """Whether a broker's answer says to ask again soon (no leader yet, a timeout), rather than
    something asking again cannot mend."""
    cause = error.args[0] if error.args else None
    if cause is None or not hasattr(cause, "name"):
        return False
    return bool(cause.retriable()) or cause.name() in _TRANSIENT_CODES
