"""arrowstate with a Spark distribution under SPARK_HOME and no pip pyspark: found through
findspark, the shim built against the distribution's jars, the demo run; a Spark of another
minor version refused, naming both versions, with nothing built.

The distribution is laid out as Spark's own (`jars/`, `bin/`, `python/pyspark`,
`python/lib/py4j-*-src.zip` and `pyspark.zip` for Python workers, `RELEASE`) from the
installed pip pyspark, and run by an interpreter (a venv) that sees every installed package
but pyspark and py4j.
"""
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import py4j
import pyspark
import pytest
from pyspark.sql import SparkSession

import arrowstate
from arrowstate import shim
from arrowstate.spark_home import SparkHomeError, jars_key

WHEEL = Path(pyspark.__file__).parent          # the pip wheel's pyspark, a Spark home itself
SITE = WHEEL.parent
# the directory arrowstate is imported from (the checkout under test) goes on PYTHONPATH
ARROWSTATE_ROOT = str(Path(arrowstate.__file__).parent.parent)
# not linked into the venv: pyspark and py4j come from SPARK_HOME; arrowstate from
# ARROWSTATE_ROOT (not a pip-installed copy pointing elsewhere)
HIDDEN = re.compile(r"(pyspark|py4j|arrowstate|__editable__)", re.IGNORECASE)
NOT_ZIPPED = {"jars", "bin", "sbin", "examples", "data", "licenses", "__pycache__"}


def _zip_dir(source: Path, target: Path) -> None:
    """A zip of the package `source` (as Spark's python/lib zips hold theirs)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for f in sorted(source.rglob("*")):
            rel = f.relative_to(source.parent)
            if f.is_file() and not NOT_ZIPPED & set(rel.parts[1:]):
                z.write(f, rel.as_posix())


@pytest.fixture(scope="module")
def python_libs(tmp_path_factory):
    """python/lib of a distribution: py4j's source zip and pyspark.zip (what Spark puts on
    its Python workers' PYTHONPATH from SPARK_HOME), made from the installed packages."""
    lib = tmp_path_factory.mktemp("python-lib")
    _zip_dir(Path(py4j.__file__).parent, lib / f"py4j-{py4j.__version__}-src.zip")
    _zip_dir(WHEEL, lib / "pyspark.zip")
    return lib


def lay_out_spark_home(root: Path, libs: Path, jars_version: str = pyspark.__version__,
                       pyspark_version: str = pyspark.__version__) -> Path:
    """A Spark home as a distribution lays itself out, linking the pip wheel's files; the
    Spark jars' and pyspark's versions can be made to say another version."""
    home = root / "spark"
    (home / "jars").mkdir(parents=True)
    for jar in (WHEEL / "jars").glob("*.jar"):
        name = jar.name
        if name.startswith("spark-"):
            name = name.replace(f"-{pyspark.__version__}.jar", f"-{jars_version}.jar")
        (home / "jars" / name).symlink_to(jar)
    (home / "bin").symlink_to(WHEEL / "bin")
    (home / "python" / "lib").mkdir(parents=True)
    for z in libs.iterdir():
        (home / "python" / "lib" / z.name).symlink_to(z)
    package = home / "python" / "pyspark"
    if pyspark_version == pyspark.__version__:
        package.symlink_to(WHEEL)
    else:
        package.mkdir()
        for entry in WHEEL.iterdir():
            if entry.name != "version.py":
                (package / entry.name).symlink_to(entry)
        (package / "version.py").write_text(f'__version__ = "{pyspark_version}"\n')
    (home / "RELEASE").write_text(f"Spark {jars_version} built for Hadoop 3\n")
    return home


@pytest.fixture(scope="module")
def python_without_pyspark(tmp_path_factory):
    """An interpreter (a venv) that sees every package installed beside pyspark, but not
    pyspark or py4j: these come only from a SPARK_HOME."""
    root = tmp_path_factory.mktemp("no-pip-pyspark")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")],
                   check=True)
    packages = root / "packages"
    packages.mkdir()
    for entry in SITE.iterdir():
        if not HIDDEN.match(entry.name):
            (packages / entry.name).symlink_to(entry)
    (site,) = (root / "venv" / "lib").glob("python3*/site-packages")
    # addsitedir, not a bare path: the linked packages' own .pth files apply too
    (site / "installed-packages.pth").write_text(
        f"import site; site.addsitedir({str(packages)!r})\n")
    return str(root / "venv" / "bin" / "python")


def run(python: str, args: list[str], spark_home: Path | None, timeout: int = 600):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PYTHONPATH"] = ARROWSTATE_ROOT
    if spark_home is not None:
        env["SPARK_HOME"] = str(spark_home)
    return subprocess.run([python, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def shim_jars() -> set[Path]:
    return {jar for d in shim._jar_dirs() if d.is_dir() for jar in d.glob("*.jar")}


def test_the_venv_sees_no_pyspark_but_spark_homes(python_without_pyspark):
    probe = "import importlib.util as u; print(u.find_spec('pyspark'), u.find_spec('pandas'))"
    done = run(python_without_pyspark, ["-c", probe], None)
    assert done.returncode == 0, done.stderr
    found_pyspark, found_pandas = done.stdout.split(" ", 1)
    assert found_pyspark == "None" and found_pandas != "None"
    done = run(python_without_pyspark, ["-m", "arrowstate", "jar"], None)
    assert done.returncode != 0
    assert "arrowstate needs pyspark 4.3.x: install it" in done.stderr
    assert "or set SPARK_HOME to a Spark 4.3 distribution" in done.stderr


@pytest.mark.slow
def test_demo_runs_on_a_spark_distribution(tmp_path, python_libs, python_without_pyspark):
    home = lay_out_spark_home(tmp_path, python_libs)
    probe = ("import arrowstate, pyspark, os; from arrowstate.shim import find_spark; "
             "s = find_spark(); print(pyspark.__file__); print(s.home); print(s.jars); "
             "print(s.version); print(os.environ.get('PYSPARK_PYTHON'))")
    done = run(python_without_pyspark, ["-c", probe], home)
    assert done.returncode == 0, done.stderr
    pyspark_file, found_home, jars, version, pyspark_python = done.stdout.split("\n")[:5]
    assert pyspark_file == str(home / "python" / "pyspark" / "__init__.py")
    assert (found_home, jars, version) == (str(home), str(home / "jars"), "4.3.0")
    assert pyspark_python == "None", "findspark's PYSPARK_PYTHON is left to configure()"

    built = run(python_without_pyspark, ["-m", "arrowstate", "build"], home)
    assert built.returncode == 0, built.stderr
    assert f"against Spark 4.3.0's jars in {home / 'jars'}" in built.stderr
    jar = Path(built.stdout.strip())
    assert jar.name.endswith(f"-spark4.3.0-{jars_key(home / 'jars')}.jar")
    with zipfile.ZipFile(jar) as z:
        assert f"spark.jars={home / 'jars'}" in z.read("arrowstate.properties").decode()
    found = run(python_without_pyspark, ["-m", "arrowstate", "jar"], home)
    assert (found.returncode, found.stdout.strip()) == (0, str(jar)), found.stderr

    demo = run(python_without_pyspark, ["-m", "arrowstate", "demo"], home)
    assert demo.returncode == 0, demo.stderr[-3000:]
    out = demo.stdout
    for rows in ("running_clicks: new output rows [('ann', 2), ('bob', 1)]",
                 "running_clicks: new output rows [('ann', 4), ('bob', 2), ('cid', 1)]",
                 "running_clicks: new output rows [('dan', 1), ('cid', 10), ('eve', 1)]",
                 "deduplicated_window_counts: new output rows "
                 "[(datetime.datetime(2026, 1, 1, 0, 0, 30), 2)]"):
        assert rows in out
    for operator in ("ArrowStreamingDeduplicate", "ArrowStateStoreSave",
                     "ArrowFlatMapGroupsWithState"):
        assert f"{operator} (operator" in out


@pytest.mark.parametrize("command", ["jar", "build", "demo"])
def test_pip_pyspark_with_a_spark_home_of_another_version_is_refused(tmp_path, python_libs,
                                                                     command):
    home = lay_out_spark_home(tmp_path, python_libs, jars_version="4.2.0")
    before = shim_jars()
    done = run(sys.executable, ["-m", "arrowstate", command], home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"arrowstate {arrowstate.__version__} supports Spark 4.3.x only; found Spark 4.2.0 at "
        f"{home} (its jars in {home / 'jars'}; pyspark {pyspark.__version__} at {WHEEL})")
    assert shim_jars() == before, "nothing is built"


def test_configure_refuses_a_spark_home_of_another_version(tmp_path, python_libs,
                                                           monkeypatch):
    home = lay_out_spark_home(tmp_path, python_libs, jars_version="5.0.0")
    monkeypatch.setenv("SPARK_HOME", str(home))
    builder = SparkSession.builder.master("local[1]")
    options = dict(builder._options)
    python = os.environ.get("PYSPARK_PYTHON")
    with pytest.raises(SparkHomeError, match=re.escape(
            f"supports Spark 4.3.x only; found Spark 5.0.0 at {home}")):
        arrowstate.configure(builder)
    assert builder._options == options and os.environ.get("PYSPARK_PYTHON") == python


def test_a_distribution_with_another_pyspark_is_refused(tmp_path, python_libs,
                                                        python_without_pyspark):
    home = lay_out_spark_home(tmp_path, python_libs, jars_version="4.2.0",
                              pyspark_version="4.2.0")
    before = shim_jars()
    done = run(python_without_pyspark, ["-m", "arrowstate", "build"], home)
    assert done.returncode != 0
    assert (f"arrowstate {arrowstate.__version__} supports Spark 4.3.x only; found pyspark "
            f"4.2.0 at {home / 'python' / 'pyspark'}") in done.stderr
    assert shim_jars() == before, "nothing is built"
