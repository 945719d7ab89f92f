package org.apache.spark.sql.arrowstate.families

import org.apache.spark.sql.execution.SparkPlan

import org.apache.spark.sql.arrowstate.exec.TriggerMode

/**
 * A family's trigger modes, declared once as data: in micro-batch mode and in real-time mode,
 * whether it runs, as which nodes, and if not why. Planning derives the rest from it: which
 * Spark nodes stay Spark's in a mode and EXPLAIN's reason (planning.TriggerSupport), Spark's
 * real-time allowlist (planning.RealTimeAllowlist); a node that runs reads its mode from its
 * plan (exec.TriggerMode), for its payload and how its rows are posted.
 */
final case class TriggerModes(microBatch: ModeSupport, realTime: ModeSupport) {
  def apply(mode: TriggerMode): ModeSupport = mode match {
    case TriggerMode.MicroBatch => microBatch
    case TriggerMode.RealTime => realTime
  }
}

/** Whether a family runs in one trigger mode. */
sealed trait ModeSupport

/**
 * The family runs in the mode, as these arrowstate nodes (every class its swap makes there:
 * Spark's real-time allowlist must know each), but for a node `reasons` gives reasons against
 * (shown in EXPLAIN after the mode's name).
 */
final case class Runs(nodes: Seq[Class[_ <: SparkPlan]], reasons: SparkPlan => Seq[String])
  extends ModeSupport {
  require(nodes.nonEmpty, "a family that runs makes at least one node")

  /** The same, with these reasons against some nodes. */
  def unless(reasons: SparkPlan => Seq[String]): Runs = copy(reasons = reasons)
}

object Runs {
  def apply(nodes: Class[_ <: SparkPlan]*): Runs = Runs(nodes, (_: SparkPlan) => Nil)
}

/** The family does not run in the mode: each of its nodes stays Spark's, for this reason
 * (shown in EXPLAIN after the mode's name). */
final case class StaysSpark(reason: String) extends ModeSupport
