"""Python state workers' start-up in an application of its own (tests/helpers/startup_app.py): under
`SPARK_TESTING`, over Unix domain sockets, and a worker that cannot start saying why. (Apart
from test_workers.py so that pytest-xdist's loadfile can run the two long applications in its
two processes at once.)"""
import pytest

from test_workers import seen_by_app


@pytest.mark.slow
def test_workers_start_under_spark_testing_and_say_why_they_cannot(test_jar):
    seen = seen_by_app("startup_app.py", test_jar)
    # as Spark's own suites run: pyspark's worker modules load in our marked workers
    assert seen["spark_testing_dedup_same"] and seen["spark_testing_flatmap_same"], seen
    # Python workers over Unix domain sockets: state, functions, init() on the driver
    assert all(seen[f"unix_socket_{name}_same"] for name in ("dedup", "flatmap", "tws")), seen
    # the task's error carries the worker's own reason, not only that it exited
    error = seen["cannot_start_error"] or ""
    assert "the Python state worker could not start" in error, error
    # (forked from a daemon that has imported pandas: the limit is below what it holds)
    assert "spark.executor.pyspark.memory gives each Python worker 64 MB" in error, error
    failed = seen["cannot_start_conditions"]["ARROWSTATE_WORKER_FAILED_TO_START"]
    assert failed["sqlState"] == "39000" and "64 MB of address space, below the" in failed[
        "parameters"]["error"], failed
