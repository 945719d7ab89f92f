package org.apache.spark.sql.arrowstate.families

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, EmptyRow, JoinedRow, NamedExpression, SpecificInternalRow}
import org.apache.spark.sql.catalyst.expressions.aggregate.{AggregateExpression, AggregateMode, DeclarativeAggregate, Final}
import org.apache.spark.sql.execution.{PartitioningPreservingUnaryExecNode, SparkPlan}
import org.apache.spark.sql.execution.aggregate.HashAggregateExec

import org.apache.spark.sql.arrowstate.exec.TaskProjections

/**
 * What one of Spark's merging aggregates (a HashAggregateExec in PartialMerge or Final mode)
 * computes, for input whose grouping keys are already unique: the restore's rows (a stored
 * buffer and the batch's buffer of one key) and the save's rows (one per key). Spark still
 * builds a hash map for them; this merges row by row with the functions' own expressions,
 * as Spark's AggregationIterator does for each group: the buffer starts at the functions'
 * initial values, merges the given rows in order, and (Final mode) evaluates the functions
 * and the aggregate's result expressions. The answers are the aggregate's by construction.
 */
case class BufferMerge(
    groupingAttributes: Seq[Attribute],
    aggregateExpressions: Seq[AggregateExpression],
    inputAttributes: Seq[Attribute],
    aggregateAttributes: Seq[Attribute],
    resultExpressions: Seq[NamedExpression]) {

  private def functions: Seq[DeclarativeAggregate] =
    aggregateExpressions.map(_.aggregateFunction.asInstanceOf[DeclarativeAggregate])

  private def isFinal: Boolean = aggregateExpressions.head.mode == Final

  def output: Seq[Attribute] = resultExpressions.map(_.toAttribute)

  override def toString: String =
    s"${if (isFinal) "finishing" else "merging"} ${aggregateExpressions.mkString(", ")}"

  /** The aggregation buffer's columns among `inputAttributes`: what a merge reads of a row. */
  def inputBuffer: Seq[Attribute] = BufferMerge.inputBufferOf(aggregateExpressions)

  /**
   * Merges `stored` (null when none), laid out as `storedLayout` (any columns among which
   * `inputBuffer`'s), and then `row`, laid out as `inputAttributes`, into one result row. In a
   * task (its projections are the executor's, TaskProjections); the result is reused by the
   * next call.
   */
  def newMerger(storedLayout: Seq[Attribute] = inputAttributes)
    : (InternalRow, InternalRow) => InternalRow = {
    val bufferAttributes = functions.flatMap(_.aggBufferAttributes)
    val buffer = new SpecificInternalRow(bufferAttributes.map(_.dataType))
    val initialize = TaskProjections.mutable(functions.flatMap(_.initialValues), Nil)
    val merge = TaskProjections.mutable(functions.flatMap(_.mergeExpressions),
      bufferAttributes ++ inputAttributes)
    val mergeStored = if (storedLayout == inputAttributes) merge
      else TaskProjections.mutable(functions.flatMap(_.mergeExpressions),
        bufferAttributes ++ storedLayout)
    Seq(initialize, merge, mergeStored).foreach(_.target(buffer))
    val joined = new JoinedRow
    val result: InternalRow => InternalRow = if (isFinal) {
      val values = new SpecificInternalRow(aggregateAttributes.map(_.dataType))
      val evaluate = TaskProjections.mutable(functions.map(_.evaluateExpression),
        bufferAttributes)
      evaluate.target(values)
      // grouping attributes are input attributes: their values come from the row
      val project = TaskProjections.unsafe(resultExpressions,
        inputAttributes ++ aggregateAttributes)
      row => { evaluate(buffer); project(joined(row, values)) }
    } else {
      val project = TaskProjections.unsafe(groupingAttributes ++ bufferAttributes,
        inputAttributes ++ bufferAttributes)
      row => project(joined(row, buffer))
    }
    (stored, row) => {
      initialize(EmptyRow)
      if (stored != null) mergeStored(joined(buffer, stored))
      merge(joined(buffer, row))
      result(row)
    }
  }
}

object BufferMerge {
  private def inputBufferOf(functions: Seq[AggregateExpression]): Seq[Attribute] =
    functions.flatMap(_.aggregateFunction.inputAggBufferAttributes)

  /**
   * The merge of a HashAggregateExec over `child`'s rows when it may run row by row: every
   * function declarative (their merges are expressions), in one mode, `mode`, with no distinct
   * or filter, grouped by the columns `unique` (non-empty) that no two of `child`'s rows
   * share. Typed or imperative functions (collect_list, approx_count_distinct) and sort-based
   * aggregates keep Spark's node.
   */
  def of(plan: SparkPlan, child: SparkPlan, unique: Seq[Attribute], mode: AggregateMode)
    : Option[BufferMerge] = plan match {
    case agg: HashAggregateExec if (agg.child eq child) && unique.nonEmpty &&
        agg.aggregateExpressions.nonEmpty &&
        agg.aggregateExpressions.forall(e => e.mode == mode && !e.isDistinct &&
          e.filter.isEmpty && e.aggregateFunction.isInstanceOf[DeclarativeAggregate]) &&
        agg.groupingExpressions.size == unique.size &&
        agg.groupingExpressions.map(_.exprId).toSet == unique.map(_.exprId).toSet =>
      // as BaseAggregateExec binds merges: the functions' own input buffer attributes
      // (SPARK-31620: they may be copies of those below)
      val inputBuffer = inputBufferOf(agg.aggregateExpressions)
      Some(BufferMerge(agg.groupingExpressions.map(_.toAttribute), agg.aggregateExpressions,
        child.output.dropRight(inputBuffer.size) ++ inputBuffer, agg.aggregateAttributes,
        agg.resultExpressions))
    case _ => None
  }
}

/**
 * A save that may take in Spark's final aggregate above it (its rows are one per group):
 * its output is then the aggregate's, and `finished` turns each saved row into it.
 */
trait FinishesAggregate extends PartitioningPreservingUnaryExecNode {
  def finalAggregate: Option[BufferMerge]

  /** The columns no two of the save's rows share: what the final aggregate must group by. */
  def uniqueColumns: Seq[Attribute]

  def withFinalAggregate(finish: BufferMerge): SparkPlan

  override def output: Seq[Attribute] = finalAggregate.fold(child.output)(_.output)
  // the final aggregate's output keeps the keys' partitioning where it keeps the keys
  override protected def outputExpressions: Seq[NamedExpression] =
    finalAggregate.fold[Seq[NamedExpression]](child.output)(_.resultExpressions)

  protected def finalString: String = finalAggregate.fold("")(f => s", $f")

  /** The saved rows as the final aggregate emits them (in a task). */
  protected def finished(saved: Iterator[InternalRow]): Iterator[InternalRow] =
    finalAggregate.map(_.newMerger())
      .fold(saved)(f => saved.map(f(null, _)))
}

object FinishesAggregate {
  /** `parent` taken into the save below it, when it is the save's final aggregate. */
  def absorb(parent: SparkPlan): Option[SparkPlan] = parent.children match {
    case Seq(save: FinishesAggregate) if save.finalAggregate.isEmpty =>
      BufferMerge.of(parent, save, save.uniqueColumns, Final).map(save.withFinalAggregate)
    case _ => None
  }
}
