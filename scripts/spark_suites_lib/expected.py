"""Tests known not to pass under arrowstate, with the reason (data only).

{suite's simple name: {test name: reason}}. Such a test failing with arrowstate on (and
passing off) does not make the exit code non-zero; it is still listed, marked expected. A
suite that aborts or times out on with no off run to compare is the entry "(the rest of the
suite)". `--summarize` judges an earlier report.json with this list as it is now.
"""
from __future__ import annotations

LOOKS_UP_SPARKS_NODE = ("looks up Spark's StateStoreSaveExec in the executed plan, where "
                        "arrowstate's ArrowStateStoreSave runs in its place")
OPENS_SPARKS_FILES = ("opens the checkpoint's state with Spark's HDFS-backed provider itself "
                      "(StateStore.getReadOnly), which reads Spark's own files only; Spark's "
                      "statestore reader reads arrowstate's")
LOOKS_UP_SPARKS_PAIR = ("collects Spark's restore and save nodes from the executed plan to "
                        "check the distribution they require, and finds none: arrowstate's "
                        "run in their place (requiring the distribution Spark's would, from "
                        "StatefulOperatorPartitioning)")
EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "StreamingDeduplicationSuite": {
        "Partition key extraction - Dedupe": OPENS_SPARKS_FILES},
    "StreamingDeduplicationWithinWatermarkSuite": {
        "Partition key extraction - DedupeWithinWatermark": OPENS_SPARKS_FILES},
    "StreamingAggregationSuite": {
        "state metrics - append mode - state format version 2": LOOKS_UP_SPARKS_NODE,
        "state metrics - update/complete mode - state format version 2": LOOKS_UP_SPARKS_NODE,
        "SPARK-21977: coalesce(1) with 0 partition RDD should be repartitioned to 1 - state "
        "format version 2": LOOKS_UP_SPARKS_NODE,
        "SPARK-21977: coalesce(1) with aggregation should still be repartitioned when it has "
        "non-empty grouping keys - state format version 2": LOOKS_UP_SPARKS_NODE,
        "changing schema of state when restarting query - schema check off - state format "
        "version 2": "expects the failure's cause to be exactly of class SparkException; Spark "
        "exposes a task's error that carries a condition as that cause, and arrowstate's is "
        "ArrowStatePythonException, a SparkException subclass (its answer, a failure, is "
        "Spark's)"},
    "StreamingAggregationDistributionSuite": {
        "SPARK-38204: streaming aggregation should require StatefulOpClusteredDistribution "
        "from children": LOOKS_UP_SPARKS_PAIR,
        "SPARK-38204: streaming aggregation should require ClusteredDistribution from children "
        "if the query starts from checkpoint in prior to 3.3": LOOKS_UP_SPARKS_PAIR},
    "StreamingSessionWindowDistributionSuite": {
        "SPARK-38204: session window aggregation should require StatefulOpClusteredDistribution "
        "from children": LOOKS_UP_SPARKS_PAIR,
        "SPARK-38204: session window aggregation should require ClusteredDistribution from "
        "children if the query starts from checkpoint in 3.2": LOOKS_UP_SPARKS_PAIR},
    "MultiStatefulOperatorsSuite": {
        "stream-stream time interval left outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE,
        "stream-stream time interval right outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE},
}
# the RocksDB variant runs StreamingAggregationSuite's tests on two RocksDB store settings,
# named with the setting: the same tests, failing for the same reasons
EXPECTED_FAILURES["RocksDBStateStoreStreamingAggregationSuite"] = {
    f"{name} ({store})": reason
    for name, reason in EXPECTED_FAILURES["StreamingAggregationSuite"].items()
    for store in ("RocksDBStateStore", "RocksDBStateStore with changelog checkpointing")}
