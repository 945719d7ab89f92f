package org.apache.spark.sql.arrowstate.exec

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.execution.{SortExec, SparkPlan}
import org.apache.spark.sql.types._

import org.apache.spark.sql.arrowstate.contract.ArrowStateConf

/**
 * Grouping by key in the worker instead of Spark's sort before the node: for a function's
 * operators (transformWithState, applyInPandasWithState) the worker can sort a task's rows
 * itself, with Arrow's sort, once they have all come. Spark's sort took a seventh of the
 * executor's time (JFR) in the Row API's running count.
 *
 * Only where keys are of types whose order and equality are the same in Arrow and in Spark
 * (equal keys must end up next to each other), and not when the workers have a memory
 * budget (spark.arrowstate.worker.memory or spark.executor.pyspark.memory): Spark's sort
 * spills, which keeps a large micro-batch's rows out of the worker's bounded memory.
 */
object WorkerSort {
  /** Whether keys of this type sort in Arrow as in Spark: no floats (Spark's order puts NaN
   * last and -0.0 with 0.0), nothing nested. */
  def sortsAlikeInArrow(dt: DataType): Boolean = dt match {
    case BooleanType | ByteType | ShortType | IntegerType | LongType | DateType |
         TimestampType | TimestampNTZType | BinaryType | _: DecimalType => true
    case s: StringType => s.supportsBinaryEquality
    case _ => false
  }

  /** Whether the worker sorts the node's input by these grouping keys, where a micro-batch's
   * rows are all there: keys that sort alike, and no memory budget. */
  def applies(grouping: Seq[Attribute], session: SparkSession): Boolean =
    grouping.forall(a => sortsAlikeInArrow(a.dataType)) &&
      ArrowStateConf.workerMemoryBytes(session.sessionState.conf, session.sparkContext.conf) == 0

  /** Whether the worker groups `plan`'s input by these keys itself: in real-time mode always
   * (a sort would hold the rows until the batch's end; the worker groups each flush's rows
   * by key), else where it applies. The node then requires no ordering of its input
   * (`inputSorted` false). */
  def inWorker(plan: SparkPlan, grouping: Seq[Attribute], session: SparkSession): Boolean =
    TriggerMode.of(plan) == TriggerMode.RealTime || applies(grouping, session)

  /** Why the worker cannot group these keys in real-time mode, where only it can: a key of a
   * type whose values Arrow does not compare as Spark does (None when every key's does). */
  def realTimeKeyReason(grouping: Seq[Attribute]): Option[String] =
    grouping.find(a => !sortsAlikeInArrow(a.dataType)).map { a =>
      s"grouping key ${a.name} of type ${a.dataType.sql} is not compared alike in Arrow and " +
        "Spark, and the worker groups each flush's rows by key itself"
    }

  /** The plan below a node without the sort Spark put there for the node's keys (the
   * arrowstate node replaces Spark's after Spark planned the sort for it). */
  def withoutKeySort(child: SparkPlan, grouping: Seq[Attribute]): SparkPlan = child match {
    case SortExec(order, false, below, _) if order.size == grouping.size &&
        order.zip(grouping).forall { case (o, a) => o.child.semanticEquals(a) } => below
    case other => other
  }

  /** The child of a node replacing Spark's `plan` with these keys: without the sort where the
   * worker groups the rows itself. */
  def child(plan: SparkPlan, grouping: Seq[Attribute]): SparkPlan =
    if (inWorker(plan, grouping, SparkSession.active)) withoutKeySort(plan, grouping) else plan
}
