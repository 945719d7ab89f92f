package org.apache.spark.sql.arrowstate.exec

import scala.reflect.ClassTag

import org.apache.spark.TaskContext
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BoundReference}
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorStateInfo, StatefulOpStateStoreCheckpointInfo, StateStoreWriter}
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.CompletionIterator

import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.arrowstate.worker.{CommittedPartitions, StateExchange}

/** What one task of an arrowstate writer works with; `flushNanos` in real-time mode only. */
class StateTask(
    val exchange: StateExchange,
    val encoder: ArrowBatchEncoder,
    val batchSize: Int,
    val flushNanos: Option[Long])

object StateTasks {
  /**
   * The RDD of an arrowstate writer, made on the driver: per partition it opens the exchange
   * with the worker and an encoder for the rows sent, lets `body` make the output, counts it,
   * and commits the new state version once all of it is consumed. `countsInstances`: whether
   * the task counts in numStateStoreInstances (Spark's session window save in complete mode
   * does not). The node's trigger mode (read from its plan) goes to the worker in the
   * operator payload and decides how rows are posted (`posted`).
   */
  def rdd[T: ClassTag](
      plan: StateStoreWriter,
      opener: StatePartitionOpener,
      input: RDD[T],
      countsInstances: Boolean = true)(
      body: (StateTask, Iterator[T]) => Iterator[InternalRow]): RDD[InternalRow] = {
    val opMetrics = plan.metrics
    val conf = plan.session.sessionState.conf
    val mode = TriggerMode.of(plan)
    val inMode = opener.in(mode)
    inMode.run   // checked and rendered here, on the driver, once for all the tasks
    val info = opener.info
    val batchSize = math.max(1, conf.arrowMaxRecordsPerBatch)
    val flushNanos = mode match {
      case TriggerMode.RealTime => Some(RealTimeRows.flushNanos(conf))
      case TriggerMode.MicroBatch => None
    }
    val coordinator = Some(plan.session.streams.stateStoreCoordinator)
    val reportCommits = conf.stateStoreCommitValidationEnabled
    // checkpoint format v2: each partition's ids go to the driver with the task's result
    val checkpointInfos =
      if (StatefulOperatorStateInfo.enableStateStoreCheckpointIds(conf)) {
        Some(plan.checkpointInfoAccumulator)
      } else None
    new ArrowStateRDD[T, InternalRow](input, info, coordinator, reportCommits,
      { (partitionId, rows, reporter) =>
        val exchange = inMode.open(partitionId)
        val encoder = new ArrowBatchEncoder(inMode.sentSchema, inMode.timeZone)
        TaskContext.get().addTaskCompletionListener[Unit](_ => encoder.close())
        val numOutputRows = opMetrics("numOutputRows")
        val out = body(new StateTask(exchange, encoder, batchSize, flushNanos), rows)
          .map { r => numOutputRows += 1; r }
        CompletionIterator[InternalRow, Iterator[InternalRow]](out, {
          if (!exchange.inputEnded) exchange.endInput().foreach(_ => ())
          exchange.commit(info.storeVersion + 1, opMetrics, inMode.family, countsInstances)
          CommittedPartitions.add(ArrowStateRDD.providerId(info, partitionId))
          checkpointInfos.foreach(_.add(StatefulOpStateStoreCheckpointInfo(partitionId,
            info.storeVersion + 1, exchange.checkpointIds.next.map(Array(_)),
            exchange.checkpointIds.base.map(Array(_)))))
          reporter.committed(info.storeVersion + 1)
        })
      })
  }

  /** The output of a family that runs a user's function: the input rows (projected to the
   * `sent` columns) go to the worker, and only the function's output rows come back. */
  def functionOutput(task: StateTask, rows: Iterator[InternalRow], sent: Seq[Attribute],
      childOutput: Seq[Attribute], outputSchema: StructType): Iterator[InternalRow] = {
    val project = TaskProjections.unsafe(sent, childOutput)
    val toOutput = TaskProjections.unsafe(outputSchema.fields.toSeq.zipWithIndex.map {
      case (f, i) => BoundReference(i, f.dataType, f.nullable)
    })
    val outputRows = ArrowBatches.rowsInPlace(_: Array[Byte], outputSchema.length).map(toOutput)
    posted(task, rows, project, keepInput = false) { (_, answer) =>
      answer.iterator.flatMap(outputRows)
    } ++ task.exchange.endInput().flatMap(outputRows)
  }

  /** The task's rows (projected to what is sent) posted to the worker, and what `answer`
   * makes of each batch's rows (kept only when `keepInput`) and the worker's answer: per
   * micro-batch (PostedRows), or in real-time mode in flushes as they arrive (RealTimeRows). */
  def posted(task: StateTask, rows: Iterator[InternalRow], project: InternalRow => InternalRow,
      keepInput: Boolean)(
      answer: (Seq[InternalRow], Option[Array[Byte]]) => Iterator[InternalRow])
    : Iterator[InternalRow] = task.flushNanos match {
    case Some(nanos) =>
      new RealTimeRows(rows, task.exchange, task.encoder, project, task.batchSize, nanos,
        keepInput, answer)
    case None =>
      new PostedRows(rows, task.exchange, task.encoder, project, task.batchSize,
        passInput = false, keepInput, answer)
  }
}
