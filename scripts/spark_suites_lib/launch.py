"""One suite in one mode: its JVM (ScalaTest's Runner, as Spark's build runs it, with
arrowstate's extensions when on), killed with its process group on timeout."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .classpath import pyspark_home
from .config import EXPLAIN_PROVIDER, EXTENSIONS, JAVA_OPTIONS, SCALA_BINARY
from .results import first_line, parse_junit, parse_report, plugin_frames


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
