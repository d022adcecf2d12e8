"""Fixtures the Spark tests share."""

from __future__ import annotations

import pytest

from tests.spark.damage_pipeline import END_MS, START_MS, CountsRun, output_rows


@pytest.fixture(scope="session")
def counts_reference(spark, tmp_path_factory) -> dict[int, list[tuple[int, int]]]:
    """The output of an uninterrupted run from START_MS through END_MS, made once per session."""
    root = tmp_path_factory.mktemp("counts-reference")
    run = CountsRun(spark, root, START_MS)
    run.ssc.start()
    run.run_through(END_MS)
    run.ssc.stop()
    return output_rows(root / "out")
