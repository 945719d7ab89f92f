package org.apache.spark.sql.arrowstate.exec

import java.util.concurrent.{ConcurrentHashMap, ConcurrentLinkedQueue}

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, MutableProjection, Nondeterministic, PlanExpression, Projection, UnsafeProjection, UserDefinedExpression}

/**
 * Spark's generated projections for the tasks of arrowstate's operators, kept by the executor
 * from one task to the next. Making a projection writes its Java source anew each time (Spark's
 * code cache saves only the compile, keyed by that source); an operator makes several per task
 * and a micro-batch runs one task per partition, so making them took about 5% of the executor's
 * time in a windowed aggregation, and more at 200 partitions. A task takes an idle projection made
 * for equal expressions over an equal input (or makes one), initialized for its partition, and
 * gives it back when it completes; no two tasks hold one at once.
 *
 * Only expressions whose value is decided by their tree alone are kept: built-in ones, none
 * user-defined (a function object may carry a task's accumulators) or nondeterministic (their
 * state is per task), or holding a subquery's result (equal trees, another batch's value).
 * Others are made for each task, as before.
 */
object TaskProjections {
  private case class Key(kind: String, expressions: Seq[Expression], input: Seq[Attribute])

  private val idle = new ConcurrentHashMap[Key, ConcurrentLinkedQueue[Projection]]()
  // query runs that ended leave their keys behind: forget everything past this many
  private val MaxKeys = 256
  private val BuiltIn = "org.apache.spark.sql.catalyst.expressions."

  def unsafe(expressions: Seq[Expression], input: Seq[Attribute] = Nil): UnsafeProjection =
    take(Key("unsafe", expressions, input)) {
      if (input.isEmpty) UnsafeProjection.create(expressions)
      else UnsafeProjection.create(expressions, input)
    }

  def mutable(expressions: Seq[Expression], input: Seq[Attribute]): MutableProjection =
    take(Key("mutable", expressions, input))(MutableProjection.create(expressions, input))

  /** Whether a projection of these expressions may serve any task that asks for them. */
  def reusable(expressions: Seq[Expression]): Boolean = expressions.forall(_.find {
    case _: UserDefinedExpression | _: Nondeterministic | _: PlanExpression[_] => true
    case e => !e.deterministic || !e.getClass.getName.startsWith(BuiltIn)
  }.isEmpty)

  private def take[P <: Projection](key: Key)(make: => P): P = {
    val task = TaskContext.get()
    val partition = if (task == null) 0 else task.partitionId()
    if (task == null || !reusable(key.expressions ++ key.input)) {
      val made = make
      made.initialize(partition)
      return made
    }
    if (idle.size > MaxKeys) idle.clear()
    val queue = idle.computeIfAbsent(key, _ => new ConcurrentLinkedQueue[Projection]())
    val projection = Option(queue.poll()).getOrElse(make).asInstanceOf[P]
    projection.initialize(partition)
    task.addTaskCompletionListener[Unit](_ => queue.offer(projection))
    projection
  }
}
