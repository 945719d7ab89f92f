package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.sql.execution.SparkPlan

import org.apache.spark.sql.arrowstate.exec.RealTimeRows
import org.apache.spark.sql.arrowstate.families.ArrowStateFamily

/**
 * Which triggers arrowstate operators run under. Every micro-batch trigger (processing
 * time, available-now, once) plans the same operators and runs them per micro-batch.
 *
 * Real-time mode (Trigger.RealTime) reads its source with RealTimeStreamScanExec in
 * long-running batches and expects each stateful operator to emit a row's result as the row
 * arrives. The families whose `realTime` is set run there: their node sends rows to the
 * worker in small flushes as they come (RealTimeRows) and emits each flush's output at once.
 * The others stay Spark's, unwrapped (real-time mode's allowlist refuses any node it does not
 * know), with the reason in EXPLAIN's arrowstate section. (Continuous processing allows no
 * stateful operator.)
 */
object TriggerSupport {
  /** Why `family` cannot run `node` under the query's trigger (None: it can). */
  def unsupportedReason(node: SparkPlan, family: ArrowStateFamily): Option[String] =
    if (!RealTimeRows.planned(node)) None
    else if (!family.realTime) Some(SparkOnlyReason)
    else family.realTimeReason(node)

  val SparkOnlyReason: String =
    "real-time mode (Trigger.RealTime): arrowstate runs deduplication and Python state " +
      "functions there (applyInPandasWithState, transformWithState); this operator answers " +
      "per micro-batch"
}
