"""Telling Spark installations apart by their jars (spark_home.py), without Spark."""
import pytest

from arrowstate.spark_home import SparkHomeError, jars_key, jars_version


def jars(root, files):
    root.mkdir()
    for name, size in files.items():
        (root / name).write_bytes(b"x" * size)
    return root


def test_the_shim_is_kept_per_spark_jars(tmp_path):
    spark = {"spark-core_2.13-4.3.0.jar": 3, "scala-library-2.13.18.jar": 2}
    a = jars(tmp_path / "a", spark)
    same = jars(tmp_path / "same", spark)
    patched = jars(tmp_path / "patched", {**spark, "spark-core_2.13-4.3.0.jar": 4})
    newer = jars(tmp_path / "newer", {"spark-core_2.13-4.3.1.jar": 3,
                                      "scala-library-2.13.18.jar": 2})
    extra = jars(tmp_path / "extra", {**spark, "delta-spark_2.13-4.0.0.jar": 1})
    assert jars_key(a) == jars_key(same), "two homes with the same jars share a shim"
    assert len({jars_key(d) for d in (a, patched, newer, extra)}) == 4


def test_the_version_is_the_spark_core_jars(tmp_path):
    assert jars_version(jars(tmp_path / "a", {"spark-core_2.13-4.3.0.jar": 1,
                                              "spark-sql_2.13-4.3.0.jar": 1})) == "4.3.0"
    with pytest.raises(SparkHomeError, match="it holds none"):
        jars_version(jars(tmp_path / "none", {"spark-sql_2.13-4.3.0.jar": 1}))
    two = jars(tmp_path / "two", {"spark-core_2.13-4.3.0.jar": 1,
                                  "spark-core_2.13-4.2.0.jar": 1})
    with pytest.raises(SparkHomeError, match="it holds spark-core_2.13-4.2.0.jar, "
                                             "spark-core_2.13-4.3.0.jar"):
        jars_version(two)
