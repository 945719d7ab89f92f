"""The SQL tab tells the truth about arrowstate's operators: read from the live UI's REST API,
from a History Server replaying the application's event log, and seen in a headless
Chromium's screenshot of a query's page.

On an arrowstate node each figure shows once: the Python figures under the names and labels
of Spark's Python operators (not also under arrowstate's own), and no metric is left at zero
because it cannot apply (the state store provider's, the Python runner's that arrowstate does
not fill, rows dropped by watermark without a watermark...). The application (tests/helpers/ui_app.py)
runs in a process of its own, with its UI on a free port and an event log in a temporary
directory.
"""
import contextlib
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import pytest

from arrowstate import contract
from harness import TEST_JAR_ENV
import prerequisites
from procinfo import stop

TESTS = os.path.join(os.path.dirname(__file__), "..", "helpers")
WRITERS = {"ArrowStreamingDeduplicate", "ArrowStateStoreSave", "ArrowFlatMapGroupsWithState"}
TWINS = {"ArrowStreamingDeduplicate": "StreamingDeduplicate",
         "ArrowStateStoreSave": "StateStoreSave"}

# arrowstate's figures that Spark's Python operators show under names of their own
SPARK_PYTHON_LABELS = {"time to run Python workers", "data sent to Python workers",
                       "data returned from Python workers"}
OWN_PYTHON_LABELS = {contract.METRICS[m]["description"]
                     for m in ("pythonWorkerTimeMs", "arrowBytesToPython", "arrowBytesFromPython")}
LATE = "number of rows which are dropped by watermark"
REMOVALS = {"number of removed state rows", "time to remove"}

# What may stay at zero over the whole run although it applies, and why. Everything else an
# arrowstate node shows must be non-zero in at least one micro-batch.
MAY_STAY_ZERO = {
    # timings under a millisecond on this run's few rows (Python time is never that short)
    "time to update": "under a millisecond",
    "time to remove": "under a millisecond",
    "time to load state from checkpoint": "under a millisecond",
    # a few rows' delta, written without Hadoop's child processes on the local filesystem
    "time to commit changes": "under a millisecond",
    # events this run does not cause
    contract.METRICS["stateRowsAdopted"]["description"]: "no checkpoint of Spark's operators",
    contract.METRICS["stateSnapshotsSkipped"]["description"]: "no damaged snapshot",
}
# ... and on one node: the deduplication below it drops the late rows first
MAY_STAY_ZERO_ON = {("windowed", "ArrowStateStoreSave"): {LATE}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def total(value: str) -> float:
    """A metric's total as the UI shows it ('3', or 'total (min, med, max ...)\\n23 ms (...)'):
    its leading number."""
    m = re.match(r"\s*([\d.,]+)", value.split("\n")[-1])
    assert m, f"no number in metric value {value!r}"
    return float(m.group(1).replace(",", ""))


def by_query(executions: list, queries: dict) -> dict:
    """{(query name, node name): [(execution id, {label: value})]} for the stateful nodes
    (arrowstate's and their Spark twins) of each micro-batch's executions."""
    ids = {run_id: name for name, run_id in queries.items()}
    nodes = defaultdict(list)
    for e in executions:
        run = re.search(r"runId = (\S+)", e.get("description") or "")
        name = ids.get(run.group(1)) if run else None
        for n in e["nodes"]:
            if name and (n["nodeName"] in WRITERS or n["nodeName"] in TWINS.values()):
                labels = [m["name"] for m in n["metrics"]]
                # (Spark's own nodes show "number of output rows" twice: theirs and the
                # Python runner's rows received)
                assert n["nodeName"] not in WRITERS or len(labels) == len(set(labels)), (
                    f"{name} {n['nodeName']} shows a label twice: {labels}")
                nodes[(name, n["nodeName"])].append(
                    (e["id"], {m["name"]: m["value"] for m in n["metrics"]}))
    return nodes


def check_nodes(nodes: dict, source: str, zeros_shown: bool) -> None:
    """What every arrowstate node must show, and must not; `zeros_shown`: whether the UI shows
    zero-valued metrics (the History Server's replay leaves most of them out)."""
    custom = {m["description"] for m in contract.METRICS.values()}
    writers = {k: v for k, v in nodes.items() if k[1] in WRITERS}
    assert {k[1] for k in writers} == WRITERS, f"{source}: arrowstate nodes seen: {list(nodes)}"
    for (query, node), batches in writers.items():
        where = f"{source}, query {query}, node {node}"
        shown = set().union(*(set(m) for _, m in batches))
        # one name per figure: Spark's for the Python ones, never arrowstate's as well
        assert not shown & OWN_PYTHON_LABELS, f"{where}: {sorted(shown & OWN_PYTHON_LABELS)}"
        for label in SPARK_PYTHON_LABELS:
            assert max((total(m[label]) for _, m in batches if label in m), default=0) > 0, (
                f"{where}: {label!r} never above zero")
        # Spark's labels for Spark's figures: the twin Spark runs shows them the same
        twin = nodes.get((query + "-spark", TWINS.get(node)))
        if twin:
            twin_labels = set().union(*(set(m) for _, m in twin))
            assert shown - custom - SPARK_PYTHON_LABELS <= twin_labels, (
                f"{where}: labels Spark's {TWINS[node]} does not show: "
                f"{sorted(shown - custom - SPARK_PYTHON_LABELS - twin_labels)}")
            # what Spark's node shows and this one leaves out: its state store provider's
            # and its Python runner's metrics, neither of which arrowstate uses
            left_out = twin_labels - shown
            assert not left_out & (custom | SPARK_PYTHON_LABELS), (where, left_out)
        # nothing that cannot apply: it would stay zero in every batch
        if zeros_shown:
            allowed = set(MAY_STAY_ZERO) | MAY_STAY_ZERO_ON.get((query, node), set())
            never = sorted(label for label in shown - allowed
                           if all(total(m[label]) == 0 for _, m in batches if label in m))
            assert never == [], f"{where}: shown but zero in every micro-batch: {never}"
    # without a watermark nothing is late and nothing is evicted: left out, not shown at zero
    for node in ("ArrowStreamingDeduplicate", "ArrowStateStoreSave"):
        shown = set().union(*(set(m) for _, m in writers[("unwatermarked", node)]))
        assert not shown & (REMOVALS | {LATE}), (source, node, shown & (REMOVALS | {LATE}))
        with_watermark = set().union(*(set(m) for _, m in writers[("windowed", node)]))
        if zeros_shown:
            assert REMOVALS | {LATE} <= with_watermark, (source, node, with_watermark)


@pytest.fixture(scope="module")
def app(tmp_path_factory, test_jar):
    """Runs tests/helpers/ui_app.py (its Spark set up as the tests' own: harness.quick_local); reads
    the live UI's SQL data while it is up, then stops it."""
    workdir = str(tmp_path_factory.mktemp("ui-app"))
    log = open(os.path.join(workdir, "app.log"), "w")
    proc = subprocess.Popen([sys.executable, os.path.join(TESTS, "ui_app.py"), workdir],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=dict(os.environ, **{TEST_JAR_ENV: test_jar}))
    try:
        seen, deadline = None, time.monotonic() + 600
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while seen is None and time.monotonic() < deadline and proc.poll() is None:
                if sel.select(timeout=5):
                    line = proc.stdout.readline()
                    if line.startswith("{"):
                        seen = json.loads(line)
        assert seen, "the UI app printed nothing: " + open(log.name).read()[-5000:]
        seen["live"] = get_json(f"{seen['ui']}/api/v1/applications/{seen['appId']}/sql"
                                "?details=true")
        proc.stdin.close()   # the app stops Spark: its event log is complete
        proc.wait(timeout=120)
        yield seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def history(app, tmp_path_factory):
    """A History Server (Spark's, from pyspark's jars) on the app's event log; its address."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    port = free_port()
    conf = tmp_path_factory.mktemp("history") / "history.conf"
    conf.write_text(f"spark.history.fs.logDirectory file://{app['eventLogDir']}\n"
                    f"spark.history.ui.port {port}\n"
                    "spark.history.fs.update.interval 1s\n")
    log = open(str(conf) + ".log", "w")
    proc = subprocess.Popen(
        [os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.history.HistoryServer",
         "--properties-file", str(conf)],
        env={**os.environ, "SPARK_HOME": home}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):   # the server is not listening yet
                apps = get_json(f"{url}/api/v1/applications")
                if any(a["id"] == app["appId"] and a["attempts"][0]["completed"] for a in apps):
                    break
            assert time.monotonic() < deadline and proc.poll() is None, (
                "the History Server did not list the app: " + open(log.name).read()[-5000:])
            time.sleep(1)
        yield url
    finally:
        stop(proc)
        log.close()


def queries(app) -> dict:
    return {name: ops["runId"] for name, ops in app["progress"].items()}


@pytest.mark.slow
def test_the_live_ui_shows_each_figure_once_and_none_that_cannot_apply(app):
    check_nodes(by_query(app["live"], queries(app)), "live UI", zeros_shown=True)


@pytest.mark.slow
def test_the_query_progress_keeps_arrowstate_names_and_drops_the_providers(app):
    for name, ops in app["progress"].items():
        assert ops["customMetrics"], name
        for op in ops["customMetrics"]:
            if name.endswith("-spark"):   # Spark's own: its provider's metrics
                assert op["loadedMapCacheHitCount"] is not None, (name, op)
                assert op["pythonWorkerTimeMs"] is None, (name, op)
            else:
                assert op["loadedMapCacheHitCount"] is None, (name, op)
                assert op["stateOnCurrentVersionSizeBytes"] is None, (name, op)
                assert op["stateDiskBytes"] is None, (name, op)   # no memory budget: no disk
                assert op["pythonWorkerTimeMs"] > 0 and op["stateCacheHits"] is not None, (
                    name, op)


@pytest.mark.slow
def test_the_history_server_replays_the_same_metrics(app, history):
    replayed = get_json(f"{history}/api/v1/applications/{app['appId']}/sql?details=true")
    nodes = by_query(replayed, queries(app))
    check_nodes(nodes, "History Server", zeros_shown=False)
    live = by_query(app["live"], queries(app))
    for key, batches in nodes.items():
        if key[1] not in WRITERS:
            continue
        live_batches = dict(live[key])
        for execution, metrics in batches:
            for label in SPARK_PYTHON_LABELS & set(metrics):
                assert (_tie_free(metrics[label]) == _tie_free(live_batches[execution][label])
                        ), (key, execution, label)


def _tie_free(text):
    """A metric's text without the task Spark names for its max: where tasks tie, the live
    listener and the replay may name different ones of them (seen: task 6 against 7, both
    4.0 B)."""
    return re.sub(r"\(stage [0-9.]+: task [0-9]+\)", "(stage, task)", text)


def chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                "google-chrome"))), None)


@pytest.mark.slow
def test_a_screenshot_of_the_sql_tab_shows_spark_names(app, history, tmp_path):
    from headless import Chromium

    browser = chromium()
    if browser is None:
        prerequisites.missing("a Chromium binary (chromium, chromium-browser or "
                              "google-chrome) on the PATH: .ci/run installs Debian's "
                              "chromium package")

    # the last micro-batch whose aggregation sent rows to Python
    saves = by_query(app["live"], queries(app))[("windowed", "ArrowStateStoreSave")]
    execution = max(e for e, m in saves
                    if total(m.get("data sent to Python workers", "0")) > 0)
    shot = str(tmp_path / "sql-tab.png")
    page = Chromium(browser, width=2400, height=1400)
    try:
        page.open(f"{history}/history/{app['appId']}/SQL/execution/?id={execution}")
        node = ("[...document.querySelectorAll('#plan-viz-graph svg g.node')]"
                ".find(g => g.textContent.trim() === 'ArrowStateStoreSave')")
        page.wait_for(f"{node} !== undefined")
        # a click on the node opens the side panel with its metrics, as a user reads them
        page.evaluate(f"{node}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        panel = "document.getElementById('plan-viz-details-body').textContent"
        page.wait_for(f"{panel}.includes('time to run Python workers')")
        text = page.evaluate(panel)
        page.screenshot(shot)
    finally:
        page.close()
    assert "data sent to Python workers" in text and "number of total state rows" in text, text
    assert not [label for label in OWN_PYTHON_LABELS if label in text], text
    assert "count of cache hit on states cache in provider" not in text, text
    assert os.path.getsize(shot) > 50_000, "the screenshot is (nearly) blank"
    keep = os.environ.get("ARROWSTATE_UI_SCREENSHOT")   # where to keep it, to look at it
    if keep:
        shutil.copy(shot, keep)
