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

The parts live in scripts/spark_suites_lib/: EXPECTED_FAILURES (with each test's reason) in
expected.py, versions, suite groups and JVM options in config.py, the test jars in
classpath.py, a suite's JVM in launch.py, reading its reports in results.py, off against on
in compare.py.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_suites_lib.classpath import (prepare, pyspark_home, resolve_suites,  # noqa: E402
                                        runtime_jars)
from spark_suites_lib.compare import evaluate, finish, print_mode, print_regressions  # noqa: E402
from spark_suites_lib.compare import summarize  # noqa: E402
from spark_suites_lib.config import (EXIT_ERROR, EXIT_NO_JARS, SPARK_TEST_VERSION,  # noqa: E402
                                     SUITE_GROUPS, NoTestJars, ScriptError)
from spark_suites_lib.expected import EXPECTED_FAILURES  # noqa: E402
from spark_suites_lib.launch import run_suite  # noqa: E402


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


if __name__ == "__main__":
    sys.exit(main())
