package org.apache.spark.sql.arrowstate.families

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import org.apache.spark.TaskContext
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Ascending, Attribute, BoundReference, SortOrder}
import org.apache.spark.sql.catalyst.plans.physical.{Distribution, Partitioning}
import org.apache.spark.sql.catalyst.streaming.InternalOutputModes.{Append, Complete, Update}
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.metric.SQLMetrics
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.{OperatorStateMetadata, StateSchemaValidationResult}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.streaming.OutputMode

import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.arrowstate.exec.{ArrowStateWriter, PostedRows, StatePartitionOpener, StateTasks, TaskProjections}

/**
 * What the restore and save halves of one session window aggregation share: the state they
 * talk to and the worker header describing it. Both halves send whole rows of the same
 * layout (the grouping keys, the session window, the aggregation buffer: Spark's
 * MergingSessionsExec reads and writes that layout), so either may open the task's exchange.
 */
case class SessionWindowStateSpec(
    keyWithoutSessionExpressions: Seq[Attribute],
    sessionExpression: Attribute,
    stateInfo: Option[StatefulOperatorStateInfo],
    outputMode: OutputMode,
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    eventTimeIndex: Int,
    stateFormatVersion: Int) {

  def modeName: String = outputMode match {
    case Append => "append"
    case Update => "update"
    case Complete => "complete"
  }

  def sortOrder: Seq[SortOrder] =
    (keyWithoutSessionExpressions :+ sessionExpression).map(SortOrder(_, Ascending))

  def requiredChildDistribution(conf: SQLConf): Seq[Distribution] =
    StatefulOperatorPartitioning.getCompatibleDistribution(
      keyWithoutSessionExpressions, stateInfo.get, conf) :: Nil

  private def indexIn(rowLayout: Seq[Attribute], a: Attribute): Int =
    rowLayout.indexWhere(_.exprId == a.exprId)

  /** The columns the restore sends per input row: keys, session, and the event-time column
   * when it is not the session (late rows are judged by it). */
  def lookupColumns(rowLayout: Seq[Attribute]): Seq[Attribute] =
    keyWithoutSessionExpressions ++ Seq(sessionExpression) ++
      Option(eventTimeIndex).filter(i => i >= 0 && i != indexIn(rowLayout, sessionExpression))
        .map(rowLayout(_)).toSeq

  /** Made on the driver; `rowLayout` is either half's child output (the same layout). */
  def opener(session: SparkSession, rowLayout: Seq[Attribute]): StatePartitionOpener = {
    val conf = session.sessionState.conf
    val operator: JValue =
      ("keyIndexes" -> keyWithoutSessionExpressions.map(indexIn(rowLayout, _)).toList) ~
        ("sessionIndex" -> indexIn(rowLayout, sessionExpression)) ~
        ("eventTimeIndex" -> eventTimeIndex) ~
        ("outputMode" -> modeName) ~
        ("batchSize" -> math.max(1, conf.arrowMaxRecordsPerBatch)) ~
        ("lateEventsWatermarkMs" -> eventTimeWatermarkForLateEvents) ~
        ("evictionWatermarkMs" -> eventTimeWatermarkForEviction)
    StatePartitionOpener.forSession(session, SessionWindowFamily.name, stateInfo.get, operator,
      ArrowBatches.schemaOf(rowLayout))
  }

  override def toString: String =
    s"${keyWithoutSessionExpressions.mkString("[", ", ", "]")}, $sessionExpression, " +
      s"${stateInfo.getOrElse("no state info")}, $outputMode"
}

/**
 * Spark's SessionWindowStateStoreRestoreExec with the sessions in the Python worker. Input
 * rows come sorted by keys and session start; per batch of them only the keys, the session
 * (and the event time) cross to Python, which drops late rows (counted) and answers with the
 * order in which the kept rows and the stored sessions of their keys follow each other, as
 * Spark's merge sort of input and state orders them; the stored sessions come with that
 * answer. An answer of NO_DATA means: the batch as it is. After the input an empty batch asks
 * for the sessions still held back for the last key.
 */
case class ArrowSessionWindowStateStoreRestoreExec(spec: SessionWindowStateSpec, child: SparkPlan)
  extends UnaryExecNode {

  override def nodeName: String = "ArrowSessionWindowStateStoreRestore"
  override def simpleString(maxFields: Int): String = s"$nodeName $spec"
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = spec.sortOrder
  override def requiredChildOrdering: Seq[Seq[SortOrder]] = Seq(spec.sortOrder)
  override def requiredChildDistribution: Seq[Distribution] = spec.requiredChildDistribution(conf)

  override lazy val metrics = Map(
    "numOutputRows" -> SQLMetrics.createMetric(sparkContext, "number of output rows"))

  override protected def doExecute(): RDD[InternalRow] = {
    val numOutputRows = longMetric("numOutputRows")
    val childOutput = child.output
    val opener = spec.opener(session, childOutput)
    val lookupColumns = spec.lookupColumns(childOutput)
    val lookupSchema = ArrowBatches.schemaOf(lookupColumns)
    val width = childOutput.size
    val batchSize = math.max(1, conf.arrowMaxRecordsPerBatch)
    val timeZone = conf.sessionLocalTimeZone
    // an answer row: the input row's position (-1 for a stored session), the stored row
    val storedExprs = childOutput.zipWithIndex.map { case (a, i) =>
      BoundReference(i + 1, a.dataType, true)
    }

    child.execute().mapPartitionsWithIndex { (partitionId, rows) =>
      lazy val exchange = opener.open(partitionId)
      lazy val encoder = {
        val e = new ArrowBatchEncoder(lookupSchema, timeZone)
        TaskContext.get().addTaskCompletionListener[Unit](_ => e.close())
        e
      }
      val project = TaskProjections.unsafe(lookupColumns, childOutput)
      val stored = TaskProjections.unsafe(storedExprs)

      def merged(rowsOfBatch: Seq[InternalRow]): Iterator[InternalRow] = {
        val group = rowsOfBatch.toIndexedSeq
        exchange.lookup(encoder.encode(group.iterator.map(project))) match {
          case None => group.iterator
          case Some(answer) =>
            val out = mutable.ArrayBuffer[InternalRow]()
            ArrowBatches.foreachRow(answer, width + 1) { a =>
              val pos = a.getInt(0)
              out += (if (pos >= 0) group(pos) else stored(a).copy())
            }
            out.iterator
        }
      }

      val out = if (!rows.hasNext) Iterator.empty else {
        rows.map(_.copy()).grouped(batchSize).flatMap(merged) ++
          Iterator.single(()).flatMap(_ => merged(Nil))   // the last key's held-back sessions
      }
      out.map { r => numOutputRows += 1; r }
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

/**
 * Spark's SessionWindowStateStoreSaveExec with the sessions in the Python worker. The merged
 * sessions (Spark's MergingSessionsExec output, sorted by keys and session start) cross
 * whole; per key the worker replaces the stored sessions with them, as Spark's state manager
 * does. After the input it sends what the mode emits: in append mode the sessions the
 * eviction watermark closes (removed), in complete mode every stored session.
 */
case class ArrowSessionWindowStateStoreSaveExec(
    spec: SessionWindowStateSpec, finalAggregate: Option[BufferMerge], child: SparkPlan)
  extends UnaryExecNode with ArrowStateWriter with WatermarkSupport with FinishesAggregate {

  override def keyExpressions: Seq[Attribute] = spec.keyWithoutSessionExpressions
  override def stateInfo: Option[StatefulOperatorStateInfo] = spec.stateInfo
  override def eventTimeWatermarkForLateEvents: Option[Long] = spec.eventTimeWatermarkForLateEvents
  override def eventTimeWatermarkForEviction: Option[Long] = spec.eventTimeWatermarkForEviction

  override def nodeName: String = "ArrowSessionWindowStateStoreSave"
  override def simpleString(maxFields: Int): String =
    s"$nodeName $spec, lateEventsWatermark = $eventTimeWatermarkForLateEvents" +
      s", evictionWatermark = $eventTimeWatermarkForEviction" + finalString
  override def shortName: String =
    StatefulOperatorsUtils.SESSION_WINDOW_STATE_STORE_SAVE_EXEC_OP_NAME
  // each key's sessions are apart: one row per key and session
  override def uniqueColumns: Seq[Attribute] =
    spec.keyWithoutSessionExpressions :+ spec.sessionExpression
  override def withFinalAggregate(finish: BufferMerge): SparkPlan =
    copy(finalAggregate = Some(finish))
  override def requiredChildDistribution: Seq[Distribution] = spec.requiredChildDistribution(conf)
  override def family: String = SessionWindowFamily.name
  // without a watermark nothing is late; in complete mode, as Spark's save, no instances count
  override protected def inapplicableMetrics: Set[String] =
    (if (eventTimeWatermarkForLateEvents.isDefined) Set.empty[String]
     else ArrowStateWriter.LateRows) ++
      (if (spec.outputMode == Complete) Set("numStateStoreInstances") else Set.empty[String])

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    (spec.outputMode == Append || spec.outputMode == Update) &&
      eventTimeWatermarkForEviction.exists(newInputWatermark > _)

  /** Spark's own node for the same query: it owns the state schema checks and metadata. */
  private def sparkTwin: SessionWindowStateStoreSaveExec =
    SessionWindowStateStoreSaveExec(spec.keyWithoutSessionExpressions, spec.sessionExpression,
      stateInfo, Some(spec.outputMode), eventTimeWatermarkForLateEvents,
      eventTimeWatermarkForEviction, spec.stateFormatVersion, child)

  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] =
    sparkTwin.validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)

  override def operatorStateMetadata(stateSchemaPaths: List[List[String]])
    : OperatorStateMetadata = sparkTwin.operatorStateMetadata(stateSchemaPaths)

  override protected def doExecute(): RDD[InternalRow] = {
    val childOutput = child.output
    val width = childOutput.size
    val opener = spec.opener(session, childOutput)

    // Spark's save in complete mode leaves numStateStoreInstances unset (it sets its operator
    // metrics in append mode only): the same figure here
    StateTasks.rdd(this, opener, child.execute(),
        countsInstances = spec.outputMode != Complete) { (task, rows) =>
      val posted = new PostedRows(rows, task.exchange, task.encoder, identity, task.batchSize,
        passInput = false, keepInput = false, (_, _) => Iterator.empty)
      posted.foreach(_ => ())   // the mode's output comes once all input is stored
      // the emitted rows become Spark's rows, read in place (each good until the next)
      val fromSent = TaskProjections.unsafe(childOutput, childOutput)
      val emitted = ArrowBatches.rowsInPlace(_: Array[Byte], width).map(fromSent)
      finished(task.exchange.endInput().flatMap(emitted))
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

/** Session window aggregation: Spark's save, the restore below it that shares its state, and
 * Spark's own MergingSessionsExec between them (it merges the sessions and their buffers). */
object SessionWindowFamily extends ArrowStateFamily {
  override val name = "sessionWindow"

  override def matches(plan: SparkPlan): Boolean =
    plan.isInstanceOf[SessionWindowStateStoreSaveExec]

  override val modes: TriggerModes = TriggerModes(
    microBatch = Runs(classOf[ArrowSessionWindowStateStoreRestoreExec],
      classOf[ArrowSessionWindowStateStoreSaveExec]),
    realTime = StaysSpark("arrowstate's session windows answer per micro-batch"))

  private def restoreOf(save: SessionWindowStateStoreSaveExec)
    : Option[SessionWindowStateStoreRestoreExec] = {
    val operatorId = save.stateInfo.map(_.operatorId)
    save.child.collectFirst {
      case r: SessionWindowStateStoreRestoreExec if r.stateInfo.map(_.operatorId) == operatorId =>
        r
    }
  }

  /** The index in the save's child output of the column the watermark judges rows by. */
  private def eventTimeIndexOf(save: SessionWindowStateStoreSaveExec): Int =
    WatermarkSupport.findEventTimeColumn(save.child.output,
      allowMultipleEventTimeColumns = !save.allowMultipleStatefulOperators)
      .map(et => save.child.output.indexWhere(_.exprId == et.exprId)).getOrElse(-1)

  override def unsupportedReasons(plan: SparkPlan): Seq[String] = {
    val save = plan.asInstanceOf[SessionWindowStateStoreSaveExec]
    val restore = restoreOf(save)
    Seq(
      if (save.outputMode.isEmpty) Some("no output mode") else None,
      save.outputMode.filterNot(m => m == Append || m == Complete)
        .map(m => s"output mode $m (Spark's own operator refuses it too)"),
      if (restore.isEmpty) Some("no SessionWindowStateStoreRestoreExec of the same state")
      else None,
      restore.filter(r => r.child.output.map(_.exprId) != save.child.output.map(_.exprId))
        .map(_ => "the restore's and the save's rows differ in layout"),
      if (save.stateFormatVersion != 1) {
        Some(s"session window state format version ${save.stateFormatVersion}")
      } else None).flatten ++
      save.keyWithoutSessionExpressions.flatMap { a =>
        ArrowBatches.unsupportedKeyReason(a.dataType).map(r => s"key ${a.name}: unsupported $r")
      } ++
      save.child.output.flatMap { a =>
        ArrowBatches.unsupportedValueReason(a.dataType)
          .map(r => s"session column ${a.name}: unsupported $r")
      }
  }

  override def replace(plan: SparkPlan): SparkPlan = {
    val save = plan.asInstanceOf[SessionWindowStateStoreSaveExec]
    val restore = restoreOf(save).get
    // late rows are Spark's restore's to drop, evictions Spark's save's to make
    val spec = SessionWindowStateSpec(save.keyWithoutSessionExpressions, save.sessionExpression,
      save.stateInfo, save.outputMode.get, restore.eventTimeWatermarkForLateEvents,
      save.eventTimeWatermarkForEviction, eventTimeIndexOf(save), save.stateFormatVersion)
    val child = save.child.transformDown {
      case r: SessionWindowStateStoreRestoreExec if r eq restore =>
        ArrowSessionWindowStateStoreRestoreExec(spec, r.child)
    }
    ArrowSessionWindowStateStoreSaveExec(spec, None, child)
  }

  /** The final aggregate above the save: the save emits each key's session once. */
  override def absorb(parent: SparkPlan): Option[SparkPlan] = FinishesAggregate.absorb(parent)
}
