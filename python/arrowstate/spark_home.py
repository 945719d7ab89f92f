"""Finds the Spark that pyspark runs, whether the pip wheel or a distribution under SPARK_HOME.

The pip wheel is a Spark home of its own (`site-packages/pyspark` holds `bin/` and `jars/`).
A distribution keeps its jars in `$SPARK_HOME/jars` and its pyspark in
`$SPARK_HOME/python/pyspark` with py4j in `$SPARK_HOME/python/lib/py4j-*-src.zip`, which
`findspark` puts on sys.path. Either way pyspark starts its JVM from `$SPARK_HOME/bin` when
SPARK_HOME is set (pyspark's `find_spark_home`), so those are the jars the shim is built
against and runs with.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ._version import SUPPORTED_PYSPARK, __version__

_CORE_JAR = re.compile(r"spark-core_[\d.]+-(?P<version>.+)\.jar$")


class SparkHomeError(ImportError):
    """No usable Spark: none found, one not laid out as Spark lays itself out, or one of a
    version this arrowstate does not support (an ImportError: importing arrowstate without
    a usable pyspark fails)."""


def _supported(version: str) -> bool:
    return version.startswith(SUPPORTED_PYSPARK + ".")


def _refuse(found: str) -> SparkHomeError:
    return SparkHomeError(f"arrowstate {__version__} supports Spark {SUPPORTED_PYSPARK}.x "
                          f"only; found {found}")


def make_pyspark_importable() -> None:
    """pyspark importable: nothing to do. Else the Spark distribution under SPARK_HOME (or
    one findspark finds in its usual places) is put on sys.path by `findspark.init`."""
    if importlib.util.find_spec("pyspark") is not None:
        return
    needed = (f"arrowstate needs pyspark {SUPPORTED_PYSPARK}.x: install it "
              f"(pip install 'pyspark>={SUPPORTED_PYSPARK},<{_next_minor()}') or set "
              f"SPARK_HOME to a Spark {SUPPORTED_PYSPARK} distribution")
    try:
        import findspark   # only needed here: a distribution's pyspark is not installed
    except ImportError:
        raise SparkHomeError(f"{needed}; pyspark is not importable and findspark, which "
                             "finds a distribution's, is not installed (pip install findspark)"
                             ) from None
    home = os.environ.get("SPARK_HOME")
    if not home:
        try:
            home = findspark.find()
        except ValueError:
            raise SparkHomeError(f"{needed}; pyspark is not importable and SPARK_HOME is "
                                 "not set") from None
    python = Path(home) / "python"
    if not (python / "pyspark" / "__init__.py").is_file() or not any(
            (python / "lib").glob("py4j-*.zip")):
        raise SparkHomeError(f"{needed}; pyspark is not importable and the Spark home "
                             f"{home} is not laid out as a distribution (it needs "
                             "python/pyspark/__init__.py and python/lib/py4j-*-src.zip)")
    # findspark.init also sets PYSPARK_PYTHON; keep the user's choice (or its absence) so
    # that configure() decides the workers' interpreter as it does with the pip wheel
    pyspark_python = os.environ.get("PYSPARK_PYTHON")
    findspark.init(home)
    if pyspark_python is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = pyspark_python


def _next_minor() -> str:
    major, minor = SUPPORTED_PYSPARK.split(".")
    return f"{major}.{int(minor) + 1}"


@dataclass(frozen=True)
class Spark:
    """The Spark in use: its home, its jars and their version."""
    home: Path
    jars: Path
    version: str

    def key(self) -> str:
        """Tells one Spark's jars from another's: the shim built against these jars is kept
        under this key, so a build is never reused with another Spark."""
        return jars_key(self.jars)


def jars_key(jars: Path) -> str:
    """A digest of the jar names and sizes (names carry the versions; sizes tell rebuilt
    jars of one version apart); two homes holding the same jars share their shim."""
    listing = sorted((e.name, e.stat().st_size) for e in os.scandir(jars)
                     if e.name.endswith(".jar"))
    return hashlib.sha256(repr(listing).encode()).hexdigest()[:12]


def spark_home() -> Path:
    """Where pyspark launches its JVM from: SPARK_HOME if set, else the wheel's own
    directory (pyspark's `_find_spark_home`, which its java_gateway uses)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    from pyspark.find_spark_home import _find_spark_home

    try:
        return Path(_find_spark_home())
    except SystemExit:   # it prints where it looked, then exits
        raise SparkHomeError("arrowstate: pyspark cannot find its Spark home (set "
                             "SPARK_HOME)") from None


def jars_version(jars: Path) -> str:
    """The Spark version of a jars directory, from its spark-core jar's name."""
    found = sorted(p.name for p in jars.glob("spark-core_*.jar"))
    versions = {m["version"] for name in found if (m := _CORE_JAR.search(name))}
    if len(versions) != 1:
        raise SparkHomeError(f"arrowstate: cannot tell the Spark version of {jars}: it "
                             "should hold one spark-core_2.13-<version>.jar, it holds "
                             f"{', '.join(found) or 'none'}")
    return versions.pop()


def check_pyspark() -> None:
    """The pyspark imported must be the supported minor version."""
    import pyspark

    if not _supported(pyspark.__version__):
        raise _refuse(f"pyspark {pyspark.__version__} at {Path(pyspark.__file__).parent}")


def find_spark() -> Spark:
    """The Spark in use, checked (on the driver, where the shim is built and handed to
    Spark): its pyspark and its jars must both be the supported minor version, else
    SparkHomeError names the version found, where, and ours."""
    import pyspark

    check_pyspark()
    home = spark_home()
    jars = home / "jars"
    if not jars.is_dir():   # a Spark source build keeps them here (as Spark's launcher)
        jars = home / "assembly" / "target" / "scala-2.13" / "jars"
    if not jars.is_dir():
        raise SparkHomeError(f"arrowstate: the Spark home {home} has no jars directory "
                             f"({home / 'jars'})")
    version = jars_version(jars)
    if not _supported(version):
        raise _refuse(f"Spark {version} at {home} (its jars in {jars}; pyspark "
                      f"{pyspark.__version__} at {Path(pyspark.__file__).parent})")
    return Spark(home, jars, version)
