"""The worker daemon imports pip's PySpark and Py4J as installed: Spark's zips of the same
sources leave the path, and the import system's cache of path entries, only when they are the
installed package's own copies and those packages are importable."""

from __future__ import annotations

from pathlib import Path

from batchline.worker_daemon import _installed_copy_off_the_path

PY4J_ZIP = "py4j-0.10.9.9-src.zip"


def _package(site: Path, py4j: str | None = "0.10.9.9") -> Path:
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / PY4J_ZIP).write_bytes(b"")
    if py4j:
        (site / f"py4j-{py4j}.dist-info").mkdir()
    return lib


def test_the_installed_packages_own_zips_leave_the_path_and_the_importer_cache(tmp_path):
    lib = _package(tmp_path / "site-packages")
    path = [str(lib / "pyspark.zip"), str(lib / PY4J_ZIP), "", str(tmp_path / "site-packages")]
    importers: dict[str, object] = {entry: object() for entry in path}
    _installed_copy_off_the_path(path, importers)
    assert path == ["", str(tmp_path / "site-packages")]
    assert sorted(importers) == sorted(path)


def test_py4j_s_zip_stays_when_another_version_is_installed(tmp_path):
    lib = _package(tmp_path / "site-packages", py4j="0.10.9.7")
    path = [str(lib / "pyspark.zip"), str(lib / PY4J_ZIP), str(tmp_path / "site-packages")]
    _installed_copy_off_the_path(path, {})
    assert path == [str(lib / PY4J_ZIP), str(tmp_path / "site-packages")]


def test_the_zips_stay_when_their_package_is_not_on_the_path(tmp_path):
    lib = _package(tmp_path / "elsewhere")
    path = [str(lib / "pyspark.zip"), str(lib / PY4J_ZIP), str(tmp_path / "site-packages")]
    importers: dict[str, object] = {entry: object() for entry in path}
    _installed_copy_off_the_path(path, importers)
    assert path == [str(lib / "pyspark.zip"), str(lib / PY4J_ZIP), str(tmp_path / "site-packages")]
    assert sorted(importers) == sorted(path)


def test_a_spark_distribution_s_zips_stay(tmp_path):
    """SPARK_HOME/python/lib of a distribution: SPARK_HOME is no Python package."""
    home = tmp_path / "spark-4.3.0-bin-hadoop3"
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    (home / "python" / "lib" / PY4J_ZIP).write_bytes(b"")
    (tmp_path / "py4j-0.10.9.9.dist-info").mkdir()
    path = [str(home / "python" / "lib" / "pyspark.zip"), str(home / "python" / "lib" / PY4J_ZIP), str(tmp_path)]
    _installed_copy_off_the_path(path, {})
    assert path == [str(home / "python" / "lib" / "pyspark.zip"), str(home / "python" / "lib" / PY4J_ZIP),
                    str(tmp_path)]
