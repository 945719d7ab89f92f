package org.apache.spark.sql.arrowstate

import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.datasources.v2.RealTimeStreamScanExec

/**
 * Which triggers arrowstate operators run under. Every micro-batch trigger (processing
 * time, available-now, once) plans the same operators and runs them per micro-batch.
 * Real-time mode reads its source with RealTimeStreamScanExec and expects each stateful
 * operator to emit a row as soon as it arrives; ours answer a batch of rows at a time, so
 * under it the operator stays Spark's. (Continuous processing allows no stateful operator.)
 */
object TriggerSupport {
  def unsupportedReason(node: SparkPlan): Option[String] =
    if (node.exists(_.isInstanceOf[RealTimeStreamScanExec])) {
      Some("real-time mode (Trigger.RealTime): arrowstate operators answer a batch of rows " +
        "at a time, not each row as it arrives")
    } else None
}
