package org.apache.spark.sql.arrowstate.families

import java.util.Base64

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Ascending, Attribute, Expression, PythonUDF, SortOrder}
import org.apache.spark.sql.catalyst.plans.logical.{EventTimeTimeout, ProcessingTimeTimeout}
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.catalyst.plans.physical.Distribution
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.python.ArrowPythonRunner
import org.apache.spark.sql.execution.python.streaming.FlatMapGroupsInPandasWithStateExec
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult
import org.apache.spark.sql.streaming.{GroupStateTimeout, OutputMode}
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.types.StructType

import org.apache.spark.sql.arrowstate.arrow.ArrowBatches
import org.apache.spark.sql.arrowstate.exec.{ArrowStateWriter, StatePartitionOpener, StateTasks, TaskEnvironment, WorkerSort}

/**
 * `applyInPandasWithState` with the user's function running in the Python worker that holds
 * the partition's state: only input rows (sorted by group, late rows dropped here as Spark
 * does) go to Python, and only the function's output rows come back.
 */
case class ArrowFlatMapGroupsWithStateExec(
    functionExpr: Expression,
    groupingAttributes: Seq[Attribute],
    outAttributes: Seq[Attribute],
    stateType: StructType,
    stateInfo: Option[StatefulOperatorStateInfo],
    stateFormatVersion: Int,
    outputMode: OutputMode,
    timeoutConf: GroupStateTimeout,
    batchTimestampMs: Option[Long],
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    skipEmittingInitialStateKeys: Boolean,
    output: Seq[Attribute],
    child: SparkPlan)
  extends UnaryExecNode with ArrowStateWriter with WatermarkSupport {

  override def nodeName: String = "ArrowFlatMapGroupsWithState"
  override def simpleString(maxFields: Int): String =
    s"$nodeName ${groupingAttributes.mkString("[", ", ", "]")}, $timeoutConf, " +
      s"${stateInfo.getOrElse("no state info")}"
  override def keyExpressions: Seq[Attribute] = groupingAttributes
  override def shortName: String =
    StatefulOperatorsUtils.FLAT_MAP_GROUPS_IN_PANDAS_WITH_STATE_EXEC_OP_NAME
  override def family: String = FlatMapGroupsWithStateFamily.name
  // as Spark's: late rows are dropped with event-time timeouts only
  override protected def inapplicableMetrics: Set[String] =
    if (dropsLateRows) Set.empty else ArrowStateWriter.LateRows
  private def dropsLateRows: Boolean =
    // (the expression, not the predicate: that one is made where it runs, not serializable)
    timeoutConf == EventTimeTimeout && watermarkExpressionForLateEvents.isDefined

  override def requiredChildDistribution: Seq[Distribution] =
    StatefulOperatorPartitioning.getCompatibleDistribution(
      groupingAttributes, getStateInfo, conf) :: Nil
  // the worker sorts the rows by key where it can (WorkerSort)
  @transient private lazy val inputSorted: Boolean =
    !WorkerSort.inWorker(this, groupingAttributes, session)
  override def requiredChildOrdering: Seq[Seq[SortOrder]] =
    Seq(if (inputSorted) groupingAttributes.map(SortOrder(_, Ascending)) else Nil)

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean = timeoutConf match {
    case ProcessingTimeTimeout => true
    case EventTimeTimeout => eventTimeWatermarkForEviction.exists(newInputWatermark > _)
    case _ => false
  }

  // The function's output carries no event time Spark could trust, as for Spark's node.
  override def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] = None

  /** Spark's own node for the same query: it owns the state schema checks. */
  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] =
    FlatMapGroupsInPandasWithStateExec(functionExpr, groupingAttributes, outAttributes,
      stateType, stateInfo, stateFormatVersion, outputMode, timeoutConf, batchTimestampMs,
      eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction,
      skipEmittingInitialStateKeys, child)
      .validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)

  private def timeoutName: String = timeoutConf match {
    case ProcessingTimeTimeout => "ProcessingTimeTimeout"
    case EventTimeTimeout => "EventTimeTimeout"
    case _ => "NoTimeout"
  }

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val function = functionExpr.asInstanceOf[PythonUDF].func
    val sent = ArrowFlatMapGroupsWithState.sentColumns(groupingAttributes, child.output)
    // all nullable, as Spark's own node sends them
    val sentSchema = DataTypeUtils.fromAttributes(sent.map(_.withNullability(true)))
    // as Spark's runner refuses it: pandas would lose a field a struct names twice
    org.apache.spark.sql.util.ArrowUtils.failDuplicatedFieldNames(sentSchema)
    val operator: JValue =
      ("command" -> Base64.getEncoder.encodeToString(function.command.toArray)) ~
        ("pythonIncludes" -> function.pythonIncludes.asScala.toList) ~
        ("keyIndices" -> groupingAttributes.map(g => sent.indexWhere(_.exprId == g.exprId))) ~
        ("valueCount" -> child.output.size) ~
        ("timeoutConf" -> timeoutName) ~
        ("batchTimestampMs" -> batchTimestampMs.getOrElse(-1L)) ~
        ("eventTimeWatermarkMs" -> eventTimeWatermarkForEviction.getOrElse(-1L)) ~
        ("watermarkPresent" ->
          child.output.exists(_.metadata.contains(EventTimeWatermark.delayKey))) ~
        ("runnerConf" -> ArrowPythonRunner.getPythonRunnerConfMap(conf)) ~
        ("stateSchema" -> stateType.json) ~
        ("outputSchema" -> DataTypeUtils.fromAttributes(outAttributes).json) ~
        ("inputSorted" -> inputSorted) ~
        ("maxRecordsPerBatch" -> conf.arrowMaxRecordsPerBatch)
    val opener =
      StatePartitionOpener.forSession(session, FlatMapGroupsWithStateFamily.name, info,
        operator, sentSchema,
        Some(TaskEnvironment.forFunction(function, sparkContext.getConf)))
    val outputSchema = DataTypeUtils.fromAttributes(output)
    val childOutput = child.output
    val dropLate = dropsLateRows

    StateTasks.rdd(this, opener, child.execute()) { (task, rows) =>
      val input = watermarkPredicateForDataForLateEvents match {
        case Some(late) if dropLate => applyRemovingRowsOlderThanWatermark(rows, late)
        case _ => rows
      }
      StateTasks.functionOutput(task, input, sent, childOutput, outputSchema)
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

object ArrowFlatMapGroupsWithState {
  /** The child's columns, then any grouping column the child does not output. */
  def sentColumns(grouping: Seq[Attribute], childOutput: Seq[Attribute]): Seq[Attribute] =
    childOutput ++ grouping.filterNot(g => childOutput.exists(_.exprId == g.exprId))

}

/** `applyInPandasWithState`: the user's function runs next to its state. */
object FlatMapGroupsWithStateFamily extends ArrowStateFamily {
  override val name = "flatMapGroupsWithState"

  override def matches(plan: SparkPlan): Boolean =
    plan.isInstanceOf[FlatMapGroupsInPandasWithStateExec]

  // real-time mode: the function is called per key of each flush, as rows arrive
  override val modes: TriggerModes = TriggerModes(
    microBatch = Runs(classOf[ArrowFlatMapGroupsWithStateExec]),
    realTime = Runs(classOf[ArrowFlatMapGroupsWithStateExec]).unless { plan =>
      WorkerSort.realTimeKeyReason(
        plan.asInstanceOf[FlatMapGroupsInPandasWithStateExec].groupingAttributes).toSeq
    })

  override def unsupportedReasons(plan: SparkPlan): Seq[String] = {
    val p = plan.asInstanceOf[FlatMapGroupsInPandasWithStateExec]
    val function = p.functionExpr.asInstanceOf[PythonUDF].func
    val names = ArrowFlatMapGroupsWithState.sentColumns(p.groupingAttributes, p.child.output)
      .map(_.name)
    Seq(
      if (!function.broadcastVars.isEmpty) {
        Some("the pickled function is shipped as a broadcast (it is over 1 MB)")
      } else None,
      if (names.distinct.size != names.size) {
        Some(s"duplicate column names in ${names.mkString(", ")}")
      } else None).flatten ++
      p.groupingAttributes.flatMap { a =>
        ArrowBatches.unsupportedKeyReason(a.dataType).map(r => s"key ${a.name}: unsupported $r")
      } ++
      p.stateType.fields.flatMap { f =>
        ArrowBatches.unsupportedValueReason(f.dataType)
          .map(r => s"state field ${f.name}: unsupported $r")
      }
  }

  override def replace(plan: SparkPlan): SparkPlan = {
    val p = plan.asInstanceOf[FlatMapGroupsInPandasWithStateExec]
    ArrowFlatMapGroupsWithStateExec(p.functionExpr, p.groupingAttributes,
      p.outAttributes, p.stateType, p.stateInfo, p.stateFormatVersion, p.outputMode,
      p.timeoutConf, p.batchTimestampMs, p.eventTimeWatermarkForLateEvents,
      p.eventTimeWatermarkForEviction, p.skipEmittingInitialStateKeys, p.output,
      WorkerSort.child(p.child, p.groupingAttributes))
  }
}
