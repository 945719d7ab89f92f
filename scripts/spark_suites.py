"""Spark's own Scala test suites for stateful operators, run against the installed Spark with
arrowstate off and on, compared test by test.

    python scripts/spark_suites.py [--suites A,B,...] [--modes off,on] [--out DIR]
                                   [--only TEST_NAME_SUBSTRING] [--cache DIR] [--timeout S]

Spark's suites run from their test jars (Spark 4.3.0's are not published, so 4.2.0's, which
Maven Central has) on the runtime that pyspark ships (its `jars/`), with ScalaTest's Runner,
one JVM per suite and mode, one at a time. The test jars and the test libraries (ScalaTest,
ScalaCheck, Mockito) are downloaded once with `mvn` into the cache (default
~/.cache/arrowstate/spark-suites); nothing there that the runtime already has (Spark, Scala,
Hadoop jars) goes on the class path. The SQL test jar is unpacked: its suites open resources
(old checkpoints) as files.

Modes: `off` runs the suites on Spark's class path plus the shim jar; `on` the same class path
with `-Dspark.sql.extensions=...ArrowStateExtensions` (and arrowstate's explain provider): the
suites' `new SparkConf()` reads `spark.*` system properties. Without `off` in --modes, the tests
that do not pass on are run again off (only those) to tell regressions from tests that fail
anyway.

Prints per suite and mode the counts and seconds, and the tests that pass off but fail on
(first line of each failure); writes report.json (every test's status, failures' messages and
stack traces, the plugin's frames among them) and the suites' logs into --out. Exit code: 0 if
no test passes off and fails on but those in EXPECTED_FAILURES; 1 if one does (a test that
passes off and does not run on, its suite aborted or timed out, counts); 2 if there is nothing
to compare with (a suite aborts or times out with arrowstate off) or on an error of the
script's own (bad arguments, a suite not in the jar); 3 if the test jars are not cached and
cannot be downloaded (no `mvn`, no network).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

# Tests known not to pass under arrowstate, with the reason: {suite's simple name: {test
# name: reason}}. Such a test failing with arrowstate on (and passing off) does not make the
# exit code non-zero; it is still listed, marked expected.
LOOKS_UP_SPARKS_NODE = ("looks up Spark's StateStoreSaveExec in the executed plan, where "
                        "arrowstate's ArrowStateStoreSave runs in its place")
OPENS_SPARKS_FILES = ("opens the checkpoint's state with Spark's HDFS-backed provider itself "
                      "(StateStore.getReadOnly), which reads Spark's own files only; Spark's "
                      "statestore reader reads arrowstate's")
EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "StreamingDeduplicationSuite": {
        "Partition key extraction - Dedupe": OPENS_SPARKS_FILES},
    "StreamingDeduplicationWithinWatermarkSuite": {
        "Partition key extraction - DedupeWithinWatermark": OPENS_SPARKS_FILES},
    "StreamingAggregationSuite": {
        "state metrics - append mode - state format version 2": LOOKS_UP_SPARKS_NODE,
        "state metrics - update/complete mode - state format version 2": LOOKS_UP_SPARKS_NODE,
        "SPARK-21977: coalesce(1) with 0 partition RDD should be repartitioned to 1 - state "
        "format version 2": LOOKS_UP_SPARKS_NODE,
        "SPARK-21977: coalesce(1) with aggregation should still be repartitioned when it has "
        "non-empty grouping keys - state format version 2": LOOKS_UP_SPARKS_NODE,
        "changing schema of state when restarting query - schema check off - state format "
        "version 2": "expects the failure's cause to be exactly of class SparkException; Spark "
        "exposes a task's error that carries a condition as that cause, and arrowstate's is "
        "ArrowStatePythonException, a SparkException subclass (its answer, a failure, is "
        "Spark's)"},
    "MultiStatefulOperatorsSuite": {
        "stream-stream time interval left outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE,
        "stream-stream time interval right outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE},
}

SPARK_TEST_VERSION = "4.2.0"   # the newest Spark whose test jars Maven Central has
SCALA_BINARY = "2.13"
# the test libraries of Spark 4.2.0's build (its parent pom)
TEST_LIBRARIES = [
    ("org.scalatest", f"scalatest_{SCALA_BINARY}", "3.2.19"),
    ("org.scalatestplus", f"scalacheck-1-18_{SCALA_BINARY}", "3.2.19.0"),
    ("org.scalatestplus", f"mockito-5-18_{SCALA_BINARY}", "3.2.19.0"),
    ("org.mockito", "mockito-core", "5.23.0"),
    ("net.bytebuddy", "byte-buddy", "1.18.4"),
    ("net.bytebuddy", "byte-buddy-agent", "1.18.4"),
]
# Spark's test jars: the suites (sql), the base classes they extend (core: SparkFunSuite,
# catalyst: PlanTest, SQLHelper) and the test tags (tags)
SPARK_TEST_JARS = ["spark-sql", "spark-core", "spark-catalyst", "spark-tags"]

SQL_STREAMING = "org.apache.spark.sql.streaming"
STATE_READER = "org.apache.spark.sql.execution.datasources.v2.state"
SUITE_GROUPS = {
    # what this project's operators replace, and the state data source reading their state
    "default": [
        f"{SQL_STREAMING}.StreamingDeduplicationSuite",
        f"{SQL_STREAMING}.StreamingDeduplicationWithinWatermarkSuite",
        f"{SQL_STREAMING}.StreamingAggregationSuite",
        f"{SQL_STREAMING}.StreamingSessionWindowSuite",
        f"{SQL_STREAMING}.MultiStatefulOperatorsSuite",
        f"{STATE_READER}.HDFSBackedStateDataSourceReadSuite",
        f"{STATE_READER}.RocksDBStateDataSourceReadSuite",
        f"{STATE_READER}.RocksDBWithChangelogCheckpointStateDataSourceReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceReaderSnapshotSuite",
        f"{STATE_READER}.HDFSBackedStateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.RocksDBWithChangelogCheckpointStateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.StateDataSourceNegativeTestSuite",
        f"{STATE_READER}.StateDataSourceSQLConfigSuite",
        f"{STATE_READER}.StateDataSourceNoEmptyDirCreationSuite",
        f"{STATE_READER}.StatePartitionAllColumnFamiliesReaderSuite",
    ],
    # the same operators on RocksDB, their distribution checks, and the state reader's suites
    # for Scala transformWithState (which stays Spark's operator)
    "extra": [
        f"{SQL_STREAMING}.RocksDBStateStoreStreamingDeduplicationSuite",
        f"{SQL_STREAMING}.RocksDBStateStoreStreamingAggregationSuite",
        f"{SQL_STREAMING}.DeprecatedStreamingAggregationSuite",
        f"{SQL_STREAMING}.StreamingDeduplicationDistributionSuite",
        f"{SQL_STREAMING}.StreamingAggregationDistributionSuite",
        f"{SQL_STREAMING}.StreamingSessionWindowDistributionSuite",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuite",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuiteCheckpointV2",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuiteWithRowChecksum",
    ],
}
SUITE_GROUPS["all"] = SUITE_GROUPS["default"] + SUITE_GROUPS["extra"]

EXTENSIONS = "org.apache.spark.sql.arrowstate.ArrowStateExtensions"
EXPLAIN_PROVIDER = "org.apache.spark.sql.arrowstate.ArrowStateExplainGenerator"

# Spark's build: scalatest-maven-plugin's argLine (with extraJavaTestArgs) and system properties
JAVA_OPTIONS = [
    "-ea", "-Xmx4g", "-Xss4m", "-XX:MaxMetaspaceSize=2g", "-XX:ReservedCodeCacheSize=128m",
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    *[f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net",
        "java.nio", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
        "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action",
        "sun.util.calendar")],
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.type=pooled",
    "-Dio.netty.handler.ssl.defaultEndpointVerificationAlgorithm=NONE",
    "--sun-misc-unsafe-memory-access=allow",
    "--enable-native-access=ALL-UNNAMED",
    "-XX:+EnableDynamicAgentLoading",
    "-Dderby.system.durability=test",
    "-Djava.awt.headless=true",
    "-Dspark.testing=1",
    "-Dspark.master.rest.enabled=false",
    "-Dspark.ui.enabled=false",
    "-Dspark.ui.showConsoleProgress=false",
    "-Dspark.unsafe.exceptionOnMemoryLeak=true",
    "-Dspark.hadoop.hadoop.caller.context.enabled=true",
    "-Dspark.memory.debugFill=true",
]

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = File
appender.file.type = File
appender.file.name = File
appender.file.fileName = ${sys:arrowstate.suites.log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss.SSS} %t %p %c{1}: %m%n%ex
"""

EXIT_REGRESSION, EXIT_ERROR, EXIT_NO_JARS = 1, 2, 3


class NoTestJars(Exception):
    """The test jars are not cached and cannot be downloaded (no mvn, no network)."""


class ScriptError(Exception):
    """An error of the script's own (bad arguments, a suite not in the jar): exit code 2."""


# ---------------------------------------------------------------------------------------------
# the class path


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def runtime_jars() -> Path:
    return pyspark_home() / "jars"


def _artifact_of(jar_name: str) -> str:
    """A jar file's artifactId: its name less '-<version>...' ('scala-xml_2.13-2.4.0.jar')."""
    m = re.match(r"^(.+?)-\d[^/]*\.jar$", jar_name)
    return m.group(1) if m else jar_name[:-4]


def _pom(spark_version: str) -> str:
    deps = []
    for name in SPARK_TEST_JARS:
        deps.append(f"""
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>{name}_{SCALA_BINARY}</artifactId><version>{spark_version}</version>
      <classifier>tests</classifier>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>
      </exclusions></dependency>""")
    for group, artifact, version in TEST_LIBRARIES:
        deps.append(f"""
    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>
      <version>{version}</version></dependency>""")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- written by arrowstate's scripts/spark_suites.py: resolves Spark's test jars and test
     libraries; not built -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>arrowstate.local</groupId><artifactId>spark-suites</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>{''.join(deps)}
  </dependencies>
</project>
"""


_NETWORK_SIGNS = ("UnknownHostException", "Could not transfer", "Connection refused",
                  "Network is unreachable", "connect timed out", "Read timed out",
                  "No route to host", "Temporary failure in name resolution",
                  "Connect to repo", "offline mode", "Cannot access central",
                  # the dependency plugin itself could not be downloaded
                  "No plugin found for prefix")


def prepare(cache: Path, spark_version: str) -> dict:
    """The test class path, from the cache or downloaded into it. Returns {'sql_tests': dir,
    'jars': [...], 'dropped': [...]} (dropped: what the runtime already has)."""
    pom = _pom(spark_version)
    key = hashlib.sha256(pom.encode()).hexdigest()[:12]
    home = cache / f"spark-{spark_version}-{key}"
    manifest = home / "classpath.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        if all(Path(p).is_file() for p in data["jars"]) and Path(data["sql_tests"]).is_dir():
            return data
    mvn = shutil.which("mvn")
    if mvn is None:
        raise NoTestJars("`mvn` is not on the PATH (needed once, to download Spark's test "
                         f"jars into {cache})")
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(pom)
    listing = home / "dependencies.txt"
    print(f"spark_suites: resolving Spark {spark_version} test jars with mvn into {home}",
          flush=True)
    proc = subprocess.run(
        [mvn, "-B", "-q", "-f", str(home / "pom.xml"), "dependency:list",
         "-DoutputAbsoluteArtifactFilename=true", f"-DoutputFile={listing}",
         "-DincludeScope=runtime", "-DexcludeTransitive=false"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=home)
    if proc.returncode != 0:
        out = proc.stdout[-4000:]
        if any(s in proc.stdout for s in _NETWORK_SIGNS):
            raise NoTestJars(f"mvn cannot download Spark's test jars (network):\n{out}")
        raise ScriptError(f"mvn failed to resolve Spark's test jars:\n{out}")
    runtime = {_artifact_of(j.name) for j in runtime_jars().glob("*.jar")}
    jars, dropped, sql_jar = [], [], None
    for line in listing.read_text().splitlines():
        # group:artifact:type[:classifier]:version:scope:/path (the path last)
        m = re.match(r"^\s*([^:\s]+):([^:\s]+):([^:\s]+):(?:([^:\s]+):)?([^:\s]+):(\w+):(/.+?)"
                     r"(?:\s+--.*)?$", line)
        if not m:
            continue
        group, artifact, _type, classifier, _version, _scope, path = m.groups()
        if classifier == "tests" and artifact == f"spark-sql_{SCALA_BINARY}":
            sql_jar = path
            continue
        if ((group == "org.apache.spark" and classifier != "tests")
                or group in ("org.scala-lang", "org.apache.hadoop")
                or (artifact in runtime and classifier != "tests")):
            dropped.append(f"{group}:{artifact}:{_version}")
            continue
        target = home / "lib" / Path(path).name
        target.parent.mkdir(exist_ok=True)
        shutil.copy2(path, target)
        jars.append(str(target))
    if sql_jar is None:
        raise ScriptError(f"mvn listed no spark-sql tests jar:\n{listing.read_text()}")
    sql_tests = home / "spark-sql-tests"
    if sql_tests.exists():
        shutil.rmtree(sql_tests)
    partial = home / "spark-sql-tests.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(sql_jar) as z:
        z.extractall(partial)
    partial.rename(sql_tests)
    (home / "log4j2.properties").write_text(LOG4J2)
    data = {"spark_test_version": spark_version, "sql_tests": str(sql_tests),
            "sql_tests_jar": sql_jar, "jars": sorted(jars), "dropped": sorted(dropped),
            "log4j2": str(home / "log4j2.properties")}
    manifest.write_text(json.dumps(data, indent=1))
    return data


def resolve_suites(names: list[str], sql_tests: Path) -> list[str]:
    out: list[str] = []
    for name in names:
        if name in SUITE_GROUPS:
            out += [s for s in SUITE_GROUPS[name] if s not in out]
            continue
        if "." in name:
            candidates = [name] if (sql_tests / (name.replace(".", "/") + ".class")).is_file() \
                else []
        else:
            candidates = sorted(
                str(p.relative_to(sql_tests).with_suffix("")).replace("/", ".")
                for p in sql_tests.rglob(f"{name}.class"))
        if len(candidates) != 1:
            raise ScriptError(f"suite {name!r}: {'no such class' if not candidates else 'ambiguous: ' + ', '.join(candidates)} in the Spark {SPARK_TEST_VERSION} SQL test jar")
        chosen = [candidates[0]]
        classfile = sql_tests / (candidates[0].replace(".", "/") + ".class")
        if _class_header(classfile)[0] & 0x0600:   # ACC_ABSTRACT, ACC_INTERFACE
            # an abstract suite: its concrete subclasses in the same package, transitively
            chosen = _concrete_subclasses(candidates[0], classfile.parent)
            if not chosen:
                raise ScriptError(f"suite {name!r} is abstract and has no concrete subclass "
                                  "in its package")
        out += [c for c in chosen if c not in out]
    return out


def _class_header(path: Path) -> tuple[int, str, str]:
    """A class file's access flags, its name and its superclass's (dotted)."""
    data = path.read_bytes()
    count = int.from_bytes(data[8:10], "big")
    pos, i, utf8, classes = 10, 1, {}, {}
    while i < count:
        tag = data[pos]
        if tag == 1:
            n = int.from_bytes(data[pos + 1:pos + 3], "big")
            utf8[i] = data[pos + 3:pos + 3 + n].decode("utf-8", "replace")
            pos += 3 + n
        elif tag == 7:
            classes[i] = int.from_bytes(data[pos + 1:pos + 3], "big")
            pos += 3
        elif tag in (8, 16, 19, 20):
            pos += 3
        elif tag == 15:
            pos += 4
        elif tag in (3, 4, 9, 10, 11, 12, 17, 18):
            pos += 5
        elif tag in (5, 6):
            pos += 9
            i += 1   # longs and doubles take two entries
        else:
            raise ScriptError(f"{path}: unknown constant pool tag {tag}")
        i += 1
    flags = int.from_bytes(data[pos:pos + 2], "big")
    this = int.from_bytes(data[pos + 2:pos + 4], "big")
    sup = int.from_bytes(data[pos + 4:pos + 6], "big")
    name = lambda k: utf8.get(classes.get(k, 0), "").replace("/", ".")  # noqa: E731
    return flags, name(this), name(sup)


def _concrete_subclasses(base: str, package_dir: Path) -> list[str]:
    headers = {}
    for f in package_dir.glob("*.class"):
        if "$" not in f.name:
            flags, this, sup = _class_header(f)
            headers[this] = (flags, sup)
    found, frontier = [], {base}
    while frontier:
        nxt = {c for c, (_, sup) in headers.items() if sup in frontier}
        found += sorted(c for c in nxt if not headers[c][0] & 0x0600)
        frontier = nxt
    return found


# ---------------------------------------------------------------------------------------------
# one suite in one mode

_DURATION = r"\((?:\d+ (?:hours?|minutes?|seconds?|milliseconds?)(?:, )?)+\)"


def parse_report(text: str) -> tuple[dict[str, dict], list[str]]:
    """ScalaTest's file reporter (-fWD): {test: {status, seconds?}}, and the abort notes."""
    tests: dict[str, dict] = {}
    aborts: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "*** ABORTED ***" in line or "*** RUN ABORTED ***" in line:
            aborts.append("\n".join(lines[i:i + 8]))
            continue
        if not line.startswith("- "):
            continue
        body = line[2:]
        seconds = None
        m = re.search(r" " + _DURATION + r"$", body)
        if m:
            seconds = _seconds(m.group(0))
            body = body[:m.start()]
        status = "passed"
        for note, st in (("*** FAILED ***", "failed"), ("!!! CANCELED !!!", "canceled"),
                         ("!!! IGNORED !!!", "ignored"), ("(pending)", "pending")):
            if body.endswith(" " + note):
                status, body = st, body[:-len(note) - 1]
                break
        entry = {"status": status}
        if seconds is not None:
            entry["seconds"] = seconds
        if status in ("failed", "canceled"):
            # the message (its first line indented by two spaces, the rest as it is) and
            # ScalaTest's short trace follow, up to the next test or the run's end
            msg = []
            for nxt in lines[i + 1:i + 3000]:
                if nxt.startswith("- ") or nxt.startswith("Run completed in ") or \
                        "*** ABORTED ***" in nxt:
                    break
                msg.append(nxt[2:] if not msg and nxt.startswith("  ") else nxt)
            if msg:
                entry["message"] = "\n".join(msg).strip("\n")
        tests[body] = entry
    return tests, aborts


def _seconds(duration: str) -> float:
    total = 0.0
    for n, unit in re.findall(r"(\d+) (hour|minute|second|millisecond)", duration):
        total += int(n) * {"hour": 3600, "minute": 60, "second": 1, "millisecond": 0.001}[unit]
    return round(total, 3)


def parse_junit(xml_dir: Path) -> dict[str, dict]:
    """Failure details from ScalaTest's JUnit XML: {test: {message, trace}} (the message as
    the trace's text has it, lines kept: the XML attribute has them joined)."""
    details: dict[str, dict] = {}
    for f in xml_dir.glob("*.xml"):
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError:
            continue
        for tc in root.iter("testcase"):
            for child in tc:
                if child.tag in ("failure", "error"):
                    trace = textwrap.dedent((child.text or "").strip("\n"))
                    details[tc.get("name")] = {
                        "message": _trace_message(trace) or child.get("message") or "",
                        "trace": trace}
    return details


def _trace_message(trace: str) -> str:
    """The message at the head of a JUnit XML trace (up to its first frame)."""
    head = []
    for line in trace.splitlines():
        if re.match(r"^\s*at \S+\(.*\)$", line):
            break
        head.append(line)
    return "\n".join(head).strip("\n")


# a JVM frame or exception of the shim, a Python frame in arrowstate, a Python exception of it
PLUGIN_FRAME = re.compile(r"org\.apache\.spark\.sql\.arrowstate\.\S|/arrowstate/\S+\.py\b|"
                          r"^arrowstate\.[\w.]+: ")


def where(frames: list[str]) -> str | None:
    """The plugin's frame that tells most: the Python one that raised, else the first JVM."""
    py = [f for f in frames if re.search(r'File ".*/arrowstate/.*\.py"', f)]
    if py:
        return py[-1]
    jvm = [f for f in frames if f.startswith("at org.apache.spark.sql.arrowstate.")]
    return jvm[0] if jvm else (frames[0][:300] if frames else None)


def plugin_frames(text: str) -> list[str]:
    """The lines of a failure that name arrowstate (its JVM classes, its Python files)."""
    seen, out = set(), []
    for line in text.splitlines():
        s = line.strip()
        if PLUGIN_FRAME.search(s) and s not in seen and len(s) < 600:
            seen.add(s)
            out.append(s)
    return out[:20]


_PREFIXES = [
    r"^(?:org\.apache\.spark\.sql\.streaming\.StreamingQueryException|"
    r"org\.apache\.spark\.SparkException|org\.scalatest\.exceptions\.TestFailedException):"
    r" ?",
    r"^[\w.$]+(?:Exception|Error): (?=\[STREAM_FAILED\])",
    r"^\[STREAM_FAILED\] Query \[id = [^\]]*\] terminated with exception: ",
    r"^Job aborted due to stage failure: Task \S+ in stage \S+ failed \d+ times?, most recent "
    r"failure: Lost task \S+ in stage \S+ \(TID \d+\) \([^)]*\): ",
]


def first_line(text: str) -> str:
    """What a failure says, in a line: its message's first line less Spark's wrapping (the
    streaming query's, the failed job's), with the Python exception of a traceback and the
    step of a StreamTest that failed."""
    text = text or ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    line = lines[0] if lines else ""
    for _ in range(3):
        for p in _PREFIXES:
            line = re.sub(p, "", line)
    if not line and len(lines) > 1:   # 'SomeException: ' with the message on the next line
        line = lines[1]
    if "Traceback (most recent call last)" in text:
        after = text[text.index("Traceback (most recent call last)"):].splitlines()[1:]
        exc = next((x for x in after if x and not x[0].isspace()), None)
        if exc:
            line = f"{line.split('Traceback')[0].strip()} ... {exc.strip()}"
    step = re.search(r"^\s*=> (.+)$", text, re.M)
    if step and "== Progress ==" in text:
        line = f"{line} [failing step: {step.group(1).strip()}]"
    return line[:500]


def run_suite(suite: str, mode: str, cp: list[str], prepared: dict, work: Path,
              logs: Path, timeout: float, selectors: list[str]) -> dict:
    simple = suite.rsplit(".", 1)[-1]
    tag = f"{simple}.{mode}" + (".confirm" if any(s == "-t" for s in selectors) else "")
    run_dir = work / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "tmp").mkdir(parents=True)
    (run_dir / "junit").mkdir()
    report = logs / f"{tag}.report.txt"
    for f in (report, logs / f"{tag}.spark.log"):
        f.unlink(missing_ok=True)
    java = str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") \
        if os.environ.get("JAVA_HOME") else "java"
    cmd = [java, *JAVA_OPTIONS,
           f"-Dlog4j2.configurationFile={prepared['log4j2']}",
           f"-Darrowstate.suites.log={logs / (tag + '.spark.log')}",
           f"-Djava.io.tmpdir={run_dir / 'tmp'}",
           f"-Dspark.test.home={pyspark_home()}"]
    if mode == "on":
        cmd += [f"-Dspark.sql.extensions={EXTENSIONS}",
                f"-Dspark.sql.extendedExplainProviders={EXPLAIN_PROVIDER}"]
    cmd += ["-cp", os.pathsep.join(cp), "org.scalatest.tools.Runner",
            "-R", prepared["sql_tests"], "-fWD", str(report), "-u", str(run_dir / "junit"),
            "-s", suite, *selectors]
    env = dict(os.environ)
    env.update({
        "SPARK_TESTING": "1",
        # the Python workers (Spark's and arrowstate's): this interpreter, which has pyspark
        "PYSPARK_PYTHON": sys.executable,
        # pyspark's home, as pyspark's own launcher sets it (a SPARK_HOME of another Spark
        # would put its pyspark.zip first on the workers' PYTHONPATH)
        "SPARK_HOME": str(pyspark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SCALA_VERSION": SCALA_BINARY,
    })
    start = time.monotonic()
    with open(logs / f"{tag}.stdout.txt", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            code = proc.wait()
    seconds = round(time.monotonic() - start, 1)
    text = report.read_text(errors="replace") if report.is_file() else ""
    tests, aborts = parse_report(text)
    for name, d in parse_junit(run_dir / "junit").items():
        entry = tests.setdefault(name, {"status": "failed"})
        entry["message"] = d["message"]
        entry["trace"] = d["trace"]
    for entry in tests.values():
        if entry["status"] in ("failed", "canceled"):
            entry["first_line"] = first_line(entry.get("message", ""))
            frames = plugin_frames(entry.get("trace") or entry.get("message", ""))
            if frames:
                entry["plugin_frames"] = frames
    counts = {k: sum(1 for t in tests.values() if t["status"] == k)
              for k in ("passed", "failed", "ignored", "canceled", "pending")}
    result = {"suite": suite, "mode": mode, "seconds": seconds, "exit_code": code,
              "counts": counts, "tests": tests,
              "logs": {"report": str(report), "stdout": str(logs / f"{tag}.stdout.txt"),
                       "spark_log": str(logs / f"{tag}.spark.log")}}
    if timed_out:
        result["timed_out"] = f"killed after {timeout:.0f} s"
    if aborts:
        result["aborted"] = aborts
    if not tests and not timed_out:
        stdout_tail = (logs / f"{tag}.stdout.txt").read_text(errors="replace")[-3000:]
        result.setdefault("aborted", []).append(f"no test reported; JVM exit {code}:\n"
                                                f"{stdout_tail}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """The JVM this script started and what it started (its session's process group)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------------------------------------
# comparing


def compare(suite: str, off: dict | None, on: dict | None) -> list[dict]:
    """Tests that pass off and do not pass on (failed, canceled, or not run at all)."""
    if off is None or on is None:
        return []
    simple = suite.rsplit(".", 1)[-1]
    expected = EXPECTED_FAILURES.get(simple, {})
    out = []
    for name, t in off["tests"].items():
        if t["status"] != "passed":
            continue
        o = on["tests"].get(name)
        if o is not None and o["status"] == "passed":
            continue
        if o is None and not (on.get("timed_out") or on.get("aborted")):
            # a complete run without this name: the suite names tests at random (such as
            # StateDataSourceSQLConfigSuite's sampled configurations); nothing to compare
            continue
        if o is None:
            why = on.get("timed_out") or "suite aborted"
            entry = {"test": name, "on_status": "not run",
                     "first_line": f"did not run with arrowstate on: {first_line(why)}"}
            if on.get("aborted"):
                entry["message"] = "\n\n".join(on["aborted"])
        else:
            msg = o.get("message", "")
            entry = {"test": name, "on_status": o["status"],
                     "first_line": o.get("first_line") or first_line(msg),
                     "message": msg, "trace": o.get("trace", "")}
            if o.get("plugin_frames"):
                entry["plugin_frames"] = o["plugin_frames"]
        if name in expected:
            entry["expected"] = expected[name]
        out.append(entry)
    return out


def print_mode(r: dict) -> None:
    c = r["counts"]
    extra = ""
    if r.get("timed_out"):
        extra += f"  TIMED OUT ({r['timed_out']})"
    if r.get("aborted"):
        extra += f"  ABORTED: {first_line(r['aborted'][0])}"
    print(f"  {r['mode']:>3}: {c['passed']:4d} passed {c['failed']:4d} failed "
          f"{c['ignored']:3d} ignored {c['canceled']:3d} canceled"
          + (f" {c['pending']} pending" if c["pending"] else "")
          + f"   {r['seconds']:8.1f} s{extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default="default",
                    help="comma-separated suite names (simple or fully qualified) or groups: "
                         + ", ".join(f"{k} ({len(v)})" for k, v in SUITE_GROUPS.items())
                         + " (default: default)")
    ap.add_argument("--modes", default="off,on", help="off, on or off,on (default)")
    ap.add_argument("--out", default=None,
                    help="directory for report.json and logs (default: a new temp dir)")
    ap.add_argument("--only", action="append", default=[], metavar="TEST_NAME_SUBSTRING",
                    help="run only the tests whose names contain this (repeatable)")
    ap.add_argument("--cache", default=None,
                    help="where the test jars go (default ~/.cache/arrowstate/spark-suites)")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds per suite and mode before the JVM is killed (default 3600)")
    ap.add_argument("--spark-test-version", default=SPARK_TEST_VERSION,
                    help=f"version of Spark's test jars (default {SPARK_TEST_VERSION})")
    ap.add_argument("--prepare-only", action="store_true",
                    help="download the test jars into the cache, run nothing")
    ap.add_argument("--list", action="store_true", help="print the suites chosen, run nothing")
    ap.add_argument("--summarize", metavar="REPORT_JSON",
                    help="print an earlier run's report.json again (judged with "
                         "EXPECTED_FAILURES as it is now), run nothing")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize(Path(args.summarize))

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("off", "on") for m in modes):
        print(f"spark_suites: --modes takes off, on or off,on; not {args.modes!r}",
              file=sys.stderr)
        return EXIT_ERROR
    modes = [m for m in ("off", "on") if m in modes]
    cache = Path(args.cache) if args.cache else \
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "arrowstate" / \
        "spark-suites"
    try:
        prepared = prepare(cache, args.spark_test_version)
    except NoTestJars as e:
        print(f"spark_suites: NO TEST JARS: {e}", file=sys.stderr)
        return EXIT_NO_JARS
    except ScriptError as e:
        print(f"spark_suites: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.prepare_only:
        print(f"spark_suites: test jars ready in {Path(prepared['sql_tests']).parent}")
        return 0
    try:
        suites = resolve_suites([s.strip() for s in args.suites.split(",") if s.strip()],
                                Path(prepared["sql_tests"]))
    except ScriptError as e:
        print(f"spark_suites: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.list:
        print("\n".join(suites))
        return 0

    from arrowstate.shim import jar_path

    shim = jar_path()
    # the worker's interpreter must import pyspark and arrowstate (the state worker module)
    check = subprocess.run(
        [sys.executable, "-c", "import pyspark, arrowstate.worker; print(pyspark.__version__)"],
        capture_output=True, text=True,
        env={**os.environ, "SPARK_HOME": str(pyspark_home())})
    if check.returncode != 0:
        print(f"spark_suites: {sys.executable} cannot import pyspark and arrowstate.worker:\n"
              f"{check.stderr}", file=sys.stderr)
        return EXIT_ERROR
    # test classes first, then test libraries, the runtime, the shim (in both modes)
    cp = [prepared["sql_tests"], *prepared["jars"], str(runtime_jars() / "*"), shim]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="spark-suites-"))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    selectors = [x for s in args.only for x in ("-z", s)]
    print(f"spark_suites: {len(suites)} suite(s), modes {','.join(modes)}; Spark runtime "
          f"{check.stdout.strip()} ({runtime_jars()}), test jars {args.spark_test_version}; "
          f"shim {shim}; out {out}", flush=True)

    report = {"started": dt.datetime.now().isoformat(timespec="seconds"),
              "argv": sys.argv[1:], "python": sys.executable,
              "spark_runtime": check.stdout.strip(), "runtime_jars": str(runtime_jars()),
              "spark_test_version": args.spark_test_version, "shim_jar": shim,
              "modes": modes, "only": args.only, "classpath": cp,
              "dropped_from_test_deps": prepared["dropped"],
              "expected_failures": EXPECTED_FAILURES, "suites": {}}
    report_file = out / "report.json"
    for suite in suites:
        simple = suite.rsplit(".", 1)[-1]
        print(f"{simple}  ({suite})", flush=True)
        results: dict[str, dict] = {}
        for mode in modes:
            results[mode] = run_suite(suite, mode, cp, prepared, work, logs, args.timeout,
                                      selectors)
            print_mode(results[mode])
        entry = {"modes": results}
        if "off" not in modes and "on" in results:
            # tell regressions from tests that fail anyway: the ones not passing on, off
            again = [n for n, t in results["on"]["tests"].items()
                     if t["status"] in ("failed", "canceled")]
            if again:
                r = run_suite(suite, "off", cp, prepared, work, logs, args.timeout,
                              [x for n in again for x in ("-t", n)])
                r["partial"] = "only the tests that did not pass on"
                print_mode(r)
                entry["off_confirmation"] = r
        evaluate(suite, entry)
        report["suites"][suite] = entry
        print_regressions(entry)
        report_file.write_text(json.dumps(report, indent=1))

    shutil.rmtree(work, ignore_errors=True)
    report["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    return finish(report, report_file)


def evaluate(suite: str, entry: dict) -> None:
    """Sets the suite's regressions (with EXPECTED_FAILURES as it is now), the expected
    failures that pass, and the errors (an off run that aborted or timed out)."""
    simple = suite.rsplit(".", 1)[-1]
    results = entry["modes"]
    if "off" not in results and "on" in results:
        on = results["on"]
        regressions = compare(suite, entry.get("off_confirmation") or {"tests": {}}, on)
        if on.get("aborted") or on.get("timed_out"):
            # what did not run on is unknown without an off run: counted as one
            why = on.get("timed_out") or first_line(on["aborted"][0])
            entry_ = {"test": "(the rest of the suite)", "on_status": "not run",
                      "first_line": "aborted or timed out with arrowstate on (no off run to "
                                    f"compare): {why}",
                      "message": "\n\n".join(on.get("aborted", []))}
            if "(the rest of the suite)" in EXPECTED_FAILURES.get(simple, {}):
                entry_["expected"] = EXPECTED_FAILURES[simple]["(the rest of the suite)"]
            regressions.append(entry_)
    else:
        regressions = compare(suite, results.get("off"), results.get("on"))
    entry["regressions"] = regressions
    if "off" in results and "on" in results and not any(
            r.get("timed_out") or r.get("aborted") for r in results.values()):
        off_names, on_names = set(results["off"]["tests"]), set(results["on"]["tests"])
        entry["unmatched_names"] = {"off_only": sorted(off_names - on_names),
                                    "on_only": sorted(on_names - off_names)}
    entry["expected_but_passed"] = [
        t for t in EXPECTED_FAILURES.get(simple, {})
        if "on" in results and results["on"]["tests"].get(t, {}).get("status") == "passed"]
    off = results.get("off")
    entry["errors"] = [f"{simple} off: " + (off.get("timed_out") or first_line(off["aborted"][0]))
                       ] if off and (off.get("timed_out") or off.get("aborted")) else []


def print_regressions(entry: dict) -> None:
    for r in entry["regressions"]:
        mark = f"expected: {r['expected']}" if "expected" in r else "REGRESSION"
        print(f"    pass off, {r['on_status']} on [{mark}]: {r['test']}\n"
              f"        {r['first_line']}", flush=True)
        if r.get("plugin_frames"):
            print(f"        {where(r['plugin_frames'])}", flush=True)
    unmatched = entry.get("unmatched_names") or {}
    if unmatched.get("off_only") or unmatched.get("on_only"):
        print(f"    not compared: {len(unmatched['off_only'])} test name(s) only off, "
              f"{len(unmatched['on_only'])} only on (names that differ between runs)")
    for t in entry["expected_but_passed"]:
        print(f"    listed in EXPECTED_FAILURES but passes on: {t}", flush=True)


def finish(report: dict, report_file: Path) -> int:
    unexpected = sum(1 for e in report["suites"].values() for r in e["regressions"]
                     if "expected" not in r)
    errors = [x for e in report["suites"].values() for x in e["errors"]]
    report["unexpected_regressions"] = unexpected
    report["errors"] = errors
    report["expected_failures"] = EXPECTED_FAILURES
    report_file.write_text(json.dumps(report, indent=1))
    modes = report["modes"]
    print("\nseconds per suite: " + ", ".join(modes))
    for suite, entry in report["suites"].items():
        secs = "  ".join(f"{entry['modes'][m]['seconds']:8.1f}" for m in modes
                         if m in entry["modes"])
        print(f"  {suite.rsplit('.', 1)[-1]:<62} {secs}")
    total = {m: sum(e["modes"][m]["seconds"] for e in report["suites"].values()
                    if m in e["modes"]) for m in modes}
    print(f"  {'(total)':<62} " + "  ".join(f"{total[m]:8.1f}" for m in modes))
    print(f"spark_suites: {unexpected} unexpected regression(s) "
          f"(tests that pass off and fail with arrowstate on); report {report_file}")
    for e in errors:
        print(f"spark_suites: ERROR (without arrowstate): {e}")
    return EXIT_REGRESSION if unexpected else EXIT_ERROR if errors else 0


def summarize(report_file: Path) -> int:
    """Prints an earlier run's report again, judged with EXPECTED_FAILURES as it is now."""
    report = json.loads(report_file.read_text())
    for suite, entry in report["suites"].items():
        for r in [*entry["modes"].values(), entry.get("off_confirmation")]:
            for t in (r or {}).get("tests", {}).values():
                if t.get("trace"):
                    t["message"] = _trace_message(t["trace"])
                if t["status"] in ("failed", "canceled"):
                    t["first_line"] = first_line(t.get("message", ""))
                    t["plugin_frames"] = plugin_frames(t.get("trace") or t.get("message", ""))
        print(f"{suite.rsplit('.', 1)[-1]}  ({suite})")
        for mode in ("off", "on"):
            if mode in entry["modes"]:
                print_mode(entry["modes"][mode])
        if entry.get("off_confirmation"):
            print_mode(entry["off_confirmation"])
        evaluate(suite, entry)
        print_regressions(entry)
    return finish(report, report_file)


if __name__ == "__main__":
    sys.exit(main())
