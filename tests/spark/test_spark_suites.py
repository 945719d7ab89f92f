"""Spark's own StreamingDeduplicationSuite (its Scala test jar) with arrowstate on: no test
that passes without arrowstate fails with it, but those scripts/spark_suites.py lists as
expected. Runs `on` only (about 100 s): the script then runs without arrowstate just the tests
that did not pass on (about 10 s more), which tells a regression from a test that fails anyway
(Spark 4.2's test jar on the 4.3 runtime) without a second full run (about 100 s more). Spark's
test jars not cached and not to be downloaded (no `mvn`, no network) are a missing
prerequisite (tests/helpers/prerequisites.py: skipped outside CI, failed in CI)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import prerequisites
from harness import QUICK_JVM

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "spark_suites.py"
SUITE = "org.apache.spark.sql.streaming.StreamingDeduplicationSuite"
NO_TEST_JARS = 3   # the script's exit code when the test jars cannot be had


@pytest.mark.slow
def test_streaming_deduplication_suite_has_no_unexpected_regressions(tmp_path):
    prepare = subprocess.run([sys.executable, str(SCRIPT), "--prepare-only"],
                             capture_output=True, text=True, timeout=1800)
    if prepare.returncode == NO_TEST_JARS:
        prerequisites.missing(f"Spark's test jars (cannot be downloaded): "
                              f"{prepare.stderr.strip()[-600:]}")
    assert prepare.returncode == 0, prepare.stdout + prepare.stderr

    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--suites", SUITE, "--modes", "on", "--out", str(out),
         "--timeout", "1800"],
        # Spark's JVM options, and harness.QUICK_JVM's (the code run is the same)
        env=dict(os.environ, JDK_JAVA_OPTIONS=QUICK_JVM),
        capture_output=True, text=True, timeout=2400)
    assert (out / "report.json").is_file(), run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    entry = report["suites"][SUITE]
    on = entry["modes"]["on"]
    # the suite ran: not a run that reported nothing
    assert not on.get("timed_out") and not on.get("aborted"), run.stdout[-4000:]
    assert on["counts"]["passed"] + on["counts"]["failed"] >= 20, on["counts"]
    unexpected = [r for r in entry["regressions"] if "expected" not in r]
    assert not unexpected, "pass without arrowstate, fail with it:\n" + "\n".join(
        f"- {r['test']}: {r['first_line']}" + "".join(
            f"\n    {f}" for f in r.get("plugin_frames", [])[:3]) for r in unexpected)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
