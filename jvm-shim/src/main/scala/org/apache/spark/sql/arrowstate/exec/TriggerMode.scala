package org.apache.spark.sql.arrowstate.exec

import org.json4s.JsonAST.{JBool, JObject}

import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.datasources.v2.RealTimeStreamScanExec

/**
 * The trigger mode a stateful node runs under, read from its plan: its one definition. Each
 * family declares the modes it runs in (`families.TriggerModes`); planning keeps a node
 * Spark's in a mode its family does not run; a task of a node that runs takes the mode from
 * its plan (StateTasks): how its rows go to the worker, and what its operator payload says.
 */
sealed abstract class TriggerMode(val name: String, val explain: String) {
  /** What the mode adds to a family's operator payload (contract.json `payloads.operator.*`). */
  def operatorFields: JObject
}

object TriggerMode {
  /** Every micro-batch trigger (processing time, available-now, once): a task's rows are all
   * there when it runs, posted to the worker per batch of rows (PostedRows). */
  case object MicroBatch extends TriggerMode("microBatch", "micro-batch mode") {
    override def operatorFields: JObject = JObject()
  }

  /** Trigger.RealTime: Spark's real-time scan reads the input for the whole of a long-running
   * batch, and each row's result is wanted as it arrives: rows go in flushes as they come
   * (RealTimeRows), and the worker answers each flush whole. */
  case object RealTime extends TriggerMode("realTime", "real-time mode (Trigger.RealTime)") {
    override def operatorFields: JObject = JObject("realTime" -> JBool(true))
  }

  val All: Seq[TriggerMode] = Seq(MicroBatch, RealTime)

  /** The mode of a node: real-time when Spark's real-time scan reads its input. */
  def of(plan: SparkPlan): TriggerMode =
    if (plan.exists(_.isInstanceOf[RealTimeStreamScanExec])) RealTime else MicroBatch
}
