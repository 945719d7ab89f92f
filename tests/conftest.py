import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    import arrowstate

    builder = (SparkSession.builder
               # local[N, F]: a failed task is retried, as on a cluster
               .master("local[2,3]")
               .appName("arrowstate-tests")
               .config("spark.sql.shuffle.partitions", "3")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.streaming.noDataProgressEventInterval", "600000")
               .config("spark.sql.session.timeZone", "UTC"))
    session = arrowstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
