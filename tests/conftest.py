import os
import sys

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    from batchline.spark import local_spark_session

    session = local_spark_session("local[2]", "batchline-tests", shuffle_partitions=2)
    yield session
    session.stop()
