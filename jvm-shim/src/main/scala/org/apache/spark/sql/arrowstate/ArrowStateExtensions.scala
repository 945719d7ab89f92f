package org.apache.spark.sql.arrowstate

import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, SortOrder}
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.trees.TreeNodeTag
import org.apache.spark.sql.execution.{ColumnarRule, SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.python.streaming.FlatMapGroupsInPandasWithStateExec
import org.apache.spark.sql.execution.streaming.operators.stateful.flatmapgroupswithstate.FlatMapGroupsWithStateExec
import org.apache.spark.sql.execution.streaming.operators.stateful.{SessionWindowStateStoreSaveExec, StatefulOperatorStateInfo, StateStoreSaveExec, StreamingDeduplicateExec, StreamingDeduplicateWithinWatermarkExec}
import org.apache.spark.sql.internal.SQLConf

/** Entry point named in `spark.sql.extensions`. */
class ArrowStateExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    // preColumnarTransitions runs after IncrementalExecution's `state` rule, so the operators
    // we replace already carry their state info, output mode and watermarks.
    extensions.injectColumnar(session => ArrowStateColumnarRule(session))
  }
}

case class ArrowStateColumnarRule(session: SparkSession) extends ColumnarRule {
  override def preColumnarTransitions: Rule[SparkPlan] = ArrowStateOverrides
}

object ArrowStateConf {
  val Enabled = "spark.arrowstate.enabled"
  val DeduplicateEnabled = "spark.arrowstate.deduplicate.enabled"
  val AggregateEnabled = "spark.arrowstate.aggregate.enabled"
  val FlatMapGroupsWithStateEnabled = "spark.arrowstate.flatMapGroupsWithState.enabled"

  def flag(conf: SQLConf, key: String): Boolean =
    conf.getConfString(key, "true").trim.toLowerCase(java.util.Locale.ROOT) == "true"
}

/**
 * One row per operator family: which Spark node it matches, the switch that turns it on,
 * and a builder that returns our replacement or the reason Spark's node stays.
 */
private case class OperatorFamily(
    name: String,
    switch: String,
    replace: PartialFunction[SparkPlan, Either[String, SparkPlan]])

object ArrowStateOverrides extends Rule[SparkPlan] with Logging {

  /** Set on a Spark node we decided to keep, so running the rule twice does not wrap twice. */
  val KeptReason: TreeNodeTag[String] = TreeNodeTag[String]("arrowstate.keptReason")

  private val families: Seq[OperatorFamily] = Seq(
    OperatorFamily("deduplicate", ArrowStateConf.DeduplicateEnabled, {
      case d: StreamingDeduplicateExec =>
        ArrowStreamingDeduplicateExec.build(d.keyExpressions, d.child, d.stateInfo,
          d.eventTimeWatermarkForLateEvents, d.eventTimeWatermarkForEviction,
          withinWatermark = false)
      case d: StreamingDeduplicateWithinWatermarkExec =>
        ArrowStreamingDeduplicateExec.build(d.keyExpressions, d.child, d.stateInfo,
          d.eventTimeWatermarkForLateEvents, d.eventTimeWatermarkForEviction,
          withinWatermark = true)
    }),
    OperatorFamily("aggregate", ArrowStateConf.AggregateEnabled, {
      case s: StateStoreSaveExec => ArrowStateStoreAggregate.build(s)
      case _: SessionWindowStateStoreSaveExec =>
        Left("session windows (session_window) keep Spark's own state store operators")
    }),
    OperatorFamily("flatMapGroupsWithState", ArrowStateConf.FlatMapGroupsWithStateEnabled, {
      case p: FlatMapGroupsInPandasWithStateExec => ArrowFlatMapGroupsWithState.build(p)
      case _: FlatMapGroupsWithStateExec =>
        Left("the state function is a JVM function (Scala/Java flatMapGroupsWithState): " +
          "arrowstate runs Python functions only")
    })
  )

  override def apply(plan: SparkPlan): SparkPlan = {
    val conf = SQLConf.get
    if (!ArrowStateConf.flag(conf, ArrowStateConf.Enabled)) return plan
    plan.transformUp {
      case node if node.getTagValue(KeptReason).isEmpty =>
        families.find(_.replace.isDefinedAt(node)) match {
          case None => node
          case Some(family) =>
            val decision =
              if (!ArrowStateConf.flag(conf, family.switch)) Left(s"${family.switch}=false")
              else family.replace(node)
            decision match {
              case Right(replacement) => replacement
              case Left(reason) => keep(node, reason)
            }
        }
    }
  }

  private def keep(node: SparkPlan, reason: String): SparkPlan = {
    logWarning(s"arrowstate leaves ${node.nodeName} to Spark: $reason")
    node.setTagValue(KeptReason, reason)
    ArrowStateFallbackExec(reason, node)
  }

  /** Reasons a stateful operator cannot run in arrowstate, whatever its family. */
  def commonUnsupportedReason(
      stateInfo: Option[StatefulOperatorStateInfo], conf: SQLConf): Option[String] = {
    if (stateInfo.isEmpty) {
      Some("no state info (not planned by a streaming query)")
    } else if (StatefulOperatorStateInfo.enableStateStoreCheckpointIds(conf)) {
      Some("spark.sql.streaming.stateStore.checkpointFormatVersion >= 2 is not supported")
    } else {
      None
    }
  }
}

/**
 * Marks a stateful Spark operator that arrowstate left in place, so the reason shows in
 * EXPLAIN. It runs its child unchanged; Spark still finds the child as a StateStoreWriter.
 */
case class ArrowStateFallbackExec(reason: String, child: SparkPlan) extends UnaryExecNode {
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering
  override protected def doExecute(): RDD[InternalRow] = child.execute()
  override def nodeName: String = "ArrowStateFallback"
  override def simpleString(maxFields: Int): String = s"$nodeName [reason: $reason]"
  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}
