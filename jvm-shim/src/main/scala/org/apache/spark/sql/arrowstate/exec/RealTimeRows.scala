package org.apache.spark.sql.arrowstate.exec

import java.util.concurrent.{LinkedBlockingQueue, TimeUnit}

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.arrow.ArrowBatchEncoder
import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.worker.StateExchange

/**
 * A partition's rows in real-time mode, where the input of a batch goes on for the batch's
 * whole duration and each row's result is wanted as it arrives: rows go to the worker in
 * small flushes and each flush's answer is yielded before the next row is waited for.
 *
 * A flush begins with the first row that arrives and takes the rows that come within
 * `flushNanos` after it (spark.arrowstate.realTime.flushMs), at most `maxRows`. Waiting on
 * the input is bounded that way only if it is not blocked in the input iterator, which
 * blocks until the next row comes: so a thread of the task reads the input (copying each
 * row) into a queue, and the task's thread gathers flushes from the queue, sends them and
 * yields what `answer` makes of each flush's rows (given only when `keepInput`) and the
 * worker's answer to it. Only the task's thread encodes and talks to the worker.
 */
class RealTimeRows(
    rows: Iterator[InternalRow],
    exchange: StateExchange,
    encoder: ArrowBatchEncoder,
    project: InternalRow => InternalRow,
    maxRows: Int,
    flushNanos: Long,
    keepInput: Boolean,
    answer: (Seq[InternalRow], Option[Array[Byte]]) => Iterator[InternalRow])
  extends Iterator[InternalRow] {

  // the state is loaded before the first row comes, not on the first flush's time
  exchange.awaitReady()

  private case class Failed(cause: Throwable)
  private val End = new Object
  private val queue = new LinkedBlockingQueue[AnyRef]()

  private val context = TaskContext.get()
  private val reader = new Thread(
      s"arrowstate real-time input of task ${context.taskAttemptId()}") {
    override def run(): Unit = {
      TaskContext.setTaskContext(context)
      try {
        while (rows.hasNext) queue.put(rows.next().copy())
        queue.put(End)
      } catch {
        case _: InterruptedException =>   // the task ended first
        case t: Throwable => queue.put(Failed(t))
      } finally TaskContext.unset()
    }
  }
  reader.setDaemon(true)
  reader.start()
  context.addTaskCompletionListener[Unit](_ => reader.interrupt())

  private var current: Iterator[InternalRow] = Iterator.empty
  private var ended = false
  private var flushed = scala.collection.mutable.ArrayBuffer[InternalRow]()

  /** Appends a queued item to the flush; false at the input's end. */
  private def append(item: AnyRef): Boolean = item match {
    case End => ended = true; false
    case Failed(cause) => throw cause
    case row: InternalRow =>
      encoder.append(project(row))
      if (keepInput) flushed += row
      true
  }

  override def hasNext: Boolean = {
    while (!current.hasNext) {
      if (ended || !append(queue.take())) return false
      var gathered = 1
      val deadline = System.nanoTime() + flushNanos
      var more = true
      while (more && gathered < maxRows) {
        val wait = deadline - System.nanoTime()
        val item = if (wait > 0) queue.poll(wait, TimeUnit.NANOSECONDS) else queue.poll()
        more = item != null && append(item)
        if (more) gathered += 1
      }
      var out: Option[Array[Byte]] = None
      val batch = encoder.finishBatch()
      val posted = System.nanoTime()
      exchange.post(batch)(a => out = a)
      exchange.settle()
      FlushRoundTrips.record(System.nanoTime() - posted)
      val sent = flushed
      flushed = scala.collection.mutable.ArrayBuffer[InternalRow]()
      current = answer(sent.toSeq, out)
    }
    true
  }

  override def next(): InternalRow = {
    if (!hasNext) throw new NoSuchElementException
    current.next()
  }
}

object RealTimeRows {
  /** How long a flush gathers rows after its first (spark.arrowstate.realTime.flushMs). */
  def flushNanos(conf: SQLConf): Long =
    ArrowStateConf.long(conf, ArrowStateConf.RealTimeFlushMs) * 1000000L
}
