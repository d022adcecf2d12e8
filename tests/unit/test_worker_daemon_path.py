"""The worker daemon imports pip's PySpark as installed: Spark's zip of the same sources leaves
the path only when it is the installed package's own copy and that package is importable."""

from __future__ import annotations

from pathlib import Path

from batchline.worker_daemon import _installed_copy_off_the_path


def _package(site: Path) -> Path:
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    return lib


def test_the_installed_package_s_own_zip_leaves_the_path(tmp_path):
    lib = _package(tmp_path / "site-packages")
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "", str(tmp_path / "site-packages")]
    _installed_copy_off_the_path(path)
    assert path == [str(lib / "py4j-0.10.9.9-src.zip"), "", str(tmp_path / "site-packages")]


def test_the_zip_stays_when_its_package_is_not_on_the_path(tmp_path):
    lib = _package(tmp_path / "elsewhere")
    path = [str(lib / "pyspark.zip"), str(tmp_path / "site-packages")]
    _installed_copy_off_the_path(path)
    assert path == [str(lib / "pyspark.zip"), str(tmp_path / "site-packages")]


def test_a_spark_distribution_s_zip_stays(tmp_path):
    """SPARK_HOME/python/lib/pyspark.zip of a distribution: SPARK_HOME is no Python package."""
    home = tmp_path / "spark-4.3.0-bin-hadoop3"
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    path = [str(home / "python" / "lib" / "pyspark.zip"), str(tmp_path)]
    _installed_copy_off_the_path(path)
    assert path == [str(home / "python" / "lib" / "pyspark.zip"), str(tmp_path)]
