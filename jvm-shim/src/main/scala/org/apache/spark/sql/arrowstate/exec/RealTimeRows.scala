package org.apache.spark.sql.arrowstate.exec

import scala.collection.mutable

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
 * A flush begins with the first row that arrives and takes the rows that come within
 * `flushNanos` after it (spark.arrowstate.realTime.flushMs), at most `maxRows`; with 0, the
 * rows that came while the last flush was in flight. The input iterator blocks until the
 * next row comes, so a thread of the task reads it, and that thread posts a flush itself when
 * none is in flight and its gathering is over: a row that finds the worker free goes to it
 * straight from the input's thread, without waking the task's thread first (one wake-up
 * fewer on the row's way, each one a wait for a core on a busy executor). The task's thread
 * reads the answers (only it reads from the worker), posts the rows that came meanwhile at
 * once, before it yields what `answer` makes of the answered flush's rows (kept only when
 * `keepInput`) and the worker's answer, and posts a gathering flush at its deadline. Posting
 * (the encoder, the socket's writes) is under `lock`.
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

  private val lock = new Object
  // under lock: the flush being gathered, the one in flight, the input's end or failure
  private var gathered = 0
  private var gatherDeadline = 0L
  private var gatheredRows = mutable.ArrayBuffer[InternalRow]()
  private var inFlight = false
  private var inFlightRows: Seq[InternalRow] = Nil
  private var postedAt = 0L
  private var answered: Option[Array[Byte]] = None
  private var ended = false
  private var failure: Throwable = null
  private var closed = false   // the task is over: nothing more goes to the worker

  private def gatheringOver: Boolean =
    gathered >= maxRows || ended || System.nanoTime() - gatherDeadline >= 0

  /** Posts the gathered rows as one flush (under lock, none in flight). */
  private def post(): Unit = {
    val batch = encoder.finishBatch()
    inFlightRows = gatheredRows.toSeq
    gatheredRows = mutable.ArrayBuffer[InternalRow]()
    gathered = 0
    postedAt = System.nanoTime()
    exchange.post(batch)(a => answered = a)
    inFlight = true
    lock.notifyAll()
  }

  private val context = TaskContext.get()
  private val reader = new Thread(
      s"arrowstate real-time input of task ${context.taskAttemptId()}") {
    override def run(): Unit = {
      TaskContext.setTaskContext(context)
      try {
        var open = true
        while (open && rows.hasNext) {
          val row = rows.next()
          open = lock.synchronized {
            while (gathered >= maxRows && !closed) lock.wait()   // the worker is behind
            if (!closed) {
              if (gathered == 0) gatherDeadline = System.nanoTime() + flushNanos
              encoder.append(project(row))
              if (keepInput) gatheredRows += row.copy()
              gathered += 1
              if (!inFlight && gatheringOver) post()
              else if (gathered == 1) lock.notifyAll()   // the task's thread times the gathering
            }
            !closed
          }
        }
        lock.synchronized { ended = true; lock.notifyAll() }
      } catch {
        case _: InterruptedException =>   // the task ended first
        case t: Throwable => lock.synchronized { failure = t; lock.notifyAll() }
      } finally TaskContext.unset()
    }
  }
  reader.setDaemon(true)
  reader.start()
  context.addTaskCompletionListener[Unit] { _ =>
    lock.synchronized { closed = true; lock.notifyAll() }
    reader.interrupt()
  }

  private var current: Iterator[InternalRow] = Iterator.empty

  /** Waits until a flush is in flight (posting a gathered one at its deadline); false once
   * the input ended with nothing left to send. */
  private def awaitFlight(): Boolean = lock.synchronized {
    while (!inFlight) {
      if (failure != null) throw failure
      if (gathered > 0 && gatheringOver) post()
      else if (ended && gathered == 0) { closed = true; return false }
      else if (gathered > 0) {
        val waitNanos = gatherDeadline - System.nanoTime()
        lock.wait(waitNanos / 1000000, (waitNanos % 1000000).toInt)
      } else lock.wait()
    }
    true
  }

  override def hasNext: Boolean = {
    while (!current.hasNext) {
      if (!awaitFlight()) return false
      exchange.settle()   // only this thread reads; the reader posts only when none in flight
      val (sent, out) = lock.synchronized {
        FlushRoundTrips.record(System.nanoTime() - postedAt)
        val done = (inFlightRows, answered)
        inFlight = false
        inFlightRows = Nil
        answered = None
        // what came meanwhile goes before this answer is yielded
        if (gathered > 0 && gatheringOver) post() else lock.notifyAll()
        done
      }
      current = answer(sent, out)
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
