"""Comparing off with on test by test (with EXPECTED_FAILURES), printing a suite's and the
run's summary, the exit code, and `--summarize` of an earlier report.json."""
from __future__ import annotations

import json
from pathlib import Path

from .config import EXIT_ERROR, EXIT_REGRESSION
from .expected import EXPECTED_FAILURES
from .results import _trace_message, first_line, plugin_frames, where


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
