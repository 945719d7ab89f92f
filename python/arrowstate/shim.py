"""Builds and finds the JVM shim jar.

The jar is compiled from the Scala sources with the Scala compiler that Spark's jars carry
(the pip wheel's or a distribution's), against the very Spark jars it will run with, so
installing needs no download. One jar is kept per Spark (spark_home.Spark.key).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ._version import __version__
from .spark_home import Spark, find_spark

log = logging.getLogger("arrowstate")

_PACKAGE_DIR = Path(__file__).resolve().parent
CONTRACT = _PACKAGE_DIR / "contract.json"


def spark_jars_dir() -> Path:
    """The jars of the Spark that pyspark runs: SPARK_HOME's if set, else the wheel's."""
    return find_spark().jars


def jar_name(spark: Spark) -> str:
    return f"arrowstate-shim_2.13-{__version__}-spark{spark.version}-{spark.key()}.jar"


def scala_sources() -> list[Path]:
    """The shim's sources: from a source checkout, or as shipped inside the package."""
    for root in (_PACKAGE_DIR.parent.parent / "jvm-shim" / "src" / "main" / "scala",
                 _PACKAGE_DIR / "shim_src"):
        files = sorted(root.rglob("*.scala")) if root.is_dir() else []
        if files:
            return files
    raise FileNotFoundError("arrowstate: the JVM shim's Scala sources are not installed")


def _jar_dirs() -> list[Path]:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "arrowstate"
    return [_PACKAGE_DIR / "jars", cache]


def jar_version(jar: Path) -> str | None:
    try:
        with zipfile.ZipFile(jar) as z:
            for line in z.read("arrowstate.properties").decode().splitlines():
                if line.startswith("version="):
                    return line.split("=", 1)[1].strip()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    return None


def find_jar(spark: Spark) -> Path | None:
    """This version's shim built against this Spark's jars, if built."""
    for d in _jar_dirs():
        jar = d / jar_name(spark)
        if jar.is_file() and jar_version(jar) == __version__:
            return jar
    return None


def compile_scala(sources: list[Path], classes: Path, extra_classpath: list[str] = ()) -> None:
    """Compiles Scala sources into `classes` with the Scala compiler the Spark jars carry,
    against those jars (and `extra_classpath`)."""
    jars = spark_jars_dir()
    all_jars = sorted(str(p) for p in jars.glob("*.jar")) + list(extra_classpath)
    compiler = [str(p) for p in sorted(jars.glob("scala-compiler-*.jar"))
                + sorted(jars.glob("scala-library-*.jar"))
                + sorted(jars.glob("scala-reflect-*.jar"))]
    if len(compiler) < 3:
        raise RuntimeError(f"arrowstate: no Scala compiler among the Spark jars in {jars}")
    java = shutil.which("java") or (os.environ.get("JAVA_HOME", "") + "/bin/java")
    cmd = [java, "-cp", os.pathsep.join(compiler), "scala.tools.nsc.Main",
           "-nowarn", "-cp", os.pathsep.join(all_jars), "-d", str(classes), *map(str, sources)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"arrowstate: compiling {len(sources)} Scala sources failed:\n"
                           + done.stdout + done.stderr)


def write_jar(classes: Path, target: Path, extra: dict[str, Path | str] = {}) -> Path:
    """Zips `classes` (plus `extra` entries: name -> file or text) into `target` atomically."""
    partial = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for name, content in extra.items():
            if isinstance(content, Path):
                z.write(content, name)
            else:
                z.writestr(name, content)
        for f in sorted(classes.rglob("*.class")):
            z.write(f, f.relative_to(classes).as_posix())
    os.replace(partial, target)
    return target


def build_jar(quiet: bool = False) -> Path:
    """Compiles the shim against the Spark in use into the package (or the user cache if the
    package is read-only)."""
    spark = find_spark()
    with tempfile.TemporaryDirectory(prefix="arrowstate-build-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        if not quiet:
            print(f"arrowstate: compiling the JVM shim against Spark {spark.version}'s jars "
                  f"in {spark.jars}", file=sys.stderr)
        compile_scala(scala_sources(), classes)
        last_error: Exception | None = None
        for d in _jar_dirs():
            try:
                d.mkdir(parents=True, exist_ok=True)
                return write_jar(classes, d / jar_name(spark), {
                    "arrowstate.properties": f"version={__version__}\nspark.version="
                                             f"{spark.version}\nspark.jars={spark.jars}\n",
                    "arrowstate/contract.json": CONTRACT})
            except OSError as e:
                last_error = e
        raise RuntimeError(f"arrowstate: cannot write the shim jar: {last_error}")


def jar_path(build: bool = True) -> str:
    """The shim jar matching this package's version and the Spark in use, building it once
    if needed."""
    spark = find_spark()
    jar = find_jar(spark)
    if jar is None:
        if not build:
            raise FileNotFoundError(
                f"arrowstate: no shim jar for version {__version__} and Spark {spark.version}"
                f" ({spark.jars}); run `python -m arrowstate build`")
        log.warning("arrowstate: building the JVM shim for version %s against Spark %s's "
                    "jars in %s (once)", __version__, spark.version, spark.jars)
        jar = build_jar(quiet=True)
    return str(jar)
