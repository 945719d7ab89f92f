package org.apache.spark.sql.arrowstate.exec

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.arrow.ArrowBatchEncoder
import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.worker.StateExchange

/**
 * A partition's rows in real-time mode, where the input of a batch goes on for the batch's
 * whole duration and each row's result is wanted as it arrives: rows go to the worker in
 * small flushes, one in flight at a time, and each flush's answer is yielded as it comes.
 *
 * The input iterator blocks until the next row comes, so a thread of the task reads it
 * (copying each row) into a queue. When no flush is in flight, that thread sends the row
 * it read as a flush itself: the row's way to the worker then has no hand-off to the
 * task's thread, whose wake-up overlaps the worker's work instead of preceding it. The
 * task's thread reads each flush's answer, sends the rows queued meanwhile as the next
 * flush (at most `maxRows`), and yields what `answer` makes of the answered flush's rows
 * (given only when `keepInput`) and the worker's answer. With `flushNanos` above zero
 * (spark.arrowstate.realTime.flushMs), a flush instead takes the rows that come within
 * that time after its first, gathered by the task's thread. One thread at a time encodes
 * and writes to the worker (under `lock`, while nothing is in flight); only the task's
 * thread reads from it.
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
  /** A flush sent: its rows (when kept), when it went, and the worker's answer once read. */
  private final class Flight(val rows: Seq[InternalRow], val posted: Long) {
    var answer: Option[Array[Byte]] = None
  }

  private val lock = new Object
  // guarded by `lock`: rows read and not sent yet, then End or Failed; the flush in flight
  private val pending = new java.util.ArrayDeque[AnyRef]()
  private var inFlight: Flight = null

  /** Sends up to `maxRows` pending rows as one flush (the caller holds `lock`, nothing is
   * in flight, and a row is first in `pending`). */
  private def send(): Flight = {
    val kept = scala.collection.mutable.ArrayBuffer[InternalRow]()
    var gathered = 0
    while (gathered < maxRows && pending.peekFirst().isInstanceOf[InternalRow]) {
      val row = pending.pollFirst().asInstanceOf[InternalRow]
      encoder.append(project(row))
      if (keepInput) kept += row
      gathered += 1
    }
    val flight = new Flight(kept.toSeq, System.nanoTime())
    exchange.post(encoder.finishBatch())(a => flight.answer = a)
    inFlight = flight
    flight
  }

  private def rowFirst: Boolean = pending.peekFirst().isInstanceOf[InternalRow]

  private val context = TaskContext.get()
  private val reader = new Thread(
      s"arrowstate real-time input of task ${context.taskAttemptId()}") {
    override def run(): Unit = {
      TaskContext.setTaskContext(context)
      try {
        while (rows.hasNext) {
          val row = rows.next().copy()
          lock.synchronized {
            pending.addLast(row)
            if (flushNanos == 0 && inFlight == null) send()
            lock.notifyAll()
          }
        }
        lock.synchronized { pending.addLast(End); lock.notifyAll() }
      } catch {
        case _: InterruptedException =>   // the task ended first
        case t: Throwable => lock.synchronized { pending.addFirst(Failed(t)); lock.notifyAll() }
      } finally TaskContext.unset()
    }
  }
  reader.setDaemon(true)
  reader.start()
  context.addTaskCompletionListener[Unit](_ => reader.interrupt())

  private var current: Iterator[InternalRow] = Iterator.empty
  private var ended = false

  /** The flush in flight, sent here if rows are pending and none is; null at the input's
   * end. Waits for a row when neither. */
  private def nextFlight(): Flight = lock.synchronized {
    var flight: Flight = null
    while (flight == null && !ended) {
      if (inFlight != null) flight = inFlight   // the input's thread sent it
      else pending.peekFirst() match {
        case null => lock.wait()
        case Failed(cause) => throw cause
        case End => ended = true
        case _ if flushNanos > 0 =>
          // the flush takes what comes within flushNanos of its first row
          val deadline = System.nanoTime() + flushNanos
          var wait = deadline - System.nanoTime()
          while (wait > 0 && pending.size < maxRows && !pending.peekLast().eq(End)) {
            lock.wait(math.max(1L, wait / 1000000L))
            wait = deadline - System.nanoTime()
          }
          flight = send()
        case _ => flight = send()
      }
    }
    flight
  }

  override def hasNext: Boolean = {
    while (!current.hasNext && !ended) {
      val flight = nextFlight()
      if (flight != null) {
        // read outside the lock: nothing else is sent while a flush is in flight
        exchange.settle()
        FlushRoundTrips.record(System.nanoTime() - flight.posted)
        lock.synchronized {
          inFlight = null
          // what came meanwhile goes at once: the worker works on it while this answer
          // is yielded
          if (flushNanos == 0 && rowFirst) send()
        }
        current = answer(flight.rows, flight.answer)
      }
    }
    current.hasNext
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
