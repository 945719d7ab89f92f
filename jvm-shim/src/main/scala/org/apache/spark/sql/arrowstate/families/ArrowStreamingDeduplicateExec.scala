package org.apache.spark.sql.arrowstate.families

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.catalyst.plans.physical.{Distribution, Partitioning}
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult

import org.apache.spark.sql.arrowstate.arrow.ArrowBatches
import org.apache.spark.sql.arrowstate.exec.{ArrowStateWriter, StatePartitionOpener, StateTasks, TaskProjections, TriggerMode}
import org.apache.spark.sql.arrowstate.contract.Contract

/**
 * Streaming deduplication (and `dropDuplicatesWithinWatermark`) with its state in a Python
 * worker. Only the key columns (and the event-time column) cross to Python; the worker answers
 * each batch with a keep-mask, so the rows themselves never leave the JVM.
 */
case class ArrowStreamingDeduplicateExec(
    keyExpressions: Seq[Attribute],
    child: SparkPlan,
    stateInfo: Option[StatefulOperatorStateInfo],
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    withinWatermark: Boolean,
    droppedBeforeShuffle: Option[SQLMetric] = None)
  extends UnaryExecNode with ArrowStateWriter with WatermarkSupport {

  // duplicates dropped below the shuffle (ArrowFirstRowPerKeyExec) count with the worker's
  override protected def sharedMetrics: Map[String, SQLMetric] = droppedBeforeShuffle
    .map(Contract.MetricsByName(DeduplicateFamily.DroppedDuplicates).sqlName -> _).toMap

  override def nodeName: String = "ArrowStreamingDeduplicate"

  override def shortName: String =
    if (withinWatermark) StatefulOperatorsUtils.DEDUPLICATE_WITHIN_WATERMARK_EXEC_OP_NAME
    else StatefulOperatorsUtils.DEDUPLICATE_EXEC_OP_NAME

  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning

  override def requiredChildDistribution: Seq[Distribution] =
    StatefulOperatorPartitioning.getCompatibleDistribution(keyExpressions, getStateInfo, conf) :: Nil

  override def family: String = DeduplicateFamily.name

  private def eventTime: Option[Attribute] = WatermarkSupport.findEventTimeColumn(child.output,
    allowMultipleEventTimeColumns = !allowMultipleStatefulOperators)
  private def eventTimeKeyIndex: Int =
    eventTime.map(et => keyExpressions.indexWhere(_.exprId == et.exprId)).getOrElse(-1)

  // as Spark's: rows are late only by an event-time column, and state expires only when
  // it carries one (a key, or the time withinWatermark keeps)
  override protected def inapplicableMetrics: Set[String] =
    (if (eventTime.isDefined && eventTimeWatermarkForLateEvents.isDefined) Set.empty[String]
     else ArrowStateWriter.LateRows) ++
      (if ((withinWatermark || eventTimeKeyIndex >= 0) &&
           eventTimeWatermarkForEviction.isDefined) Set.empty[String]
       else ArrowStateWriter.Removals)

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    eventTimeWatermarkForEviction.exists(newInputWatermark > _)

  /** Spark's own node for the same query: it owns the state schema checks. */
  private def sparkTwin: StatefulOperator =
    if (withinWatermark) {
      StreamingDeduplicateWithinWatermarkExec(keyExpressions, child, stateInfo,
        eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction)
    } else {
      StreamingDeduplicateExec(keyExpressions, child, stateInfo,
        eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction)
    }

  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] =
    sparkTwin.validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)

  override def simpleString(maxFields: Int): String =
    s"$nodeName ${keyExpressions.mkString("[", ", ", "]")}" +
      (if (withinWatermark) " withinWatermark" else "") +
      s", ${stateInfo.getOrElse("no state info")}" +
      s", lateEventsWatermark = $eventTimeWatermarkForLateEvents" +
      s", evictionWatermark = $eventTimeWatermarkForEviction"

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val eventTime = this.eventTime
    val eventTimeKeyIndex = this.eventTimeKeyIndex
    val sent: Seq[Attribute] =
      keyExpressions ++ eventTime.filter(_ => eventTimeKeyIndex < 0).toSeq
    val sentSchema = ArrowBatches.schemaOf(sent)
    val operator: JValue =
      ("keyCount" -> keyExpressions.size) ~
        ("eventTimeIndex" -> (if (eventTimeKeyIndex >= 0) eventTimeKeyIndex
                              else if (eventTime.isDefined) keyExpressions.size else -1)) ~
        ("evictByKey" -> (eventTimeKeyIndex >= 0)) ~
        ("withinWatermark" -> withinWatermark) ~
        ("delayMs" -> eventTime.filter(_ => withinWatermark)
          .map(_.metadata.getLong(EventTimeWatermark.delayKey))) ~
        ("lateEventsWatermarkMs" -> eventTimeWatermarkForLateEvents) ~
        ("evictionWatermarkMs" -> eventTimeWatermarkForEviction)
    val opener =
      StatePartitionOpener.forSession(session, DeduplicateFamily.name, info, operator,
        sentSchema)
    val childOutput = child.output

    StateTasks.rdd(this, opener, child.execute()) { (task, rows) =>
      val project = TaskProjections.unsafe(sent, childOutput)
      // the rows the worker's mask keeps, in order (in real-time mode, each flush's as
      // soon as it is answered)
      StateTasks.posted(task, rows, project, keepInput = true) { (group, answer) =>
        answer match {
          case Some(mask) =>
            group.iterator.zip(ArrowBatches.readMask(mask).iterator).collect {
              case (row, true) => row
            }
          case None => Iterator.empty
        }
      }
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

/** Streaming deduplication, both kinds. */
object DeduplicateFamily extends ArrowStateFamily {
  override val name = "deduplicate"

  override def matches(plan: SparkPlan): Boolean = plan match {
    case _: StreamingDeduplicateExec | _: StreamingDeduplicateWithinWatermarkExec => true
    case _ => false
  }

  // real-time mode: a flush's rows are answered with the mask of those kept, as Spark's
  // real-time deduplication emits a row's result when it processes the row; no pass below
  // the shuffle there (Spark's allowlist would refuse it)
  override val modes: TriggerModes = TriggerModes(
    microBatch = Runs(classOf[ArrowStreamingDeduplicateExec], classOf[ArrowFirstRowPerKeyExec]),
    realTime = Runs(classOf[ArrowStreamingDeduplicateExec]))

  override def unsupportedReasons(plan: SparkPlan): Seq[String] = {
    val ours = swapped(plan)
    val eventTime = WatermarkSupport.findEventTimeColumn(ours.child.output,
      allowMultipleEventTimeColumns = true)
    (ours.keyExpressions ++ eventTime).flatMap { a =>
      ArrowBatches.unsupportedKeyReason(a.dataType).map(r => s"column ${a.name}: unsupported $r")
    }
  }

  val DroppedDuplicates = "numDroppedDuplicateRows"

  override def replace(plan: SparkPlan): SparkPlan = {
    val ours = swapped(plan)
    if (TriggerMode.of(plan) == TriggerMode.RealTime || ours.withinWatermark) ours
    else firstRowsBeforeShuffle(ours).getOrElse(ours)
  }

  /** Our node in place of Spark's, before any pass below the shuffle is added. */
  private def swapped(plan: SparkPlan): ArrowStreamingDeduplicateExec = plan match {
    case d: StreamingDeduplicateExec =>
      ArrowStreamingDeduplicateExec(d.keyExpressions, d.child, d.stateInfo,
        d.eventTimeWatermarkForLateEvents, d.eventTimeWatermarkForEviction,
        withinWatermark = false)
    case d: StreamingDeduplicateWithinWatermarkExec =>
      ArrowStreamingDeduplicateExec(d.keyExpressions, d.child, d.stateInfo,
        d.eventTimeWatermarkForLateEvents, d.eventTimeWatermarkForEviction,
        withinWatermark = true)
  }

  /**
   * The deduplication with a map-side pass below its shuffle that drops each map partition's
   * repeated keys (ArrowFirstRowPerKeyExec), where that keeps Spark's answers: a row's
   * lateness must follow from its key (no event-time column, or one among the keys), since a
   * late first row would otherwise hide a later one that is not late.
   */
  private def firstRowsBeforeShuffle(
      dedup: ArrowStreamingDeduplicateExec): Option[ArrowStreamingDeduplicateExec] = {
    val eventTime = WatermarkSupport.findEventTimeColumn(dedup.child.output,
      allowMultipleEventTimeColumns = true)
    val lateByKey = eventTime.forall(et => dedup.keyExpressions.exists(_.exprId == et.exprId))
    dedup.child match {
      case shuffle: ShuffleExchangeExec if lateByKey && dedup.keyExpressions.nonEmpty =>
        val dropped = ArrowStateWriter.sqlMetric(Contract.MetricsByName(DroppedDuplicates),
          dedup.session.sparkContext)
        val late = WatermarkSupport.watermarkExpression(eventTime,
          dedup.eventTimeWatermarkForLateEvents)
        val firstRows =
          ArrowFirstRowPerKeyExec(dedup.keyExpressions, late, shuffle.child, dropped)
        Some(dedup.copy(child = shuffle.withNewChildren(Seq(firstRows)),
          droppedBeforeShuffle = Some(dropped)))
      case _ => None
    }
  }
}
