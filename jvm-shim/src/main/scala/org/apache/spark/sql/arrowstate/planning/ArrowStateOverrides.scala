package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{ExtendedExplainGenerator, SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, SortOrder}
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.catalyst.trees.TreeNodeTag
import org.apache.spark.sql.execution.{ColumnarRule, SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.StatefulStreamlineAggregateExec
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperator, StatefulOperatorStateInfo, StreamingGlobalLimitExec}
import org.apache.spark.sql.execution.streaming.operators.stateful.flatmapgroupswithstate.FlatMapGroupsWithStateExec
import org.apache.spark.sql.execution.streaming.operators.stateful.join.StreamingSymmetricHashJoinExec
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.TransformWithStateExec
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.exec.TriggerMode
import org.apache.spark.sql.arrowstate.families.ArrowStateFamily
import org.apache.spark.sql.arrowstate.tools.StateEngineCheck

case class ArrowStateColumnarRule(session: SparkSession) extends ColumnarRule {
  override def preColumnarTransitions: Rule[SparkPlan] = ArrowStateOverrides
}

/** Stateful Spark nodes no family runs: they stay Spark's, with this reason. */
private case class SparkOnly(matches: SparkPlan => Boolean, reason: String)

object ArrowStateOverrides extends Rule[SparkPlan] with Logging {

  /** Set on a Spark node we decided to keep, so running the rule twice does not wrap twice. */
  val KeptReasons: TreeNodeTag[Seq[String]] = TreeNodeTag[Seq[String]]("arrowstate.keptReasons")

  private val sparkOnly: Seq[SparkOnly] = Seq(
    SparkOnly(_.isInstanceOf[FlatMapGroupsWithStateExec],
      "the state function is a JVM function (Scala/Java flatMapGroupsWithState): " +
        "arrowstate runs Python functions only"),
    SparkOnly(_.isInstanceOf[TransformWithStateExec],
      "the stateful processor is a JVM one (Scala/Java transformWithState): " +
        "arrowstate runs Python functions only"),
    SparkOnly(_.isInstanceOf[StreamingSymmetricHashJoinExec],
      "stream-stream joins keep Spark's own state store operators"),
    SparkOnly(_.isInstanceOf[StreamingGlobalLimitExec],
      "a streaming limit keeps Spark's own state store operator"),
    // real-time mode plans an aggregation as this one node, which emits per input row
    SparkOnly(_.isInstanceOf[StatefulStreamlineAggregateExec],
      TriggerSupport.noFamilyReason(TriggerMode.RealTime)))

  override def apply(plan: SparkPlan): SparkPlan = {
    // a plan without a stateful operator is none of arrowstate's: it reads no setting
    if (!plan.exists(isStateful)) return plan
    val conf = SQLConf.get
    // every setting checked before any is read: one its type does not take fails the query
    // here, before anything is switched off or converted
    ArrowStateConf.validate(conf)
    if (!ArrowStateConf.flag(conf, ArrowStateConf.Enabled)) {
      plan.foreach(StateEngineCheck(_, Seq(s"${ArrowStateConf.Enabled}=false")))
      return plan
    }
    plan.transformUp {
      case node if node.getTagValue(KeptReasons).isEmpty =>
        decide(node, conf) match {
          case None =>
            FamilyRegistry.families.iterator.flatMap(_.absorb(node)).nextOption().getOrElse(node)
          case Some(Right(replacement)) => replacement
          case Some(Left(reasons)) => keep(node, reasons, conf)
        }
    }
  }

  private def isStateful(node: SparkPlan): Boolean = node.isInstanceOf[StatefulOperator] ||
    FamilyRegistry.families.exists(_.matches(node)) || sparkOnly.exists(_.matches(node))

  /** None: not a node we run. Right: our plan. Left: every reason it stays Spark's. */
  private def decide(node: SparkPlan, conf: SQLConf): Option[Either[Seq[String], SparkPlan]] =
    FamilyRegistry.families.find(_.matches(node)).map { family =>
      val reasons =
        (if (ArrowStateConf.flag(conf, family.switch)) Nil else Seq(s"${family.switch}=false")) ++
          commonUnsupportedReasons(node, family, conf) ++ family.unsupportedReasons(node)
      if (reasons.nonEmpty) Left(reasons)
      else {
        val replacement = family.replace(node)
        TriggerSupport.checkDeclaredNodes(family, TriggerMode.of(node), node, replacement)
        Right(replacement)
      }
    }.orElse(sparkOnly.find(_.matches(node)).map(s => Left(Seq(s.reason))))

  /** Reasons a stateful operator cannot run in arrowstate beside its family's own: no state
   * info, or a trigger mode the family does not run in (TriggerSupport). */
  private def commonUnsupportedReasons(
      node: SparkPlan, family: ArrowStateFamily, conf: SQLConf): Seq[String] = {
    val stateInfo = node match {
      case s: StatefulOperator => s.stateInfo
      case _ => None
    }
    (if (stateInfo.isEmpty) Seq("no state info (not planned by a streaming query)") else Nil) ++
      TriggerSupport.unsupportedReasons(node, family, conf)
  }

  private def keep(node: SparkPlan, reasons: Seq[String], conf: SQLConf): SparkPlan = {
    // before StateEngineCheck: strict mode fails without converting the operator's state
    if (ArrowStateConf.flag(conf, ArrowStateConf.FallbackStrict)) {
      throw new ArrowStateFallbackException(node.nodeName, reasons)
    }
    StateEngineCheck(node, reasons)
    FallbackLog.once(node, reasons) {
      logWarning(s"arrowstate leaves ${node.nodeName} to Spark: ${reasons.mkString("; ")}")
    }
    node.setTagValue(KeptReasons, reasons)
    // Real-time mode refuses nodes it does not know: there the tag alone carries the reasons.
    if (TriggerMode.of(node) == TriggerMode.RealTime) node
    else ArrowStateFallbackExec(reasons, node)
  }
}

/** Raised under `spark.arrowstate.fallback.strict=true` instead of falling back. */
class ArrowStateFallbackException(nodeName: String, reasons: Seq[String])
  extends ArrowStateException(ArrowStateFallbackException.Condition,
    Map("operator" -> nodeName, "reasons" -> reasons.mkString("; ")),
    s"arrowstate cannot run $nodeName and ${ArrowStateConf.FallbackStrict} is true: " +
      reasons.mkString("; "))

object ArrowStateFallbackException {
  val Condition = "ARROWSTATE_FALLBACK_STRICT"
}

/** Logs a fallback once per query run and operator, not once per micro-batch. */
private object FallbackLog {
  private val MaxRemembered = 4096
  private val logged = new java.util.LinkedHashMap[(String, Long, Seq[String]), Unit]() {
    override def removeEldestEntry(
        e: java.util.Map.Entry[(String, Long, Seq[String]), Unit]): Boolean =
      size() > MaxRemembered
  }

  def once(node: SparkPlan, reasons: Seq[String])(log: => Unit): Unit = {
    val (run, operatorId) = node match {
      case s: StatefulOperator => s.stateInfo.map(i => (i.queryRunId.toString, i.operatorId))
        .getOrElse(("", -1L))
      case _ => ("", -1L)
    }
    // (put's previous value is a Unit to Scala, never compared with null: ask first)
    val key = (run, operatorId, reasons)
    val first = logged.synchronized {
      !logged.containsKey(key) && { logged.put(key, ()); true }
    }
    if (first) log
  }
}

/**
 * Marks a stateful Spark operator that arrowstate left in place, so the reasons show in
 * EXPLAIN. It runs its child unchanged; Spark still finds the child as a StateStoreWriter.
 */
case class ArrowStateFallbackExec(reasons: Seq[String], child: SparkPlan) extends UnaryExecNode {
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering
  override protected def doExecute(): RDD[InternalRow] = child.execute()
  override def nodeName: String = "ArrowStateFallback"
  override def simpleString(maxFields: Int): String =
    s"$nodeName [reason: ${reasons.mkString("; ")}]"
  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}
