"""Offsets asked of the brokers while a partition has no leader (just added, or its broker
restarting): asked again for a while, on a fake clock; answers asking again cannot mend fail
at once, naming what to check."""

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from batchline import kafka_clients
from batchline.errors import SourceError
from tests.helpers import sleeps_on_a_fake_clock


class _Future:
    def __init__(self, offset: int | None, error: KafkaError | None) -> None:
        self._offset, self._error = offset, error

    def result(self):
        if self._error is not None:
            raise KafkaException(self._error)
        return SimpleNamespace(offset=self._offset)


class _Admin:
    """Answers each partition's offset with the errors given first, in order."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors = list(errors)
        self.asked = 0

    def list_offsets(self, request, isolation_level, request_timeout):
        self.asked += 1
        error = self.errors.pop(0) if self.errors else None
        return {tp: _Future(None if error else 7, error) for tp in request}


@pytest.fixture
def clock(monkeypatch):
    return sleeps_on_a_fake_clock(monkeypatch, kafka_clients)


def test_a_partition_without_a_leader_yet_is_asked_again_until_it_has_one(clock):
    admin = _Admin(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    assert kafka_clients.list_offsets(admin, [("t", 2)], False, "Kafka input 't'") == {("t", 2): 7}
    assert admin.asked == 3 and 0 < clock[0] < 1


def test_a_partition_that_never_gets_a_leader_fails_after_the_tolerance_naming_what_to_check(clock):
    admin = _Admin(*[KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)] * 100)
    with pytest.raises(SourceError, match="earliest offsets failed .*every partition has a leader"):
        kafka_clients.list_offsets(admin, [("t", 0)], False, "Kafka input 't'")
    assert clock[0] == pytest.approx(kafka_clients._TRANSIENT_FOR_S)


def test_an_answer_asking_again_cannot_mend_fails_at_once(clock):
    admin = _Admin(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(SourceError, match="latest offsets failed"):
        kafka_clients.list_offsets(admin, [("t", 0)], True, "Kafka input 't'")
    assert admin.asked == 1 and clock[0] == 0
