"""Test layout: tests/unit (no Spark, run first) and tests/spark (a local Spark session with
arrowstate; `slow` and `cluster` marked where they start more than that)."""
import concurrent.futures
import os
import sys

import pytest

# the helpers (harness, processors, apps) import by their module names
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))

import prerequisites  # noqa: E402  (tests/helpers, put on the path above)


def pytest_collection_modifyitems(config, items):
    """Spark-free tests run first; every test under tests/spark is marked `spark`.

    Under pytest-xdist (`--dist loadfile --no-loadscope-reorder`, pyproject.toml) files are
    handed out in this order instead: the files with a `slow` test first (one application of
    their own each, 50-150 s in one file), then the other Spark files, most tests first, the
    Spark-free ones last, so that the two processes end on short files and finish together
    (xdist's own order, most tests first, left the long one-test files for the end)."""
    elsewhere = os.environ.get("ARROWSTATE_TEST_CHECKPOINTS", "local")
    for item in items:
        if f"{os.sep}spark{os.sep}" in str(item.fspath):
            item.add_marker(pytest.mark.spark)
        if elsewhere != "local" and "local_checkpoints" in item.keywords:
            item.add_marker(pytest.mark.skip(
                reason=f"reads checkpoint files on the local disk; checkpoints are on "
                       f"{elsewhere} (ARROWSTATE_TEST_CHECKPOINTS)"))
    items.sort(key=lambda item: ("spark" in item.keywords, "slow" in item.keywords))
    if "PYTEST_XDIST_WORKER" in os.environ:
        files: dict[str, list] = {}
        for item in items:
            files.setdefault(str(item.fspath), []).append(item)

        def rank(tests):
            return (not any("slow" in t.keywords for t in tests),
                    "spark" not in tests[0].keywords, -len(tests))

        items[:] = [t for tests in sorted(files.values(), key=rank) for t in tests]


def pytest_terminal_summary(terminalreporter):
    """The run ends with the tests skipped for a missing prerequisite (tests/helpers/
    prerequisites.py), by what is missing: outside CI they are skipped, and said here apart
    from the skips that are part of a test's design."""
    missing: dict[str, list[str]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = prerequisites.skip_reason(report) or ""
        if reason.startswith(prerequisites.SKIP_PREFIX):
            what = reason[len(prerequisites.SKIP_PREFIX):].strip().splitlines()[0]
            missing.setdefault(what, []).append(report.nodeid)
    if not missing:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"{sum(map(len, missing.values()))} tests did not run: "
                             f"missing prerequisites", yellow=True, bold=True)
    for what, tests in sorted(missing.items()):
        write(f"{len(tests)} skipped: {what}", yellow=True, bold=True)
        for nodeid in sorted(tests)[:3]:
            write(f"    {nodeid}")
        if len(tests) > 3:
            write(f"    ... and {len(tests) - 3} more")
    write("In CI (CI=true, as .ci/run runs) each of these fails instead: .ci/run installs "
          "them (docs/testing.md).")


def _run_shared_dir(tmp_path_factory, name: str):
    """A directory shared by a pytest-xdist run's processes: in their base directories'
    common parent, which lives as long as the run."""
    shared = tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def test_jar(tmp_path_factory):
    """tests/jvm/*.scala (test-only JVM helpers such as the failure-injecting checkpoint
    file manager) and tests/jvm/unit/*.scala (Scala unit tests and their runner, run by
    tests/spark/test_jvm_units.py), compiled in one scalac run against Spark and the shim:
    kept out of the shipped jar."""
    import fcntl
    import tempfile
    from pathlib import Path

    from arrowstate.shim import compile_scala, jar_path, write_jar

    jvm = Path(__file__).parent / "jvm"
    sources = sorted(jvm.glob("*.scala")) + sorted((jvm / "unit").glob("*.scala"))
    if "PYTEST_XDIST_WORKER" not in os.environ:
        out = tmp_path_factory.mktemp("test-jar")
        compile_scala(sources, out, [jar_path()])
        return str(write_jar(out, out / "arrowstate-tests.jar"))
    # under pytest-xdist: compiled once for the run, by the first worker to need it, in the
    # run's own base directory (the workers' common parent); the others wait for it and use
    # the same jar (two scalac runs at once took the two cores for about 35 s)
    shared = _run_shared_dir(tmp_path_factory, "test-jar")
    jar = shared / "arrowstate-tests.jar"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not jar.exists():
            out = Path(tempfile.mkdtemp(prefix="classes-", dir=shared))
            compile_scala(sources, out, [jar_path()])
            write_jar(out, jar)   # whole or not at all (written aside, then renamed)
    return str(jar)


class RemoteStores:
    """The checkpoint stores other than the local disk (tests/helpers/storage.py), each
    started on first use and stopped at the end of the session."""

    KINDS = ("hdfs", "s3")

    def __init__(self):
        import storage

        self._storage = storage
        self._started: dict = {}   # kind -> a Future of the started store or its failure
        self._starter = concurrent.futures.ThreadPoolExecutor(len(self.KINDS))
        self._prefix = storage.unique_name(os.environ.get("PYTEST_XDIST_WORKER", "main"))
        try:
            self.jars = storage.storage_jars()
            self.unavailable = None
        except storage.StorageUnavailable as e:
            self.jars, self.unavailable = {"s3a": [], "minicluster": []}, str(e)

    def start(self, *kinds: str) -> None:
        """Starts the stores in the background (`get` waits for them): they take 5-20 s,
        which can pass while the session starts or other tests run."""
        if self.unavailable:
            return
        for kind in kinds:
            if kind not in self._started:
                store = (self._storage.Hdfs(self.jars["minicluster"]) if kind == "hdfs"
                         else self._storage.ObjectStore())
                self._started[kind] = self._starter.submit(self._start, store)

    def _start(self, store):
        try:
            return store.start()
        except self._storage.StorageUnavailable as e:
            return e

    def get(self, kind: str):
        if self.unavailable:
            prerequisites.missing(f"checkpoints on {kind}: {self.unavailable}")
        self.start(kind)
        store = self._started[kind].result()
        if isinstance(store, Exception):
            pytest.fail(f"the {kind} server for checkpoints did not start: {store}")
        return store

    def root(self, kind: str):
        """A function from a run's name to its checkpoint URI on that store."""
        store = self.get(kind)
        return lambda name: store.uri(f"{self._prefix}/{name}/ck" if name else self._prefix)

    def process_settings(self, kind: str) -> dict:
        """What a Spark of its own needs to reach the store: its settings and, on the
        driver's class path, the connector's jars (harness.checkpoint_conf)."""
        jars = {"spark.driver.extraClassPath": os.pathsep.join(self.jars["s3a"])} \
            if kind == "s3" and self.jars["s3a"] else {}
        return {**self.get(kind).spark_settings(), **jars}

    def stop(self):
        for started in self._started.values():
            if started.exception() is None and not isinstance(started.result(), Exception):
                started.result().stop()
        self._starter.shutdown()


@pytest.fixture(scope="session")
def remote_stores():
    stores = RemoteStores()
    yield stores
    stores.stop()


@pytest.fixture(scope="session")
def spark(test_jar, tmp_path_factory, remote_stores):
    from pyspark.sql import SparkSession

    import arrowstate
    import harness

    if "PYTEST_XDIST_WORKER" in os.environ:
        # the oracle's runs shared by the run's processes, in their common parent directory
        # (test_tws_on_disk.py runs again the queries three other files run natively)
        harness.shared_oracle_dir = str(_run_shared_dir(tmp_path_factory, "oracle-runs"))

    # this JVM runs hundreds of small queries, each new plan's code briefly
    # Hadoop's S3A connector on the class path (the MiniDFSCluster's client is Spark's own);
    # ARROWSTATE_TEST_CHECKPOINTS=hdfs|s3 puts every differential test's checkpoints there
    builder = (harness.quick_local(SparkSession.builder, os.pathsep.join(
        [test_jar, *remote_stores.jars["s3a"]]))
               # local[N, F]: a failed task is retried, as on a cluster
               .master("local[2,3]")
               .appName("arrowstate-tests")
               # two: on two cores each stateful stage runs in one wave of tasks
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.streaming.noDataProgressEventInterval", "600000")
               .config("spark.sql.session.timeZone", "UTC")
               # what test_environment.py expects functions to see
               .config("spark.executorEnv.ARROWSTATE_TEST_ENV", "from-executorEnv"))
    everywhere = os.environ.get("ARROWSTATE_TEST_CHECKPOINTS", "local")
    if everywhere != "local":
        if everywhere not in RemoteStores.KINDS:
            raise pytest.UsageError(f"ARROWSTATE_TEST_CHECKPOINTS={everywhere}: local, hdfs "
                                    f"or s3")
        harness.checkpoint_root = remote_stores.root(everywhere)
        harness.checkpoint_conf = remote_stores.process_settings(everywhere)
        for key, value in remote_stores.get(everywhere).spark_settings().items():
            builder = builder.config(key, value)
    session = arrowstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(params=RemoteStores.KINDS)
def remote_checkpoints(request, spark, remote_stores):
    """This test's checkpoints on HDFS, then on the object store: the store's settings on
    the session (as Hadoop reads them, without `spark.hadoop.`) and the harness's
    checkpoint root, both put back afterwards. Yields the store."""
    import harness

    store = remote_stores.get(request.param)
    for key, value in store.spark_settings().items():
        spark.conf.set(key[len("spark.hadoop."):], value)
    before = harness.checkpoint_root, harness.checkpoint_conf
    harness.checkpoint_root = remote_stores.root(request.param)
    harness.checkpoint_conf = remote_stores.process_settings(request.param)
    yield store
    harness.checkpoint_root, harness.checkpoint_conf = before


@pytest.fixture(autouse=True)
def _session_settings_restored(request):
    """Whatever a Spark test sets on the session is put back afterwards."""
    if "spark" not in request.fixturenames:
        yield
        return
    session = request.getfixturevalue("spark")
    before = dict(session.conf.getAll)
    yield
    after = dict(session.conf.getAll)
    for key in after:
        if key not in before:
            session.conf.unset(key)
        elif after[key] != before[key]:
            session.conf.set(key, before[key])


@pytest.fixture
def spark_conf(spark):
    """`spark_conf(key=value, ...)`: session settings for this test only (restored by
    `_session_settings_restored`)."""
    def set_conf(**settings):
        for key, value in settings.items():
            spark.conf.set(key, str(value))
    return set_conf
