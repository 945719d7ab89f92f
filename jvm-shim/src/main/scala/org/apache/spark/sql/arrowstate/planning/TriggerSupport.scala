package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.SparkException
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.exec.TriggerMode
import org.apache.spark.sql.arrowstate.families.{ArrowStateFamily, Runs, StaysSpark}

/**
 * Which trigger modes arrowstate operators run in, from each family's declaration
 * (`ArrowStateFamily.modes`). Every micro-batch trigger (processing time, available-now,
 * once) is micro-batch mode. Real-time mode (Trigger.RealTime) reads its source with
 * RealTimeStreamScanExec in long-running batches and expects each stateful operator to emit
 * a row's result as the row arrives: a family that runs there sends rows to the worker in
 * small flushes (exec.RealTimeRows) and emits each flush's output at once; the others stay
 * Spark's, unwrapped (real-time mode's allowlist refuses any node it does not know), with the
 * reason in EXPLAIN's arrowstate section. (Continuous processing allows no stateful operator.)
 */
object TriggerSupport {
  /** Why `family` cannot run `node` in the node's trigger mode (empty: it can). */
  def unsupportedReasons(node: SparkPlan, family: ArrowStateFamily, conf: SQLConf)
    : Seq[String] = {
    val mode = TriggerMode.of(node)
    family.modes(mode) match {
      case StaysSpark(reason) => Seq(s"${mode.explain}: $reason (${whoRuns(mode)})")
      case Runs(nodes, reasons) =>
        (mode match {
          case TriggerMode.RealTime => RealTimeAllowlist.refusal(nodes, conf)
          case TriggerMode.MicroBatch => None
        }).toSeq ++ reasons(node).map(r => s"${mode.explain}: $r")
    }
  }

  /** Why a stateful Spark node that no family answers for stays Spark's in `mode`. */
  def noFamilyReason(mode: TriggerMode): String = s"${mode.explain}: ${whoRuns(mode)}"

  private def whoRuns(mode: TriggerMode): String = FamilyRegistry.explainedIn(mode) match {
    case Seq() => "arrowstate runs no operator there"
    case nodes => s"arrowstate runs only ${nodes.mkString(", ")} there"
  }

  /**
   * Fails planning when `family` made a node its declaration does not name for `mode`: Spark's
   * real-time allowlist holds the declared nodes only, so what runs and what the allowlist
   * knows cannot drift apart unnoticed. `before` is the Spark node, `after` the replacement.
   */
  def checkDeclaredNodes(family: ArrowStateFamily, mode: TriggerMode, before: SparkPlan,
      after: SparkPlan): Unit = family.modes(mode) match {
    case Runs(nodes, _) =>
      val made = after.collect {
        case p if p.getClass.getName.startsWith(OurPackage) && !before.exists(_ eq p) => p.getClass
      }
      val undeclared = made.filterNot(c => nodes.contains(c)).map(_.getSimpleName).distinct
      if (undeclared.nonEmpty) {
        throw SparkException.internalError(s"arrowstate: family ${family.name} made " +
          s"${undeclared.mkString(", ")} in ${mode.explain}, which its declared modes do not " +
          s"name (${nodes.map(_.getSimpleName).mkString(", ")})")
      }
    case _: StaysSpark =>
      throw SparkException.internalError(s"arrowstate: family ${family.name} replaced a " +
        s"node in ${mode.explain}, where it stays Spark's")
  }

  private val OurPackage = "org.apache.spark.sql.arrowstate."
}
