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
    "MultiStatefulOperatorsSuite": {
        "stream-stream time interval left outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE,
        "stream-stream time interval right outer join -> aggregation, append mode":
            LOOKS_UP_SPARKS_NODE},
}
