"""A stream runtime's DataFrames per batch: a batch's own frame is found while the generator
builds the next batch's (which holds the runtime's lock for as long as its calls to the JVM take)."""

import threading

from batchline.streams.base import StreamNode, StreamRuntime


class _Input(StreamNode):
    @property
    def slide_ms(self) -> int:
        return 1000

    def create_runtime(self, env, parents):
        raise NotImplementedError


class _SlowToBuild(StreamRuntime):
    """Builds batch 2000's frame only once it is let go; any other batch's at once."""

    def __init__(self) -> None:
        super().__init__(_Input(), env=None, parents=())
        self.building, self.let_go = threading.Event(), threading.Event()

    def compute(self, batch_time):
        if batch_time == 2000:
            self.building.set()
            assert self.let_go.wait(30)
        return f"frame of {batch_time}"


def test_a_generated_batch_s_frame_is_found_while_the_next_batch_s_is_built():
    runtime = _SlowToBuild()
    runtime.initialize(0)
    assert runtime.get_or_compute(1000) == "frame of 1000"
    builder = threading.Thread(target=runtime.get_or_compute, args=(2000,))
    builder.start()
    assert runtime.building.wait(30)
    try:
        found: list[object] = []
        reader = threading.Thread(target=lambda: found.append(runtime.get_or_compute(1000)))
        reader.start()
        reader.join(5)
        assert found == ["frame of 1000"], "the running batch waited for the next one's generation"
        assert runtime.generated(1000) == "frame of 1000" and runtime.generated(2000) is None
    finally:
        runtime.let_go.set()
        builder.join(30)
    assert runtime.get_or_compute(2000) == "frame of 2000"
    assert runtime.generated_times() == [1000, 2000]
