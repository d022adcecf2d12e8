"""The stream model, batchline's ground floor (SPEC C1): what a pipeline is, apart from how
it runs.

- ``base``: the two halves of every stream. A ``StreamNode`` describes it (configuration
  with stable names; building a pipeline only builds these); at start it becomes a
  ``StreamRuntime`` that owns the run's data (generated DataFrames, positions, caches) and
  implements the lifecycle a node may take part in (open against the checkpoint, prepare a
  batch's job, verify it, carry progress across restarts, move on at commit).
- ``nodes``: transformations, windows and watermarks.
- ``inputs``: the runtime contract of an input (allocate a batch's data, log it, replay it).
- ``output``: the operation that hands each batch to a sink (the ``Sink`` interface it
  calls lives in ``batchline.sinks``, a room below this one).
- ``graph``: the description of a whole pipeline (its inputs and output operations), and
  ``pipeline`` the running graph built from it at ``start()``.

This room imports nothing from ``sources``, ``state``, ``recovery`` or ``api``: they build on
it. It uses ``sinks`` (which knows nothing of the stream model) for the interface outputs call.
"""

from batchline.streams.base import Readers, RuntimeEnv, StreamNode, StreamRuntime, Watermark
from batchline.streams.graph import StreamGraph
from batchline.streams.inputs import InputNode, InputRuntime
from batchline.streams.nodes import TransformNode, WatermarkNode, WindowNode
from batchline.streams.output import OutputOperation
from batchline.streams.pipeline import PipelineRuntime

__all__ = [
    "InputNode",
    "InputRuntime",
    "OutputOperation",
    "PipelineRuntime",
    "Readers",
    "RuntimeEnv",
    "StreamGraph",
    "StreamNode",
    "StreamRuntime",
    "TransformNode",
    "Watermark",
    "WatermarkNode",
    "WindowNode",
]
