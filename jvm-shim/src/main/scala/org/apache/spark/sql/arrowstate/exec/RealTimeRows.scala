package org.apache.spark.sql.arrowstate.exec

import java.util.concurrent.{ScheduledThreadPoolExecutor, ThreadFactory, TimeUnit}

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
 * rows that came while the last flush was in flight.
 *
 * Each wake-up on a row's way is a wait for a core on a busy executor, so a flush is posted
 * by the thread that is awake when it is due, and the task's thread sleeps only in its read
 * of the worker's next answer (only it reads from the worker):
 *  - the input iterator blocks until the next row comes, so a thread of the task reads it;
 *    a row that finds no flush in flight (and its gathering over) goes to the worker from
 *    that thread;
 *  - the task's thread, woken by an answer, posts the rows that came meanwhile before it
 *    yields what `answer` makes of the answered flush's rows (kept only when `keepInput`)
 *    and the worker's answer;
 *  - a gathering that ends with no row coming is posted by a timer.
 * At the input's end with no flush in flight, the input's thread posts an empty flush, whose
 * answer wakes the task's thread; a failure there destroys the worker, which wakes it too.
 * Posting (the encoder, the socket's writes) is under `lock`.
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
  private var ended = false
  private var failure: Throwable = null
  private var closed = false   // the task is over or its input done: nothing more is posted

  private def gatheringOver: Boolean =
    gathered >= maxRows || ended || System.nanoTime() - gatherDeadline >= 0

  /** Posts the gathered rows as one flush (under lock, none in flight). */
  private def post(): Unit = {
    val batch = encoder.finishBatch()
    inFlightRows = gatheredRows.toSeq
    gatheredRows = mutable.ArrayBuffer[InternalRow]()
    gathered = 0
    inFlight = true
    postedAt = System.nanoTime()
    exchange.send(batch)
    lock.notifyAll()   // an input's thread waiting for room
  }

  /** Posts the gathered rows if their gathering is over, else has the timer post them at its
   * deadline (under lock). */
  private def postIfDue(): Unit = if (!inFlight && !closed && gathered > 0) {
    if (gatheringOver) post()
    else RealTimeRows.timer.schedule(new Runnable {
      override def run(): Unit = posting(postIfDue())
    }, gatherDeadline - System.nanoTime(), TimeUnit.NANOSECONDS)
  }

  /** Runs `body` under lock on a thread other than the task's: its failure is the task's,
   * and destroys the worker, whose closed connection wakes the task's thread. */
  private def posting(body: => Unit): Unit = {
    val failed = lock.synchronized {
      try { body; false } catch {
        case t: Throwable =>
          if (!closed && failure == null) failure = t
          !closed
      }
    }
    if (failed) exchange.abort()
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
          posting {
            while (gathered >= maxRows && !closed) lock.wait()   // the worker is behind
            if (!closed) {
              if (gathered == 0) gatherDeadline = System.nanoTime() + flushNanos
              encoder.append(project(row))
              if (keepInput) gatheredRows += row.copy()
              gathered += 1
              postIfDue()
            }
          }
          open = lock.synchronized(!closed && failure == null)
        }
        // the task's thread waits for an answer: an empty flush's, if nothing is in flight
        if (open) posting {
          ended = true
          if (!inFlight && gathered == 0 && !closed) post() else postIfDue()
        }
      } catch {
        case _: InterruptedException =>   // the task ended first
        case t: Throwable => posting(throw t)
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
  private var done = false

  override def hasNext: Boolean = {
    while (!current.hasNext) {
      lock.synchronized {
        if (failure != null) throw failure
        if (done) { closed = true; return false }
      }
      // something is in flight, or will be: the input's thread posts a row or the input's
      // end, the timer a gathering
      val out = try exchange.nextAnswer() catch {
        case e: Throwable => lock.synchronized { if (failure != null) throw failure }; throw e
      }
      val sent = lock.synchronized {
        val roundTrip = System.nanoTime() - postedAt
        FlushRoundTrips.record(roundTrip)
        exchange.waitedFor(roundTrip)
        val rows = inFlightRows
        inFlight = false
        inFlightRows = Nil
        // what came meanwhile goes before this answer is yielded
        postIfDue()
        done = !inFlight && ended && gathered == 0
        rows
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

  /** Posts gatherings that end with no row coming (flushMs above 0), for every task. */
  private lazy val timer = {
    val t = new ScheduledThreadPoolExecutor(1, new ThreadFactory {
      override def newThread(r: Runnable): Thread = {
        val thread = new Thread(r, "arrowstate real-time flush timer")
        thread.setDaemon(true)
        thread
      }
    })
    t.setRemoveOnCancelPolicy(true)
    t
  }
}
