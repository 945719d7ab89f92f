"""Differential harness: one streaming query, the same input micro-batches, run with
arrowstate off (Spark's own operators, the oracle) and on; every batch's output rows and
state figures must match.

Input arrives as one Parquet file per micro-batch, read with maxFilesPerTrigger=1 and
processed with processAllAvailable(), so batch ids line up between the two runs (no-data
batches included, which Spark runs when the watermark moves).
"""
from __future__ import annotations

import atexit
import datetime as dt
import fcntl
import hashlib
import itertools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

# JVM options for the JVMs the tests start that run many small jobs or compile much code
# briefly: the JIT's first tier only and the serial collector (on two cores the optimising
# compiler's and G1's threads take CPU from the tests), with room for that tier's code so
# that it is not flushed and compiled again. docs/testing.md says more. The apps whose
# subject is how users start Spark keep the JVM's defaults.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m"
# where the tests tell the apps they start (workers, start-up, UI) where the test jar is
TEST_JAR_ENV = "ARROWSTATE_TEST_JAR"


def quick_local(builder, test_jar: str, java_options: str = ""):
    """A local Spark builder set up as the tests' own sessions are: the test jar on the
    driver's class path (Hadoop loads a filesystem before `spark.jars`), QUICK_JVM, and
    Hadoop's local filesystem without a child process per file written
    (tests/jvm/NoForkLocalFileSystem.scala: without it Hadoop forks `chmod` and `readlink`
    twice per file in pyspark, about half of a small batch's time), and S3A's FileContext
    view over the JVM's cached FileSystem, which no finalizer closes under a read
    (tests/jvm/SharedFileSystemFs.scala). For the tests' session and the apps whose subject
    is not how Spark starts or writes files; `java_options` go on the driver's JVM."""
    testing = "org.apache.spark.sql.arrowstate.testing"
    return (builder.config("spark.driver.extraClassPath", test_jar)
            .config("spark.driver.extraJavaOptions", f"{QUICK_JVM} {java_options}".strip())
            .config("spark.hadoop.fs.file.impl", f"{testing}.NoForkLocalFileSystem")
            .config("spark.hadoop.fs.AbstractFileSystem.file.impl", f"{testing}.NoForkLocalFs")
            .config("spark.hadoop.fs.AbstractFileSystem.s3a.impl", f"{testing}.SharedFileSystemFs"))


STATE_FIGURES = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved",
                 "numRowsDroppedByWatermark")
# the tests' usual input: a user's event at a time, with a value
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=1) -> dict:
    """An EVENTS row: `user`'s event at `second` (UTC) with value `v`."""
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


def scratch_dir(prefix: str) -> str:
    """A new directory for a test app's input and checkpoints, removed when the app exits
    (apps run in processes of their own, outside pytest's tmp_path)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


_run_ids = itertools.count()
# where run_query puts checkpoints: None for the run's directory on the local disk, else a
# function giving a new run's checkpoint URI on another filesystem from the run's name
# (tests/conftest.py sets it from ARROWSTATE_TEST_CHECKPOINTS; the `remote_checkpoints`
# fixture for one test)
checkpoint_root: Callable[[str], str] | None = None
# what a process of its own needs to reach `checkpoint_root`'s store, as `--conf` settings
# (the store's `spark.hadoop.*` settings, its connector's jars); set with it
checkpoint_conf: dict[str, str] = {}


# with a remote checkpoint root: the oracle's checkpoint on the local disk all the same
# (Spark's answers do not depend on where its checkpoint is: one local run serves every
# store; tests/spark/test_remote_checkpoints.py sets it, the whole suite under
# ARROWSTATE_TEST_CHECKPOINTS keeps both runs on the store)
oracle_on_local_disk = False
# with a remote checkpoint root: the query's input there too (a cluster whose executors
# share no disk with the driver)
source_on_checkpoint_store = False


def checkpoint_uri(run_dir: str) -> str:
    """A new run's checkpoint: beside its input on the local disk, or on the filesystem
    `checkpoint_root` puts it on."""
    if checkpoint_root is None:
        return os.path.join(run_dir, "ck")
    return checkpoint_root(os.path.basename(run_dir))


@dataclass
class Run:
    outputs: dict[int, list] = field(default_factory=dict)
    history: list[tuple[int, list]] = field(default_factory=list)   # every call, in order
    figures: dict[int, list[dict]] = field(default_factory=dict)
    custom: dict[int, list[dict]] = field(default_factory=dict)
    durations: dict[int, dict] = field(default_factory=dict)   # progress durationMs
    plans: list[str] = field(default_factory=list)
    checkpoint: str = ""
    run_ids: list[str] = field(default_factory=list)   # each start's, in order


def _sortable(row) -> str:
    return repr(tuple(row))


def _as_text(outputs: dict[int, list]) -> dict[int, list[str]]:
    return {bid: [_sortable(r) for r in rows] for bid, rows in outputs.items()}


def run_query(spark: SparkSession, workdir: str, schema: pa.Schema,
              batches: Sequence[Sequence[dict]], build: Callable[[DataFrame], DataFrame],
              *, arrowstate: bool, output_mode: str = "append",
              restart_after: Sequence[int] = (), custom_metrics: Sequence[str] = (),
              between_batches: Callable[[int, str], None] | None = None,
              on_restart: Callable[[int, str], None] | None = None,
              recover: Callable[[StreamingQueryException], None] | None = None) -> Run:
    """Runs the query over `batches`; restarts it from its checkpoint after the given ones
    (calling `on_restart(i, checkpoint)` while it is stopped; while it returns True the
    query runs once more over the input there is). With `recover`, a query that
    fails is recovered (`recover(failure)`, the failure carrying its `batch_errors`) and
    restarted, as an operator would."""
    run_dir = os.path.join(workdir, f"run{next(_run_ids)}-{'on' if arrowstate else 'off'}")
    source, checkpoint = os.path.join(run_dir, "in"), checkpoint_uri(run_dir)
    os.makedirs(source)
    local_source = source
    if source_on_checkpoint_store and checkpoint_root is not None:
        source = checkpoint_root(os.path.basename(run_dir))[:-len("/ck")] + "/in"
        jvm = spark._jvm
        where = jvm.org.apache.hadoop.fs.Path(source)
        where.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf()).mkdirs(where)
    spark.conf.set("spark.arrowstate.enabled", str(arrowstate).lower())
    result = Run(checkpoint=checkpoint)

    batch_errors: list[Exception] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        try:
            rows = df.collect()
        except Exception as e:
            # what failed the batch, with its JVM cause chain (the foreachBatch callback
            # hands Spark only its text): spark_errors reads it from the query's error
            batch_errors.append(e)
            raise
        result.outputs[batch_id] = sorted((tuple(r) for r in rows), key=_sortable)
        result.history.append((batch_id, result.outputs[batch_id]))

    def start():
        stream = (spark.readStream.schema(from_arrow_schema(schema))
                  .option("maxFilesPerTrigger", 1).parquet(source))
        return (build(stream).writeStream.foreachBatch(collect).outputMode(output_mode)
                .option("checkpointLocation", checkpoint).start())

    def harvest(query) -> None:
        for progress in query.recentProgress:
            if progress["runId"] not in result.run_ids:
                result.run_ids.append(progress["runId"])
            ops = progress["stateOperators"]
            if not ops:
                continue
            bid = progress["batchId"]
            result.durations[bid] = progress["durationMs"]
            result.figures[bid] = [{k: op[k] for k in STATE_FIGURES} for op in ops]
            result.custom[bid] = [{k: op["customMetrics"].get(k) for k in custom_metrics}
                                  for op in ops]
        if query.lastProgress is not None:
            result.plans.append(query._jsq.explainInternal(False))

    query = start()
    try:
        for i, rows in enumerate(batches):
            if between_batches is not None:
                between_batches(i, checkpoint)
            name = f"{i:05d}.parquet"
            write_source_file(pa.Table.from_pylist(list(rows), schema=schema),
                              os.path.join(local_source, name))
            if source != local_source:
                upload(spark, os.path.join(local_source, name), f"{source}/{name}")
            try:
                query.processAllAvailable()
            except StreamingQueryException as failed:
                failed.batch_errors = list(batch_errors)
                if recover is None:
                    raise
                harvest(query)
                recover(failed)
                query = start()
                query.processAllAvailable()
            if i in restart_after:
                harvest(query)
                query.stop()
                # on_restart returning True asks for one more run (to the end of the input
                # there is) and stop before the next call
                while on_restart is not None and on_restart(i, checkpoint):
                    query = start()
                    query.processAllAvailable()
                    harvest(query)
                    query.stop()
                query = start()
        harvest(query)
    finally:
        query.stop()
    return result


def checkpoint_files(spark: SparkSession, pattern: str) -> list[str]:
    """The names of the files a Hadoop glob (`{checkpoint}/state/0/*/*.snapshot`) matches,
    on whichever filesystem the checkpoint is."""
    jvm = spark._jvm
    where = jvm.org.apache.hadoop.fs.Path(pattern)
    found = where.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf()) \
        .globStatus(where)
    return sorted(status.getPath().getName() for status in found or [])


def write_source_file(table: pa.Table, path: str) -> None:
    """Writes a parquet file into a running query's source whole: the file source lists the
    directory on its own schedule, and a file it lists while still empty would count as read
    (Spark ignores names starting with a dot, so the file is written under one and renamed)."""
    partial = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".partial")
    pq.write_table(table, partial)
    os.replace(partial, path)


def upload(spark: SparkSession, local: str, uri: str) -> None:
    """Copies a local file to a Hadoop filesystem URI whole: written beside its directory,
    then renamed into it (a file source never lists it half written)."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    target = jvm.org.apache.hadoop.fs.Path(uri)
    staging = jvm.org.apache.hadoop.fs.Path(target.getParent().getParent(),
                                            "." + target.getName() + ".partial")
    fs = target.getFileSystem(conf)
    fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(local), staging)
    fs.mkdirs(target.getParent())
    if not fs.rename(staging, target):
        raise OSError(f"could not rename {staging} to {target}")


_native_runs: dict[str, Run] = {}
# functions keyed by id() must outlive the test, or a new one could take the id
_keep_alive: list = []
_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/
_CALLBACKS = ("between_batches", "on_restart", "recover")
# where pytest-xdist's processes share the oracle's runs (set by tests/conftest.py): a run
# made by one is read by the other, its checkpoint included (both live until the run ends)
shared_oracle_dir: str | None = None
# settings that differ between two processes' sessions and cannot change a query's run
_PER_PROCESS = {"spark.app.id", "spark.app.startTime", "spark.app.submitTime",
                "spark.driver.port", "spark.app.initial.jar.urls"}


def _fingerprint(obj, depth: int = 0):
    """What a query function (and what it captures) is, by structure: equal fingerprints
    build the same query. Functions by their code and captured values, instances by their
    class and attributes, values by their repr; None where that cannot be told (an object
    whose repr is its address, or too deep), and then the run is not shared."""
    if depth > 6:
        return None
    if callable(obj) and hasattr(obj, "__code__"):
        code = obj.__code__
        parts = [_fingerprint(c.cell_contents, depth + 1) for c in obj.__closure__ or ()]
        parts += [_fingerprint(d, depth + 1) for d in obj.__defaults__ or ()]
        if any(p is None for p in parts):
            return None
        return ("fn", _code(code), tuple(parts))
    if isinstance(obj, (list, tuple)):
        parts = tuple(_fingerprint(v, depth + 1) for v in obj)
        return None if None in parts else (type(obj).__name__, parts)
    if isinstance(obj, dict):
        parts = tuple((repr(k), _fingerprint(v, depth + 1)) for k, v in sorted(
            obj.items(), key=lambda kv: repr(kv[0])))
        return None if any(p is None for _, p in parts) else ("dict", parts)
    text = repr(obj)
    if " at 0x" not in text:
        return (type(obj).__qualname__, text)
    if _TESTS_DIR in (getattr(sys.modules.get(type(obj).__module__), "__file__", "") or ""):
        # an instance of a class the tests define (a processor): its attributes are its state
        attrs = _fingerprint(vars(obj), depth + 1)
        return None if attrs is None else (
            "obj", type(obj).__module__, type(obj).__qualname__, attrs)
    return None


def _code(code) -> tuple:
    """A code object by what it does: its bytecode, names and constants (nested code too)."""
    return (code.co_filename, code.co_firstlineno, code.co_name, code.co_code.hex(),
            code.co_names, tuple(_code(c) if hasattr(c, "co_code") else repr(c)
                                 for c in code.co_consts))


def native_run(spark: SparkSession, workdir, schema: pa.Schema,
               batches: Sequence[Sequence[dict]], build: Callable[[DataFrame], DataFrame],
               **kwargs) -> Run:
    """Spark's own run (the oracle) of a query: run once per test session for the same
    query (function by structure, input, options and session settings), so that tests
    differing only in what befalls the arrowstate run share it, across pytest-xdist's
    processes too. Callers only read the Run and its checkpoint. A run with callbacks
    (they may act on the native run too) is never shared."""
    global checkpoint_root
    if oracle_on_local_disk and checkpoint_root is not None:
        root, checkpoint_root = checkpoint_root, None
        try:
            return native_run(spark, workdir, schema, batches, build, **kwargs)
        finally:
            checkpoint_root = root
    if any(kwargs.get(name) is not None for name in _CALLBACKS):
        return run_query(spark, str(workdir), schema, batches, build, arrowstate=False,
                         **kwargs)
    # arrowstate's own settings cannot change a run with it off: runs of the same query
    # that differ only in them (a memory budget, a local dir) share the oracle's; nor can
    # a remote store's, on the local disk
    hadoop = "spark.hadoop."
    store = {k[len(hadoop):] for k in checkpoint_conf if k.startswith(hadoop)} \
        if checkpoint_root is None else set()
    settings = sorted((k, v) for k, v in spark.conf.getAll.items()
                      if not k.startswith("spark.arrowstate.") and k not in _PER_PROCESS
                      and k not in store)
    shape = _fingerprint(build)
    if shape is None:   # not told apart by structure: shared within this process only
        shape = ("object", id(build))
        _keep_alive.append(build)
    # a remote root names its server and this process: its runs are not shared
    where = checkpoint_root("") if checkpoint_root else "file"
    key = hashlib.sha256(repr((shape, str(schema), batches, sorted(kwargs.items()),
                               settings, where)).encode()).hexdigest()
    if key in _native_runs:
        return _native_runs[key]
    if shared_oracle_dir is None or shape[0] == "object":
        run = run_query(spark, str(workdir), schema, batches, build, arrowstate=False,
                        **kwargs)
    else:
        path = os.path.join(shared_oracle_dir, key + ".pickle")
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # the other process may be running it
            if os.path.exists(path):
                with open(path, "rb") as f:
                    run = pickle.load(f)
            else:
                run = run_query(spark, str(workdir), schema, batches, build,
                                arrowstate=False, **kwargs)
                try:
                    data = pickle.dumps(run)
                except (pickle.PicklingError, TypeError, AttributeError):
                    data = None   # values pickle cannot carry: the other process runs it
                if data is not None:
                    with open(path + ".partial", "wb") as f:
                        f.write(data)
                    os.replace(path + ".partial", path)
    _native_runs[key] = run
    return run


def assert_same(spark: SparkSession, tmp_path, schema: pa.Schema,
                batches: Sequence[Sequence[dict]], build: Callable[[DataFrame], DataFrame],
                *, expect_node: str | None, **kwargs) -> tuple[Run, Run]:
    """Runs off and on and asserts equal outputs and state figures per batch."""
    spark_run = native_run(spark, tmp_path, schema, batches, build, **kwargs)
    ours = run_query(spark, str(tmp_path), schema, batches, build, arrowstate=True, **kwargs)
    assert_runs_same(spark_run, ours, expect_node)
    return spark_run, ours


def assert_runs_same(spark_run: Run, ours: Run, expect_node: str | None) -> None:
    # compared as text so that NaN equals NaN, as it does for Spark
    assert _as_text(ours.outputs) == _as_text(spark_run.outputs)
    assert ([(b, [_sortable(r) for r in rows]) for b, rows in ours.history]
            == [(b, [_sortable(r) for r in rows]) for b, rows in spark_run.history])
    assert ours.figures == spark_run.figures
    assert sorted(ours.outputs) == sorted(ours.figures), "a batch ran without progress"
    if expect_node is not None:
        assert all(expect_node in plan for plan in ours.plans), ours.plans
        assert not any(expect_node in plan for plan in spark_run.plans)


def assert_state_reads_same(spark, native: Run, ours: Run, batches, variables,
                            timers: bool = False, masked=lambda row: row,
                            change_feed: bool = False) -> list:
    """Spark's `statestore` reader gives the same rows for each state variable (flattened
    and not) and timer, at each of the batches, from the arrowstate checkpoint as from the
    native one; with `change_feed`, also each variable's change feed from the first batch
    to the last of them (the native run needs RocksDB's changelog checkpointing);
    `masked` hides what differs between two runs (TTL expiries follow the clock)."""
    reads = [(batch, dict(stateVarName=v, flattenCollectionTypes=flat))
             for v in variables for flat in ("true", "false") for batch in batches]
    if timers:
        reads += [(batch, dict(readRegisteredTimers="true")) for batch in batches]
    if change_feed:
        reads += [(None, dict(stateVarName=v, readChangeFeed="true", changeStartBatchId=0,
                              changeEndBatchId=max(batches))) for v in variables]
    for batch, options in reads:
        got = [read_state(spark, checkpoint, batch, options, masked)
               for checkpoint in (native.checkpoint, ours.checkpoint)]
        assert got[1] == got[0], (options, batch, _multiset_difference(got[0], got[1]))
    return got


def _multiset_difference(expected: list, got: list) -> tuple[list, list]:
    """What only `expected` has and what only `got` has, repeats counted."""
    from collections import Counter
    a, b = Counter(expected), Counter(got)
    return sorted((a - b).elements()), sorted((b - a).elements())


def read_state(spark, checkpoint: str, batch: int, options: dict,
               masked=lambda row: row) -> list[str]:
    """The rows Spark's `statestore` reader gives with `options` at `batch` (None: the
    options say what to read), in one order."""
    reader = spark.read.format("statestore")
    if batch is not None:
        reader = reader.option("batchId", batch)
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted(str(_in_order(masked(r.asDict(True))))
                  for r in reader.load(checkpoint).collect())


def _in_order(value):
    """A map's entries in one order (the stores keep them in different ones)."""
    if isinstance(value, dict):
        items = [(k, _in_order(v)) for k, v in value.items()]
        return dict(items) if all(isinstance(k, str) for k, _ in items) else sorted(items)
    return [_in_order(v) for v in value] if isinstance(value, list) else value


def ttl_masked(row):
    """A state reader's row with each TTL expiry and processing-time timer (the batch's
    clock time plus a duration) checked to be a time of this run and then hidden."""
    def mask(value):
        if isinstance(value, dict):
            clock = {"ttlExpirationMs", "expiration_timestamp_ms"} & set(value)
            for name in clock:
                assert value[name] > 1_700_000_000_000, value
            return {k: "<clock>" if k in clock else mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        return value
    return mask(row)


def store_options(checkpoint: str) -> list[str]:
    """`--conf` options that let a state command in a process of its own reach the store a
    checkpoint is on (none for the local disk)."""
    return [a for k, v in checkpoint_conf.items() for a in ("--conf", f"{k}={v}")] \
        if "://" in checkpoint else []


def state_command(command: str, checkpoint: str, *args: str, cli: bool = False) -> dict:
    """`python -m arrowstate state <command>`'s JSON result: with `cli`, run as users run it,
    in a process of its own (which starts its own Spark, given the store's settings as
    `--conf` for a checkpoint off the local disk); else through the command's Python
    function in this process, which converts in a new session of the tests' Spark. Times
    are in UTC, the tests' session time zone."""
    if cli:
        zone = ["--time-zone", "UTC"] if command in ("import", "repartition") else []
        done = subprocess.run([sys.executable, "-m", "arrowstate", "state", command, *zone,
                               *store_options(checkpoint), checkpoint, *args],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return json.loads(done.stdout)
    from arrowstate.spark_state import state_command as run
    result = run(command, checkpoint, int(args[0]) if args else None, "UTC")
    return json.loads(json.dumps(result))


def spark_errors(error: BaseException) -> dict[str, dict]:
    """Every SparkThrowable in a captured JVM exception's cause chain: its condition ->
    {"sqlState", "parameters"}. Tests assert conditions, not message text."""
    found: dict[str, dict] = {}
    for cause in getattr(error, "batch_errors", []):
        found.update(spark_errors(cause))
    # pyspark's converted exceptions keep the JVM's as _origin, py4j's own as java_exception
    java = getattr(error, "_origin", None) or getattr(error, "java_exception", None)
    while java is not None:
        try:
            condition = java.getCondition()
        except Exception:   # noqa: BLE001 - not a SparkThrowable: py4j has no such method
            condition = None
        if condition:
            found.setdefault(condition, {"sqlState": java.getSqlState(),
                                         "parameters": dict(java.getMessageParameters())})
        java = java.getCause()
    return found
