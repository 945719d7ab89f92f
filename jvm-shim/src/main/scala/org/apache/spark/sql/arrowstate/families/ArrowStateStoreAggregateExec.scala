package org.apache.spark.sql.arrowstate.families

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import org.apache.spark.TaskContext
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference, BoundReference, GenericInternalRow, JoinedRow}
import org.apache.spark.sql.catalyst.expressions.aggregate.PartialMerge
import org.apache.spark.sql.catalyst.plans.physical.{AllTuples, Distribution, Partitioning}
import org.apache.spark.sql.catalyst.streaming.InternalOutputModes.{Append, Complete, Update}
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.metric.SQLMetrics
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.IntegerType
import org.apache.spark.util.CompletionIterator
import org.apache.spark.sql.streaming.OutputMode

import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.arrowstate.exec.{ArrowStateWriter, PostedRows, StatePartitionOpener, StateTasks, TaskProjections}

/**
 * What the restore and save halves of one streaming aggregation share: the state they talk
 * to, and the worker header that describes it (both must send the same one: whichever half
 * opens the task's exchange first begins it).
 */
case class AggregateStateSpec(
    keyExpressions: Seq[Attribute],
    stateInfo: Option[StatefulOperatorStateInfo],
    outputMode: OutputMode,
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    eventTimeKeyIndex: Int,
    stateFormatVersion: Int) {

  def modeName: String = outputMode match {
    case Append => "append"
    case Update => "update"
    case Complete => "complete"
  }

  /** Whether the save drops rows older than the late-events watermark (as Spark's does). */
  def dropsLateRows: Boolean =
    outputMode != Complete && eventTimeKeyIndex >= 0 && eventTimeWatermarkForLateEvents.isDefined

  /** The child's columns that are not grouping keys: the aggregation buffer, in order. */
  def bufferOf(childOutput: Seq[Attribute]): Seq[Attribute] =
    childOutput.filterNot(a => keyExpressions.exists(_.exprId == a.exprId))

  def requiredChildDistribution(conf: SQLConf): Seq[Distribution] =
    if (keyExpressions.isEmpty) AllTuples :: Nil
    else StatefulOperatorPartitioning.getCompatibleDistribution(
      keyExpressions, stateInfo.get, conf) :: Nil

  /** Made on the driver; `childOutput` is either half's child output (same layout). */
  def opener(session: SparkSession, childOutput: Seq[Attribute]): StatePartitionOpener = {
    val conf = session.sessionState.conf
    val operator: JValue =
      ("keyCount" -> keyExpressions.size) ~
        ("outputMode" -> modeName) ~
        ("eventTimeIndex" -> eventTimeKeyIndex) ~
        ("batchSize" -> math.max(1, conf.arrowMaxRecordsPerBatch)) ~
        ("lateEventsWatermarkMs" -> eventTimeWatermarkForLateEvents) ~
        ("evictionWatermarkMs" -> eventTimeWatermarkForEviction)
    StatePartitionOpener.forSession(session, AggregateFamily.name, stateInfo.get, operator,
      ArrowBatches.schemaOf(keyExpressions ++ bufferOf(childOutput)))
  }

  override def toString: String =
    s"${keyExpressions.mkString("[", ", ", "]")}, ${stateInfo.getOrElse("no state info")}, " +
      s"$outputMode"
}

/**
 * Spark's StateStoreRestoreExec with the state in the Python worker: each incoming group is
 * preceded by its stored aggregation buffer, if it has one. Only the group keys cross to
 * Python; only the stored buffers come back. With `merge` (Spark's merging aggregate above
 * the restore, taken into it) each group comes out merged with its stored buffer instead.
 */
case class ArrowStateStoreRestoreExec(
    spec: AggregateStateSpec, merge: Option[BufferMerge], child: SparkPlan)
  extends UnaryExecNode {

  override def nodeName: String = "ArrowStateStoreRestore"
  override def simpleString(maxFields: Int): String =
    s"$nodeName $spec" + merge.fold("")(m => s", $m")
  override def output: Seq[Attribute] = merge.fold(child.output)(_.output)
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def requiredChildDistribution: Seq[Distribution] = spec.requiredChildDistribution(conf)

  override lazy val metrics = Map(
    "numOutputRows" -> SQLMetrics.createMetric(sparkContext, "number of output rows"))

  override protected def doExecute(): RDD[InternalRow] = {
    val numOutputRows = longMetric("numOutputRows")
    val opener = spec.opener(session, child.output)
    val keys = spec.keyExpressions
    val buffer = spec.bufferOf(child.output)
    val keySchema = ArrowBatches.schemaOf(keys)
    val answerWidth = 1 + buffer.size
    val batchSize = math.max(1, conf.arrowMaxRecordsPerBatch)
    val timeZone = conf.sessionLocalTimeZone
    val width = child.output.size
    // A stored row is the incoming row's keys joined with the worker's answer (pos, buffer).
    val restoredExprs = child.output.zipWithIndex.map { case (a, i) =>
      if (keys.exists(_.exprId == a.exprId)) BoundReference(i, a.dataType, a.nullable)
      else BoundReference(width + 1 + buffer.indexWhere(_.exprId == a.exprId), a.dataType, true)
    }
    val childOutput = child.output
    // the keys lead the child's rows as Spark plans them: the encoder writes those columns
    val keysLead = childOutput.take(keys.size).map(_.exprId) == keys.map(_.exprId)
    // then the merge reads a stored buffer where it is, in the answer (pos, buffer)
    val answerLayout = merge.filter(m => keysLead && m.inputBuffer.size == width - keys.size)
      .map(m => AttributeReference("pos", IntegerType, nullable = false)() +: m.inputBuffer)

    child.execute().mapPartitionsWithIndex { (partitionId, rows) =>
      val exchange = opener.open(partitionId)
      val encoder = new ArrowBatchEncoder(keySchema, timeZone)
      TaskContext.get().addTaskCompletionListener[Unit](_ => encoder.close())
      val keyProjection: InternalRow => InternalRow =
        if (keysLead) identity else TaskProjections.unsafe(keys, childOutput)
      lazy val restored = TaskProjections.unsafe(restoredExprs)   // where not read in place
      lazy val answerRow = TaskProjections.unsafe(answerLayout.get.zipWithIndex.map {
        case (a, i) => BoundReference(i, a.dataType, a.nullable)
      })

      /** Each row's stored row (null where none), joined while the answer is open. */
      def restore(group: Seq[InternalRow]): Array[InternalRow] = {
        val stored = new Array[InternalRow](group.size)
        exchange.lookup(encoder.encode(group.iterator.map(keyProjection))).foreach { answer =>
          ArrowBatches.foreachRow(answer, answerWidth) { a =>
            val pos = a.getInt(0)
            stored(pos) = restored(new JoinedRow(group(pos), a)).copy()
          }
        }
        stored
      }

      val merger = merge.map(m => m.newMerger(answerLayout.getOrElse(m.inputAttributes)))

      /** The group merged with the stored buffers, read in place in the worker's answer. */
      def mergedInPlace(group: Seq[InternalRow], m: (InternalRow, InternalRow) => InternalRow)
        : Iterator[InternalRow] =
        exchange.lookup(encoder.encode(group.iterator.map(keyProjection))) match {
          case None => group.iterator.map(m(null, _))
          case Some(answer) =>
            val stored = ArrowBatches.open(answer, answerWidth)
            val at = Array.fill(group.size)(-1)
            (0 until stored.numRows).foreach(j => at(stored.row(j).getInt(0)) = j)
            // as an UnsafeRow (not copied): Spark's rows of generated code stay of the two
            // kinds its JIT has seen (a third makes their calls megamorphic everywhere)
            val merged = group.iterator.zipWithIndex.map { case (row, i) =>
              m(if (at(i) < 0) null else answerRow(stored.row(at(i))), row)
            }
            CompletionIterator[InternalRow, Iterator[InternalRow]](merged, stored.close())
        }

      val out = if (!rows.hasNext && keys.isEmpty) {
        // A global aggregate with no input still restores its state, as Spark's does.
        restore(Seq(new GenericInternalRow(width))).iterator.filter(_ != null)
      } else {
        rows.map(_.copy()).grouped(batchSize).flatMap { group =>
          merger match {
            case Some(m) if answerLayout.isDefined => mergedInPlace(group, m)
            case Some(m) =>
              val stored = restore(group)
              group.iterator.zipWithIndex.map { case (row, i) => m(stored(i), row) }
            case None =>
              val stored = restore(group)
              group.iterator.zipWithIndex.flatMap { case (row, i) =>
                if (stored(i) == null) Iterator.single(row) else Iterator(stored(i), row)
              }
          }
        }
      }
      out.map { r => numOutputRows += 1; r }
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

/**
 * Spark's StateStoreSaveExec with the state in the Python worker. Rows cross as key and
 * buffer columns; in update mode the worker answers only with a mask when rows were late, in
 * append and complete mode it sends the rows to emit after the input ends.
 */
case class ArrowStateStoreSaveExec(
    spec: AggregateStateSpec, finalAggregate: Option[BufferMerge], child: SparkPlan)
  extends UnaryExecNode with ArrowStateWriter with WatermarkSupport with FinishesAggregate {

  override def keyExpressions: Seq[Attribute] = spec.keyExpressions
  override def stateInfo: Option[StatefulOperatorStateInfo] = spec.stateInfo
  override def eventTimeWatermarkForLateEvents: Option[Long] = spec.eventTimeWatermarkForLateEvents
  override def eventTimeWatermarkForEviction: Option[Long] = spec.eventTimeWatermarkForEviction

  override def nodeName: String = "ArrowStateStoreSave"
  override def simpleString(maxFields: Int): String =
    s"$nodeName $spec, lateEventsWatermark = $eventTimeWatermarkForLateEvents" +
      s", evictionWatermark = $eventTimeWatermarkForEviction" + finalString
  override def shortName: String = StatefulOperatorsUtils.STATE_STORE_SAVE_EXEC_OP_NAME
  override def uniqueColumns: Seq[Attribute] = keyExpressions
  override def withFinalAggregate(finish: BufferMerge): SparkPlan =
    copy(finalAggregate = Some(finish))
  override def requiredChildDistribution: Seq[Distribution] = spec.requiredChildDistribution(conf)
  override def family: String = AggregateFamily.name
  // as Spark's: without an event-time key (or in complete mode) nothing is late or evicted
  override protected def inapplicableMetrics: Set[String] = {
    val indexed = spec.eventTimeKeyIndex >= 0 && spec.outputMode != Complete
    (if (indexed && eventTimeWatermarkForLateEvents.isDefined) Set.empty[String]
     else ArrowStateWriter.LateRows) ++
      (if (indexed && eventTimeWatermarkForEviction.isDefined) Set.empty[String]
       else ArrowStateWriter.Removals)
  }

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    spec.outputMode != Complete && eventTimeWatermarkForEviction.exists(newInputWatermark > _)

  /** Spark's own node for the same query: it owns the state schema checks. */
  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] =
    StateStoreSaveExec(keyExpressions, stateInfo, Some(spec.outputMode),
      eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction, spec.stateFormatVersion,
      child).validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)

  override protected def doExecute(): RDD[InternalRow] = {
    val sent = keyExpressions ++ spec.bufferOf(child.output)
    val width = sent.size
    val mode = spec.outputMode
    val waitsForMasks = mode == Update && spec.dropsLateRows
    val childOutput = child.output
    // as Spark plans it, the child's rows are the keys then the buffer: sent as they are
    val sentAsIs = sent.map(_.exprId) == childOutput.map(_.exprId)

    StateTasks.rdd(this, spec.opener(session, childOutput), child.execute()) { (task, rows) =>
      val toSent: InternalRow => InternalRow =
        if (sentAsIs) identity else TaskProjections.unsafe(sent, childOutput)
      // the emitted rows become rows of the child's layout, read in place (each good until
      // the next: the final aggregate taken in, or the operator above, takes one at a time)
      val fromSent = TaskProjections.unsafe(childOutput, sent)
      val emitted = ArrowBatches.rowsInPlace(_: Array[Byte], width).map(fromSent)
      // Only update mode with late rows to drop waits for the worker's verdict on its rows.
      val stored = new PostedRows(rows, task.exchange, task.encoder, toSent, task.batchSize,
        passInput = mode == Update && !waitsForMasks, keepInput = waitsForMasks,
        (batch, answer) => answer match {
          case Some(mask) if waitsForMasks =>
            batch.iterator.zip(ArrowBatches.readMask(mask).iterator).collect {
              case (row, true) => row
            }
          case _ => batch.iterator
        })
      // Append and complete emit only after all input is stored: drain it first.
      val input = if (mode == Update) stored else { stored.foreach(_ => ()); Iterator.empty }
      finished(
        input ++ task.exchange.endInput().flatMap(emitted))
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

/** Streaming aggregation: Spark's save and the restore below it that shares its state. */
object AggregateFamily extends ArrowStateFamily {
  override val name = "aggregate"

  override def matches(plan: SparkPlan): Boolean = plan.isInstanceOf[StateStoreSaveExec]

  // (Spark plans a real-time aggregation as StatefulStreamlineAggregateExec, not this node)
  override val modes: TriggerModes = TriggerModes(
    microBatch = Runs(classOf[ArrowStateStoreRestoreExec], classOf[ArrowStateStoreSaveExec]),
    realTime = StaysSpark("arrowstate's aggregation answers per micro-batch"))

  private def restoreOf(save: StateStoreSaveExec): Option[StateStoreRestoreExec] = {
    val operatorId = save.stateInfo.map(_.operatorId)
    save.child.collectFirst {
      case r: StateStoreRestoreExec if r.stateInfo.map(_.operatorId) == operatorId => r
    }
  }

  private def eventTimeOf(save: StateStoreSaveExec): (Option[Attribute], Int) = {
    val eventTime = WatermarkSupport.findEventTimeColumn(save.child.output,
      allowMultipleEventTimeColumns = !save.allowMultipleStatefulOperators)
    (eventTime,
      eventTime.map(et => save.keyExpressions.indexWhere(_.exprId == et.exprId)).getOrElse(-1))
  }

  override def unsupportedReasons(plan: SparkPlan): Seq[String] = {
    val save = plan.asInstanceOf[StateStoreSaveExec]
    val (eventTime, eventTimeKeyIndex) = eventTimeOf(save)
    val buffer =
      save.child.output.filterNot(a => save.keyExpressions.exists(_.exprId == a.exprId))
    Seq(
      if (save.outputMode.isEmpty) Some("no output mode") else None,
      // format 1 (Spark 2.3's, kept by checkpoints that old) stores the whole input row
      if (save.stateFormatVersion != 2) {
        Some(s"aggregation state format version ${save.stateFormatVersion}")
      } else None,
      if (restoreOf(save).isEmpty) Some("no StateStoreRestoreExec of the same state") else None,
      eventTime.filter(_ => eventTimeKeyIndex < 0)
        .map(et => s"event-time column ${et.name} is not a grouping key")).flatten ++
      save.keyExpressions.flatMap { a =>
        ArrowBatches.unsupportedKeyReason(a.dataType).map(r => s"key ${a.name}: unsupported $r")
      } ++
      buffer.flatMap { a =>
        ArrowBatches.unsupportedValueReason(a.dataType)
          .map(r => s"aggregation buffer ${a.name}: unsupported $r")
      }
  }

  override def replace(plan: SparkPlan): SparkPlan = {
    val save = plan.asInstanceOf[StateStoreSaveExec]
    val restore = restoreOf(save).get
    val spec = AggregateStateSpec(save.keyExpressions, save.stateInfo, save.outputMode.get,
      save.eventTimeWatermarkForLateEvents, save.eventTimeWatermarkForEviction,
      eventTimeOf(save)._2, save.stateFormatVersion)
    // Spark merges each restored buffer with the batch's in an aggregate between the two
    val child = BufferMerge.of(save.child, restore, save.keyExpressions, PartialMerge) match {
      case Some(merge) => ArrowStateStoreRestoreExec(spec, Some(merge), restore.child)
      case None => save.child.transformDown {
        case r: StateStoreRestoreExec if r eq restore =>
          ArrowStateStoreRestoreExec(spec, None, r.child)
      }
    }
    ArrowStateStoreSaveExec(spec, None, child)
  }

  /** The final aggregate above the save: the save's rows are one per key. */
  override def absorb(parent: SparkPlan): Option[SparkPlan] = FinishesAggregate.absorb(parent)
}
