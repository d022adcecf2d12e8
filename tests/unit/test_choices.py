"""Settings of a few values are enums: the member or its value is taken, anything else is
refused with the list of members."""

import pytest

from batchline.checkpoint.storage import CheckpointStorage, ExclusiveCreate
from batchline.choices import choose
from batchline.errors import ConfigurationError
from batchline.scheduler.listener import ListenerEvent, StreamingListener
from batchline.sinks.postgres import PostgresSink, WriteMode
from batchline.state import AtEnd
from batchline.state.store import DELTA, FileHeader, FileKind


def test_a_setting_takes_the_member_or_its_value_and_refuses_others_naming_them_all():
    assert choose(AtEnd, "time_out", "at_end") is AtEnd.TIME_OUT
    assert choose(AtEnd, AtEnd.KEEP, "at_end") is AtEnd.KEEP
    with pytest.raises(ConfigurationError, match=r"at_end must be one of 'keep' \(AtEnd.KEEP\), 'time_out' "
                                                 r"\(AtEnd.TIME_OUT\); got 'timeout'"):
        choose(AtEnd, "timeout", "at_end")


def test_the_postgres_sink_mode_is_an_enum_given_as_a_string_or_a_member():
    assert PostgresSink("postgresql://u@h/db", "t", "upsert", ["k"]).mode is WriteMode.UPSERT
    assert PostgresSink("postgresql://u@h/db", "t", WriteMode.APPEND).mode is WriteMode.APPEND
    with pytest.raises(ConfigurationError, match=r"write_postgres mode must be one of 'append' \(WriteMode.APPEND\), "
                                                 r"'upsert' \(WriteMode.UPSERT\); got 'merge'"):
        PostgresSink("postgresql://u@h/db", "t", "merge")


def test_a_state_file_kind_and_a_store_s_exclusive_create_are_enums(tmp_path):
    assert FileHeader(1, 0, "delta").kind is FileKind.DELTA is DELTA
    assert CheckpointStorage(str(tmp_path))._create_kind is ExclusiveCreate.LOCAL  # noqa: SLF001
    assert CheckpointStorage("memory://choices")._create_kind is ExclusiveCreate.MEMORY  # noqa: SLF001


def test_every_listener_event_calls_a_method_of_the_listener():
    assert all(callable(getattr(StreamingListener, event.value)) for event in ListenerEvent)
    assert {e.value for e in ListenerEvent} == {n for n in vars(StreamingListener) if n.startswith("on_")}
