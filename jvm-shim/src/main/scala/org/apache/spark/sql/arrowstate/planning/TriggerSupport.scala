package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.datasources.v2.RealTimeStreamScanExec

/**
 * Which triggers arrowstate operators run under. Every micro-batch trigger (processing
 * time, available-now, once) plans the same operators and runs them per micro-batch.
 * Real-time mode reads its source with RealTimeStreamScanExec and expects each stateful
 * operator to emit a row as soon as it arrives; ours answer a batch of rows at a time, so
 * under it the operator stays Spark's, unwrapped: real-time mode's allowlist refuses any
 * node it does not know. (Continuous processing allows no stateful operator.)
 */
object TriggerSupport {
  /** Spark's own rule for real-time mode (MarkPipelinedShuffleForRealTimeMode) tells it so. */
  def isRealTime(node: SparkPlan): Boolean = node.exists(_.isInstanceOf[RealTimeStreamScanExec])

  def unsupportedReason(node: SparkPlan): Option[String] =
    if (isRealTime(node)) {
      Some("real-time mode (Trigger.RealTime): arrowstate operators answer a batch of rows " +
        "at a time, not each row as it arrives")
    } else None
}
