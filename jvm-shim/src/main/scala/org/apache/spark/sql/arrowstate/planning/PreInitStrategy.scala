package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, PythonUDF}
import org.apache.spark.sql.catalyst.plans.logical.{BinaryNode, LogicalPlan, TransformWithStateInPySpark}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkExec
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.families.{TransformWithStateFamily, TransformWithStateInPySparkPlanned}

/*
 * A Python transformWithState whose processor's init() on the driver (Spark's planning of a
 * query run's first batch) runs in an arrowstate worker: TransformWithStateInPySparkPlanned.
 * Spark asks the physical node for it before arrowstate's columnar rule replaces nodes, and
 * a streaming query's own planning strategies come before any injected one, so the logical
 * node is marked at the end of optimization (PreInitMark) and only arrowstate's strategy
 * (PreInitStrategy) plans the mark: as Spark's strategy plans the node, then as our node.
 */

/** Spark's logical transformWithState, marked for PreInitStrategy: its children, output
 * and references are the node's own. */
case class PreInitTransformWithState(node: TransformWithStateInPySpark) extends BinaryNode {
  override def left: LogicalPlan = node.left
  override def right: LogicalPlan = node.right
  override def output: Seq[Attribute] = node.output
  override lazy val references: AttributeSet = node.references
  override def producedAttributes: AttributeSet = node.producedAttributes
  override def nodeName: String = node.nodeName
  override def simpleString(maxFields: Int): String = node.simpleString(maxFields)
  override protected def withNewChildrenInternal(
      newLeft: LogicalPlan, newRight: LogicalPlan): LogicalPlan =
    copy(node = node.withNewChildren(Seq(newLeft, newRight)).asInstanceOf[TransformWithStateInPySpark])
}

/** Marks streaming Python transformWithState nodes while arrowstate and its
 * transformWithState family are on (a processor shipped as a broadcast is left to Spark's
 * runner, which alone reads it). */
case class PreInitMark(session: SparkSession) extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan = {
    // other plans read no setting (ArrowStateOverrides checks them for stateful plans)
    if (!plan.exists { case t: TransformWithStateInPySpark => t.isStreaming; case _ => false }) {
      return plan
    }
    val conf = SQLConf.get
    ArrowStateConf.validate(conf)
    if (!ArrowStateConf.flag(conf, ArrowStateConf.Enabled) ||
        !ArrowStateConf.flag(conf, TransformWithStateFamily.switch)) {
      return plan
    }
    plan.transformUp {
      case t: TransformWithStateInPySpark if t.isStreaming && (t.functionExpr match {
          case udf: PythonUDF => udf.func.broadcastVars.isEmpty
          case _ => false
        }) => PreInitTransformWithState(t)
    }
  }
}

/** Plans the mark as Spark's strategy plans the node it holds, as our node. */
case class PreInitStrategy(session: SparkSession) extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case PreInitTransformWithState(node) =>
      session.sessionState.planner.TransformWithStateInPySparkStrategy(node).map {
        case exec: TransformWithStateInPySparkExec => TransformWithStateInPySparkPlanned(exec)
        case other => other
      }
    case _ => Nil
  }
}
