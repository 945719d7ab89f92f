package org.apache.spark.sql.arrowstate

import org.apache.spark.sql.{ExtendedExplainGenerator, SparkSessionExtensions}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperator

import org.apache.spark.sql.arrowstate.exec.TriggerMode
import org.apache.spark.sql.arrowstate.planning.{ArrowStateColumnarRule, ArrowStateFallbackExec, ArrowStateOverrides, PreInitMark, PreInitStrategy, RealTimeAllowlist}
import org.apache.spark.sql.arrowstate.tools.StateReaderRule

/** Entry point named in `spark.sql.extensions`. */
class ArrowStateExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    // Spark's real-time mode allowlist learns arrowstate's real-time operators
    RealTimeAllowlist.register()
    // preColumnarTransitions runs after IncrementalExecution's `state` rule, so the operators
    // we replace already carry their state info, output mode and watermarks.
    extensions.injectColumnar(session => ArrowStateColumnarRule(session))
    // a Python processor's init() while the driver plans runs in an arrowstate worker: that
    // step comes before the columnar rule, so the node planned must be ours already (see
    // PreInitStrategy)
    extensions.injectPreCBORule(session => PreInitMark(session))
    extensions.injectPlannerStrategy(session => PreInitStrategy(session))
    // Spark's state readers read arrowstate checkpoints through ArrowStateStoreProvider
    extensions.injectPostHocResolutionRule(session => StateReaderRule(session))
  }
}

/**
 * `spark.sql.extendedExplainProviders` entry: lists, under its own title in EXPLAIN, which
 * stateful operators run in arrowstate (and in which trigger mode, where not micro-batch) and
 * why each of the others stays Spark's.
 */
class ArrowStateExplainGenerator extends ExtendedExplainGenerator {
  override def title: String = "arrowstate"

  override def generateExtendedInfo(plan: SparkPlan): String = {
    def operatorOf(p: SparkPlan): String = p match {
      case s: StatefulOperator => s.stateInfo.map(i => s" (operator ${i.operatorId})").getOrElse("")
      case _ => ""
    }
    plan.collect {
      // the fallback wrapper takes its child's tags when it replaces it: the child says it
      case p: SparkPlan if p.getTagValue(ArrowStateOverrides.KeptReasons).isDefined &&
          !p.isInstanceOf[ArrowStateFallbackExec] =>
        s"${p.nodeName}${operatorOf(p)} stays Spark's:" +
          p.getTagValue(ArrowStateOverrides.KeptReasons).get.map(r => s"\n  - $r").mkString
      case p: SparkPlan if p.nodeName.startsWith("Arrow") && p.isInstanceOf[StatefulOperator] =>
        s"${p.nodeName}${operatorOf(p)} runs in arrowstate" + (TriggerMode.of(p) match {
          case TriggerMode.MicroBatch => ""
          case mode => s", in ${mode.explain}"
        })
    }.mkString("\n")
  }
}
