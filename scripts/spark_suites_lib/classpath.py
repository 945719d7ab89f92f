"""The test class path: Spark's test jars and test libraries resolved once with `mvn` into
the cache (less what pyspark's runtime already has), and the suites a name stands for."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from .config import (LOG4J2, SCALA_BINARY, SPARK_TEST_JARS, SPARK_TEST_VERSION, SUITE_GROUPS,
                     TEST_LIBRARIES, NoTestJars, ScriptError)


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
