"""Scala unit tests of shim pieces that need no SparkSession (tests/jvm/unit/): compiled into
the test jar with the JVM helpers (the `test_jar` fixture, one scalac run), run in one JVM by
UnitTestRunner, reported here one pytest test per Scala test. No Spark session starts; the
shim jar and `java` are needed (hence under tests/spark).

To add Scala tests, drop a file into tests/jvm/unit/ with an `object ... extends UnitTests`
that registers `test("name") { ... }` (tests/jvm/unit/UnitTests.scala says more); nothing
here changes. The names are read from the sources with a regular expression, so name tests
with plain string literals. Run them alone with

    PYTHONPATH=python python -m pytest tests/spark/test_jvm_units.py
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[1] / "jvm" / "unit"
RUNNER = "org.apache.spark.sql.arrowstate.unit.UnitTestRunner"
_OBJECT = re.compile(r"^object\s+(\w+)\s+extends\s+UnitTests\b", re.M)
_TEST = re.compile(r'\btest\("((?:[^"\\]|\\.)*)"\)')


def declared_tests() -> list[str]:
    """'Suite: test name' of every test the sources in tests/jvm/unit/ register."""
    ids = []
    for source in sorted(UNIT.glob("*.scala")):
        text = source.read_text()
        objects = list(_OBJECT.finditer(text))
        for i, obj in enumerate(objects):
            body = text[obj.end():objects[i + 1].start() if i + 1 < len(objects) else None]
            for literal in _TEST.findall(body):
                name = re.sub(r"\\(.)", r"\1", literal)   # \" and \\ as the JVM reads them
                ids.append(f"{obj.group(1)}: {name}")
    return ids


@pytest.fixture(scope="module")
def jvm_units(test_jar):
    """Runs every Scala unit test once: ({'Suite: test': (passed, its report)}, output)."""
    from arrowstate.shim import CONTRACT, jar_path, spark_jars_dir

    java = shutil.which("java") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    cp = os.pathsep.join([test_jar, jar_path(), str(spark_jars_dir() / "*")])
    # as Spark starts its JVMs on Java 17: Arrow reaches direct buffers through java.nio
    opens = ["--add-opens=java.base/java.nio=ALL-UNNAMED",
             "-Dio.netty.tryReflectionSetAccessible=true"]
    done = subprocess.run([java, *opens, f"-Darrowstate.contract={CONTRACT}", "-cp", cp, RUNNER],
                          capture_output=True, text=True, timeout=600)
    results: dict[str, tuple[bool, str]] = {}
    current = None
    for line in done.stdout.splitlines():
        m = re.match(r"^(PASS|FAIL) (.+)$", line)
        if m:
            current = m.group(2)
            results[current] = (m.group(1) == "PASS", "")
        elif current is not None and line.startswith("    "):
            passed, report = results[current]
            results[current] = (passed, report + line[4:] + "\n")
        else:
            current = None
    output = done.stdout + done.stderr
    failed = any(not passed for passed, _ in results.values())
    assert done.returncode == (1 if failed else 0), f"runner exit {done.returncode}:\n{output}"
    return results, output


@pytest.mark.parametrize("test_id", declared_tests())
def test_scala(jvm_units, test_id):
    results, output = jvm_units
    suite = test_id.split(": ", 1)[0]
    passed, report = results.get(test_id) or results.get(f"{suite}: (initialisation)") or (
        False, f"the runner did not run it:\n{output[-4000:]}")
    if not passed:
        pytest.fail(f"{test_id}\n{report}", pytrace=False)


def test_every_scala_test_is_collected(jvm_units):
    """The runner ran what the sources declare: no test whose name the regular expression
    cannot read, no object that failed to initialise ('Suite: (initialisation)')."""
    results, output = jvm_units
    declared = declared_tests()
    assert declared, f"no Scala unit tests found in {UNIT}"
    assert sorted(results) == sorted(declared), output[-4000:]
