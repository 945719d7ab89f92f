"""Where one bench case's time goes, for a developer: CPU by thread of the JVM, CPU of the
state workers, and optionally JFR's executor samples grouped by operator and py-spy's
worker profile. Runs the case (bench.py's CASES) in one local[2] session like bench.py,
runs each mode asked for --warmup times to warm up, then measures --runs more runs of each.

    python scripts/profile_case.py agg_append                     # arrowstate on and off
    python scripts/profile_case.py dedup_watermark --modes on --jfr /tmp/dw.jfr
    python scripts/profile_case.py tws_rows_value_count --modes on --py-spy /tmp/rows

CPU comes from /proc (threads named as the JVM names them: "Executor task launch worker",
"C2 CompilerThread0", ...; threads that end during a run are not counted). With --jfr, the
executor threads' samples are grouped by the innermost arrowstate or Spark operator frame
in their full stacks (`jfr print` shows 5 frames unless told more, which hides the
operator). With --py-spy (installed separately: `pip install py-spy`), the workers'
stacks at 100 Hz go to PREFIX.<pid>.txt (py-spy's raw format).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "helpers"))
from procinfo import own_state_worker_pids, parent_pid  # noqa: E402
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            raw = f.read()
    except OSError:
        return None
    return [raw[raw.index("(") + 1:raw.rindex(")")]] + raw.rsplit(")", 1)[1].split()


def thread_cpu(pid: int) -> collections.Counter:
    """CPU seconds of each of a process's live threads, by name (digits folded)."""
    out: collections.Counter = collections.Counter()
    for path in glob.glob(f"/proc/{pid}/task/*/stat"):
        fields = _stat(path)
        if fields:
            out[re.sub(r"[0-9]+", "#", fields[0])] += (int(fields[12]) + int(fields[13])) / TICKS
    return out


def workers_cpu() -> dict[int, float]:
    """CPU seconds of each of this process's Spark's state workers alive now (workers
    persist between runs, but a user function's stop once its run's state left). Not the
    JVM's other children (Hadoop's local filesystem forks `chmod` and `readlink` per file
    natively) nor py-spy."""
    cpu = {}
    for pid in own_state_worker_pids():
        fields = _stat(f"/proc/{pid}/stat")
        if fields:
            cpu[pid] = (int(fields[12]) + int(fields[13])) / TICKS
    return cpu


def jfr_by_operator(path: str) -> list[tuple[str, int]]:
    """Executor threads' samples by the innermost operator-level frame of each stack."""
    text = subprocess.run(["jfr", "print", "--json", "--stack-depth", "256", "--events",
                           "jdk.ExecutionSample", path], capture_output=True, text=True,
                          check=True).stdout
    pattern = re.compile(r"sql/arrowstate/|ShuffleWriter|ShuffleReader|parquet|hashAgg|"
                         r"HashAggregate|UnsafeExternalRowSorter|ColumnarToRow")
    counts: collections.Counter = collections.Counter()
    for event in json.loads(text)["recording"]["events"]:
        stack = event["values"]["stackTrace"]
        thread = event["values"]["sampledThread"]["javaName"] or ""
        if not stack or "Executor task" not in thread:
            continue
        tag = "other (Spark's generated code and the rest)"
        for frame in stack["frames"]:
            name = frame["method"]["type"]["name"] + "." + frame["method"]["name"]
            if pattern.search(name):
                tag = re.sub(r"\$.*", "", name.split("/")[-1])
                break
        counts[tag] += 1
    return counts.most_common()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--modes", default="on,off", help="on, off (comma-separated)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=6,
                        help="unmeasured rounds of the modes first (see bench.py's)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4,
                        help="shuffle partitions (200: many small tasks, as --small-batches)")
    parser.add_argument("--jfr", help="record the measured runs of the first mode here")
    parser.add_argument("--py-spy", dest="py_spy", help="prefix of py-spy's output files")
    args = parser.parse_args()

    import bench
    from pyspark.sql import SparkSession

    import arrowstate
    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-profile")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "8g")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
    source = tempfile.mkdtemp(prefix="profile-src-")
    bench.write_batches(source, args.rows, args.batches, args.keys)
    case = bench.CASES[args.case]
    modes = args.modes.split(",")
    for _ in range(args.warmup):   # the JIT compiles Spark's code over a dozen runs
        for mode in modes:
            bench.run_once(spark, source, case, mode == "on")
    for i, mode in enumerate(modes):
        on = mode == "on"
        recording = args.jfr if args.jfr and i == 0 else None
        if recording:
            subprocess.run(["jcmd", str(jvm), "JFR.start", "name=profile",
                            "settings=profile"], check=True, capture_output=True)
        spies = []
        if args.py_spy and on and i == 0:
            spies = [subprocess.Popen(["py-spy", "record", "-p", str(w), "--subprocesses",
                                       "-r", "100", "-f", "raw", "-o",
                                       f"{args.py_spy}.{w}.txt"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for w in _children(jvm)]
        before_threads, before_workers = thread_cpu(jvm), workers_cpu()
        walls = [bench.run_once(spark, source, case, on)[0] for _ in range(args.runs)]
        threads = thread_cpu(jvm)
        threads.subtract(before_threads)
        after_workers = workers_cpu()
        # a worker that ended during the runs took its CPU with it: none is printed then
        ended = set(before_workers) - set(after_workers)
        workers = sum(t - before_workers.get(pid, 0.0) for pid, t in after_workers.items())
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        print(json.dumps({
            "case": args.case, "arrowstate": on, "runs": args.runs,
            "wall_s_median": round(statistics.median(walls), 3),
            "worker_cpu_s_per_run": None if ended else round(workers / args.runs, 2),
            "workers_ended_during_runs": len(ended),
            "jvm_thread_cpu_s_per_run": {k: round(v / args.runs, 2)
                                         for k, v in threads.most_common(8) if v > 0}}),
              flush=True)
        if recording:
            subprocess.run(["jcmd", str(jvm), "JFR.stop", "name=profile",
                            f"filename={recording}"], check=True, capture_output=True)
            print(json.dumps({"jfr_executor_samples_by_operator":
                              jfr_by_operator(recording)[:20]}), flush=True)


def _children(jvm: int) -> list[int]:
    """The JVM's own children among its state workers and their daemons."""
    return sorted({w if parent_pid(w) == jvm else parent_pid(w)
                   for w in own_state_worker_pids()})


if __name__ == "__main__":
    main()
