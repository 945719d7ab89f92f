"""arrowstate on a real multi-process cluster: a standalone master and two workers started
on loopback with the pyspark wheel's bin/spark-class, each worker its own work and local
directories, the driver its own. arrowstate's input and checkpoint are on the local disk (a
disk every host mounts: the hosts here are one machine), and on the object store (and HDFS
with ARROWSTATE_TEST_EVERY_STORE=1), as on a cluster whose hosts share no disk: one
application runs them all (cluster_app.py), against one run of Spark's on the local disk."""
import json
import os
import socket
import subprocess
import sys
import time

import pyspark
import pytest

import storage

SPARK_HOME = os.path.dirname(pyspark.__file__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_NO_DAEMONIZE="1")
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    logs = tmp_path_factory.mktemp("cluster-logs")
    port = free_port()
    procs = []

    def start(name, *args, host="127.0.0.1", local_dirs=None):
        log = open(logs / f"{name}.log", "w")
        own = dict(env, SPARK_LOCAL_IP=host)
        if local_dirs:
            own.update(SPARK_LOCAL_DIRS=local_dirs, TMPDIR=local_dirs)
        procs.append(subprocess.Popen([spark_class, *args], env=own,
                                      stdout=log, stderr=subprocess.STDOUT))

    # the driver's own local directory (the app's process); each worker its own below
    env["SPARK_LOCAL_DIRS"] = str(tmp_path_factory.mktemp("driver-local"))
    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(port), "--webui-port", str(free_port()))
        wait_for_port(port, 60)
        # two hosts on loopback: Spark never speculates a task onto the host already
        # running it
        workers = []
        for i in range(2):
            work_dir = tmp_path_factory.mktemp(f"worker{i}")
            local_dir = tmp_path_factory.mktemp(f"worker{i}-local")
            workers.append(str(local_dir))
            host = f"127.0.0.{i + 1}"
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                  f"spark://127.0.0.1:{port}", "--host", host, "--cores", "1",
                  "--memory", "1g", "--webui-port", str(free_port()),
                  "--work-dir", str(work_dir), host=host,
                  local_dirs=str(local_dir))
        yield f"spark://127.0.0.1:{port}", env, logs, workers
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


PLACES = ["local", *storage.stores_of_costly_tests()]


@pytest.fixture(scope="module")
def cluster_run(standalone_cluster, test_jar, tmp_path_factory, remote_stores):
    """What cluster_app.py saw, arrowstate's run at each place of PLACES whose store can be
    had here (the test of one that cannot says why: remote_stores.get)."""
    master, env, logs, worker_dirs = standalone_cluster
    attempt_logs = tmp_path_factory.mktemp("attempts")
    places = [{"name": "local", "root": None, "settings": {}, "jars": [],
               "speculation": False}]
    if not remote_stores.unavailable:
        for kind in PLACES[1:]:
            store = remote_stores.get(kind)
            places.append({"name": kind, "root": store.uri(f"cluster-{attempt_logs.name}"),
                           "settings": store.spark_settings(),
                           "jars": remote_stores.jars["s3a"], "speculation": True})
    app = os.path.join(os.path.dirname(__file__), "..", "helpers", "cluster_app.py")
    done = subprocess.run([sys.executable, app, master, test_jar, str(attempt_logs),
                           json.dumps(places)], env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(lines[-1]), attempt_logs, worker_dirs


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("place", PLACES)
def test_dedup_on_standalone_cluster_matches_spark(cluster_run, remote_stores, place):
    """On the stores, also two attempts of one task committing the same version under
    checkpoint format v2: speculation, with the first attempt held back 20 s before it
    writes its delta (and writing it all the same, after the commit)."""
    seen, attempt_logs, _ = cluster_run
    store = remote_stores.get(place) if place != "local" else None
    got = seen["places"][place]
    assert got["same_outputs"] and got["same_figures"], got
    assert got["arrow_node_in_plan"], got
    assert got["cache_hits"] > 0, "state must stay loaded in the executors' workers"
    if store is None:
        assert got["checkpoints"] and all("://" not in c for c in got["checkpoints"]), got
        return
    assert got["checkpoints"] and all(c.startswith(store.uri("")) for c in got["checkpoints"])
    assert got["speculation_same_outputs"] and got["speculation_same_figures"], got
    log = attempt_logs / f"{place}.log"
    attempts = {line.split()[0] for line in log.read_text().splitlines()}
    assert {"0", "1"} <= attempts, "the slow first attempt was not speculated"
    # checkpoint format v2: the late attempt's delta lies beside the committed one, under its
    # own id, and no load took it (the answers above)
    assert len(got["speculation_deltas"]) == 2, got["speculation_deltas"]


@pytest.mark.slow
@pytest.mark.cluster
def test_state_workers_run_in_the_executors_of_the_workers(cluster_run):
    seen, _, worker_dirs = cluster_run
    assert seen["executors"] == 2, seen
    # executors keep their files in their own worker's local directory, not the driver's
    dirs = seen["executor_local_dirs"]
    assert dirs and all(any(d.startswith(w) for w in worker_dirs) for d in dirs), (
        dirs, worker_dirs)
    parents = seen["worker_parents"]
    assert parents and all("CoarseGrainedExecutorBackend" in p for p in parents), parents
