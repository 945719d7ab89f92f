package org.apache.spark.sql.arrowstate.families

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, Predicate, SortOrder, UnsafeRow}
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.metric.SQLMetric

import org.apache.spark.sql.arrowstate.exec.TaskProjections

/**
 * Below a streaming deduplication's shuffle: passes the first row of each key of a map
 * partition and drops the later ones, which the deduplication would drop as duplicates
 * anyway (a shuffle keeps the order of one map partition's rows, so the first row of a key
 * that reaches the state is the one Spark's operator keeps). Rows dropped here count in the
 * operator's `numDroppedDuplicateRows` (`dropped`, the operator's own metric). Late rows
 * (`late`: Spark's predicate for the late-events watermark) all pass, since Spark counts
 * each of them in `numRowsDroppedByWatermark`, repeats included. It gives up
 * (passes every row) where it would not pay: when few of the first rows repeat a key, or
 * past `maxKeys` keys, whose copies it holds until the partition ends.
 */
case class ArrowFirstRowPerKeyExec(
    keys: Seq[Attribute], late: Option[Expression], child: SparkPlan, dropped: SQLMetric)
  extends UnaryExecNode {

  override def nodeName: String = "ArrowFirstRowPerKey"
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering

  override protected def doExecute(): RDD[InternalRow] = {
    val childOutput = child.output
    val dropped = this.dropped
    child.execute().mapPartitionsInternal { rows =>
      val keyOf = TaskProjections.unsafe(keys, childOutput)
      val isLate = late.map(Predicate.create(_, childOutput))
      val seen = new java.util.HashSet[UnsafeRow]()
      var read = 0L
      var skipped = 0L
      var deduplicating = true
      rows.filter { row =>
        if (!deduplicating || isLate.exists(_.eval(row))) true
        else {
          read += 1
          val key = keyOf(row)
          val first = !seen.contains(key)
          if (first) seen.add(key.copy()) else skipped += 1
          if (read == ArrowFirstRowPerKeyExec.SampleRows &&
              skipped * ArrowFirstRowPerKeyExec.MinRepeatShare < read ||
              seen.size >= ArrowFirstRowPerKeyExec.MaxKeys) {
            deduplicating = false
            seen.clear()
          }
          if (!first) dropped += 1
          first
        }
      }
    }
  }

  override protected def withNewChildInternal(newChild: SparkPlan): SparkPlan =
    copy(child = newChild)
}

object ArrowFirstRowPerKeyExec {
  /** Rows read before deciding whether the pass pays: it goes on only if at least one in
   * `MinRepeatShare` of them repeated a key. Few, since each costs a key copy and a hash
   * insert where keys hardly repeat (a deduplication by event time and user, say). */
  val SampleRows = 16384L
  val MinRepeatShare = 10L
  /** Keys held at most (copies of their key columns) per map partition. */
  val MaxKeys = 1000000
}
