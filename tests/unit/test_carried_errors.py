"""An error raised in a Spark task reaches the driver as text inside Spark's own error; the
driver recognises it by its type and attributes carried in that text, never by its wording."""

import pickle

import pytest

from batchline.errors import ConfigurationError, DuplicateStateKeyError, MissingBatchParamsError
from batchline.state.contract import batch_params_from_property


def spark_error_quoting(error: BaseException) -> RuntimeError:
    """What the driver gets: Py4J's error, quoting the task's traceback as text."""
    return RuntimeError(f"An error occurred while calling o123.collect.\nTraceback (most recent call last):\n"
                        f"  File \"worker.py\", line 1\n{type(error).__module__}.{type(error).__name__}: {error}\n"
                        "\tat org.apache.spark.api.python.BasePythonRunner...")


def test_an_error_raised_in_a_task_is_found_again_by_its_type_with_its_attributes():
    with pytest.raises(MissingBatchParamsError) as raised:
        batch_params_from_property(None, "counts")
    found = MissingBatchParamsError.carried_in(spark_error_quoting(raised.value))
    assert found is not None and found.operator == "counts" and not found.carry
    assert isinstance(found, ConfigurationError) and "<<batchline-error" not in str(found)
    assert str(found) in str(raised.value)  # the same words, without the attributes after them
    assert DuplicateStateKeyError.carried_in(spark_error_quoting(raised.value)) is None


def test_attributes_survive_any_text_and_pickling():
    key = repr(("a <<batchline-error >> b", 1))
    error = DuplicateStateKeyError(key)
    assert DuplicateStateKeyError.carried_in(spark_error_quoting(error)).key_repr == key
    assert pickle.loads(pickle.dumps(error)).key_repr == key


def test_an_error_that_only_says_the_same_words_is_not_taken_for_it():
    words = str(MissingBatchParamsError("counts", carry=False))
    assert MissingBatchParamsError.carried_in(RuntimeError(words)) is None
