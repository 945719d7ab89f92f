"""The bench's queries: each case's streaming query over the input's (key long, user string,
ts timestamp, value double), its output mode and the arrowstate node it must plan; the
user-function cases' floors (bench_lib/floor.py); --scaling's queries."""
from __future__ import annotations

from bench_lib import functions


def _count_and_sum(df):
    from pyspark.sql import functions as F
    return df.agg(F.count("*").alias("n"), F.sum("value").alias("total"))


def _by_user_name(df):
    """Grouped by a string key made from the long one ("user-<key>")."""
    from pyspark.sql import functions as F
    return df.groupBy(F.concat(F.lit("user-"), F.col("key").cast("string")).alias("user"))


def _windowed(df, size: str):
    from pyspark.sql import functions as F
    return df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", size), "key")


def _sessions(df):
    """The session window case: a count and sum per key and session (gap 30 s), append."""
    from pyspark.sql import functions as F
    return _count_and_sum(df.withWatermark("ts", "10 seconds")
                          .groupBy(F.session_window("ts", "30 seconds"), "key"))


def _counts_with_state(df):
    from pyspark.sql.streaming.state import GroupStateTimeout
    return df.groupBy("key").applyInPandasWithState(
        functions.count_per_key, "key long, count long", "count long", "Update",
        GroupStateTimeout.NoTimeout)


def _tws(processor: type, pandas_api: bool):
    """A transformWithState case: the processor per key, update mode, no time mode."""
    def build(df):
        grouped = df.groupBy("key")
        run = grouped.transformWithStateInPandas if pandas_api else grouped.transformWithState
        return run(processor(), "key long, count long", "Update", "None")
    return build


def _tws_list_timer(df):
    return df.withWatermark("ts", "10 seconds").groupBy("key").transformWithStateInPandas(
        functions.CollectUntilQuiet(), "key long, count long", "Append", "EventTime")


DEDUP, SAVE = "ArrowStreamingDeduplicate", "ArrowStateStoreSave"
SESSION_SAVE = "ArrowSessionWindowStateStoreSave"
FLATMAP, TWS = "ArrowFlatMapGroupsWithState", "ArrowTransformWithState"
# case -> (query, output mode, the arrowstate node it must plan)
CASES = {
    "dedup": (lambda df: df.dropDuplicates(["key"]), "append", DEDUP),
    "dedup_watermark": (lambda df: df.withWatermark("ts", "10 seconds")
                        .dropDuplicates(["user", "ts"]), "append", DEDUP),
    "agg_update": (lambda df: _count_and_sum(df.groupBy("key")), "update", SAVE),
    "agg_append": (lambda df: _count_and_sum(_windowed(df, "10 seconds")), "append", SAVE),
    "agg_complete": (lambda df: _count_and_sum(df.groupBy("key")), "complete", SAVE),
    "session_window_append": (_sessions, "append", SESSION_SAVE),
    "apply_in_pandas_with_state": (_counts_with_state, "update", FLATMAP),
    # transformWithState needs the RocksDB state store natively (set for these cases)
    "tws_pandas_value_count": (_tws(functions.PandasCountPerKey, True), "update", TWS),
    "tws_pandas_map_per_row": (_tws(functions.PandasCountPerBucket, True), "update", TWS),
    "tws_rows_value_count": (_tws(functions.RowCountPerKey, False), "update", TWS),
    "tws_rows_map_per_row": (_tws(functions.RowCountPerBucket, False), "update", TWS),
    "tws_list_timer": (_tws_list_timer, "append", TWS),
}
# the user-function cases' floors (see bench_lib/floor.py): (how keys' rows are handed over,
# the function, whether event time runs)
FLOORS = {
    "apply_in_pandas_with_state": ("apply_in_pandas_with_state", functions.count_per_key,
                                   False),
    "tws_pandas_value_count": ("tws_pandas", functions.PandasCountPerKey, False),
    "tws_pandas_map_per_row": ("tws_pandas", functions.PandasCountPerBucket, False),
    "tws_rows_value_count": ("tws_rows", functions.RowCountPerKey, False),
    "tws_rows_map_per_row": ("tws_rows", functions.RowCountPerBucket, False),
    "tws_list_timer": ("tws_pandas", functions.CollectUntilQuiet, True),
}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# --scaling's queries over a stream of (key long, value double), update mode: the query and
# the arrowstate node it plans
SCALING_CASES = {
    "agg": (lambda df: _count_and_sum(df.groupBy("key")), SAVE),
    "agg_string_keys": (lambda df: _count_and_sum(_by_user_name(df)), SAVE),
    "tws_pandas_value_count": (_tws(functions.PandasCountPerKey, True), TWS),
}
