package org.apache.spark.sql.arrowstate.exec

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow

import org.apache.spark.sql.arrowstate.arrow.ArrowBatchEncoder
import org.apache.spark.sql.arrowstate.worker.StateExchange

/**
 * Sends a partition's rows to the worker as they come, in batches of `batchSize`, with one
 * batch in flight so the worker works on it while the next is encoded. Rows are copied into
 * Arrow as they pass. Yields, in order: each input row as it passes when `passInput`; and
 * what `answer` makes of each batch's rows (kept, as copies, only when `keepInput`) and the
 * worker's answer to that batch. The input's end ends the exchange's input: END goes with
 * the last batch (the task's `endInput` then reads what the worker sends after it).
 */
class PostedRows(
    rows: Iterator[InternalRow],
    exchange: StateExchange,
    encoder: ArrowBatchEncoder,
    project: InternalRow => InternalRow,
    batchSize: Int,
    passInput: Boolean,
    keepInput: Boolean,
    answer: (Seq[InternalRow], Option[Array[Byte]]) => Iterator[InternalRow])
  extends Iterator[InternalRow] {

  private val ready = mutable.Queue[Iterator[InternalRow]]()
  private var current: Iterator[InternalRow] = Iterator.empty
  private var passed: InternalRow = null
  private var batch = mutable.ArrayBuffer[InternalRow]()
  private var pending = 0

  private def flush(last: Boolean): Unit = {
    val sent = batch
    exchange.post(encoder.finishBatch(), last)(a => ready.enqueue(answer(sent.toSeq, a)))
    batch = mutable.ArrayBuffer[InternalRow]()
    pending = 0
    exchange.settle(inFlight = 1)
  }

  override def hasNext: Boolean = {
    while (passed == null && !current.hasNext) {
      if (ready.nonEmpty) {
        current = ready.dequeue()
      } else if (rows.hasNext) {
        val row = rows.next()
        encoder.append(project(row))
        if (keepInput) batch += row.copy()
        pending += 1
        if (passInput) passed = row
        if (pending >= batchSize) flush(last = false)
      } else if (pending > 0) {
        flush(last = true)
      } else if (exchange.outstanding > 0) {
        exchange.sendEnd()   // (sent already, unless the input ended on a full batch)
        exchange.settle()
      } else {
        return false
      }
    }
    true
  }

  override def next(): InternalRow = {
    if (!hasNext) throw new NoSuchElementException
    if (passed != null) {
      val row = passed
      passed = null
      row
    } else {
      current.next()
    }
  }
}
