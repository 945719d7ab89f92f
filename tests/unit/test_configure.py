"""arrowstate.configure() on a builder (no Spark starts): the driver's interpreter is pinned
for masters whose executors run on this machine only; elsewhere Spark's own choice stays."""
import os
import sys

import pytest
from pyspark.sql import SparkSession

import arrowstate

EXEC = "spark.arrowstate.pythonExec"


@pytest.fixture(autouse=True)
def environ(tmp_path, monkeypatch):
    """A clean environment for the master and interpreter settings (restored afterwards),
    with an empty Spark conf directory: no spark-defaults.conf of the machine's counts, and
    no running SparkContext (in the suite, this process may hold the Spark tests' session,
    whose master would count first)."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    saved = dict(os.environ)
    for name in ("PYSPARK_PYTHON", "PYSPARK_SUBMIT_ARGS", "MASTER", "SPARK_REMOTE"):
        os.environ.pop(name, None)
    os.environ["SPARK_CONF_DIR"] = str(tmp_path)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def _configured(master=None, **settings):
    builder = SparkSession.Builder()
    if master is not None:
        builder.master(master)
    for key, value in settings.items():
        builder.config(key, value)
    return arrowstate.configure(builder)._options


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]",
                                    "local-cluster[2,1,1024]"])
def test_a_local_master_pins_this_interpreter(master):
    options = _configured(master)
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert options[EXEC] == sys.executable


@pytest.mark.parametrize("master", ["spark://host:7077", "yarn", "k8s://https://host:6443",
                                    "localhost"])
def test_a_cluster_master_keeps_sparks_choice(master):
    options = _configured(master)
    assert "PYSPARK_PYTHON" not in os.environ and EXEC not in options
    os.environ["PYSPARK_PYTHON"] = "/opt/env/bin/python"   # what Spark hands its functions
    options = _configured(master)
    assert os.environ["PYSPARK_PYTHON"] == "/opt/env/bin/python"
    assert options[EXEC] == "/opt/env/bin/python"


def test_a_spark_connect_remote_is_a_master_too():
    builder = arrowstate.configure(SparkSession.Builder().remote("sc://host:15002"))
    assert "PYSPARK_PYTHON" not in os.environ and EXEC not in builder._options
    os.environ["SPARK_REMOTE"] = "sc://host:15002"
    assert EXEC not in _configured()


def test_the_users_choices_stay():
    options = _configured("local[2]", **{"spark.pyspark.python": "/usr/bin/python3.11"})
    assert "PYSPARK_PYTHON" not in os.environ and options[EXEC] == "python3"
    os.environ["PYSPARK_PYTHON"] = "/opt/env/bin/python"
    assert _configured("local[2]")[EXEC] == "/opt/env/bin/python"
    options = _configured("yarn", **{EXEC: "/opt/state/bin/python"})
    assert options[EXEC] == "/opt/state/bin/python"
    options = _configured("local[2]", **{"spark.jars": "a.jar",
                                         "spark.sql.extensions": "my.Extensions"})
    assert options["spark.jars"] == f"a.jar,{arrowstate.jar_path()}"
    assert options["spark.sql.extensions"] == f"my.Extensions,{arrowstate.EXTENSION_CLASS}"


@pytest.mark.parametrize("where, master", [
    ({}, "local[*]"),
    ({"PYSPARK_SUBMIT_ARGS": "--master yarn pyspark-shell"}, "yarn"),
    ({"PYSPARK_SUBMIT_ARGS": "--master=yarn pyspark-shell"}, "yarn"),
    ({"PYSPARK_SUBMIT_ARGS": "--conf spark.master=yarn --master local[3] pyspark-shell"},
     "local[3]"),
    ({"PYSPARK_SUBMIT_ARGS": "--conf spark.master=yarn pyspark-shell"}, "yarn"),
    ({"MASTER": "spark://host:7077"}, "spark://host:7077"),
    ({"defaults": "spark.master  local[4]\nspark.master=spark://host:7077\n"},
     "spark://host:7077"),
    ({"defaults": "# spark.master yarn\n", "MASTER": "yarn"}, "yarn"),
    ({"defaults": "spark.master local[4]\n", "MASTER": "yarn"}, "local[4]"),
])
def test_without_a_master_on_the_builder_it_is_what_the_launcher_gives(where, master):
    where = dict(where)
    defaults = where.pop("defaults", None)
    if defaults is not None:
        with open(os.path.join(os.environ["SPARK_CONF_DIR"], "spark-defaults.conf"), "w") as f:
            f.write(defaults)
    os.environ.update(where)
    assert arrowstate.session._master({}) == master
    pinned = master.startswith("local")
    assert (EXEC in _configured()) == pinned
    assert ("PYSPARK_PYTHON" in os.environ) == pinned
