"""Isolation on a shared Spark Connect server: two client sessions run applyInPandasWithState
on one server with arrowstate; each function's process holds its own query's state only.
A query leaving arrowstate there has its state converted by the server's driver."""
import json
import os
import subprocess
import sys

import pyspark
import pytest

from arrowstate import EXTENSION_CLASS
from arrowstate.shim import jar_path
import prerequisites
from procinfo import stop
from test_cluster import free_port, wait_for_port

SPARK_HOME = os.path.dirname(pyspark.__file__)
prerequisites.module("grpc", "the Spark Connect client: pyspark[connect]'s, in the `test` "
                     "extra")


@pytest.mark.slow
def test_two_connect_sessions_never_see_each_others_state(tmp_path):
    port = free_port()
    log = open(tmp_path / "connect-server.log", "w")
    server = subprocess.Popen(
        [os.path.join(SPARK_HOME, "bin", "spark-submit"),
         "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
         "--master", "local[2]", "--jars", jar_path(),
         "--conf", f"spark.sql.extensions={EXTENSION_CLASS}",
         "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
         "--conf", f"spark.connect.grpc.binding.port={port}",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
         "spark-internal"],
        env=dict(os.environ, SPARK_HOME=SPARK_HOME, PYSPARK_PYTHON=sys.executable,
                 SPARK_LOCAL_IP="127.0.0.1"),
        stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, 120)
        client = os.path.join(os.path.dirname(__file__), "..", "helpers", "connect_client.py")
        done = subprocess.run([sys.executable, client, f"sc://127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0 and lines, (done.stdout[-3000:] + done.stderr[-5000:]
                                                + (tmp_path / "connect-server.log").read_text()[-5000:])
        seen = json.loads(lines[-1])
        for name in ("alice", "bob"):
            rows = seen[name]
            # the function saw its own query's state, so it ran next to it in arrowstate ...
            assert rows and any(own > 0 for _, own, _ in rows), seen
            # ... and never another session's
            assert all(foreign == 0 for _, _, foreign in rows), seen
        # restarted without arrowstate, the query goes on from the state arrowstate kept
        assert seen["left"] == [["a", "b"], ["a", "b", "c"]], seen
        assert "arrowstate-exported-1" in seen["checkpoint"], seen
        # ... converted with the server's own SparkContext, through the gateway it opened
        converted = [line for line in (tmp_path / "connect-server.log").read_text().splitlines()
                     if "its state was converted" in line]
        assert converted and '"session": "driver"' in converted[0], converted
    finally:
        stop(server)
