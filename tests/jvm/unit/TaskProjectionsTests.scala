package org.apache.spark.sql.arrowstate.unit

import org.apache.spark.TaskContext
import org.apache.spark.sql.arrowstate.exec.TaskProjections
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Add, AttributeReference, BoundReference, Literal, Rand, ScalaUDF}
import org.apache.spark.sql.types.LongType

/** Generated projections kept between tasks: a task gets one no other running task holds,
 * made for the same expressions, and only when those are decided by their tree alone. */
object TaskProjectionsTests extends UnitTests {
  private val a = AttributeReference("a", LongType)()
  private val plusOne = Seq(Add(a, Literal(1L)))

  /** Runs `body` as a task of this partition (its completion listeners run after it). */
  private def inTask[T](partition: Int)(body: => T): T = {
    val context = TaskContext.empty()
    TaskContext.setTaskContext(context)
    try body finally {
      context.markTaskCompleted(None)
      TaskContext.unset()
    }
  }

  test("a later task gets the projection an earlier one gave back, working as a new one") {
    val first = inTask(0)(TaskProjections.unsafe(plusOne, Seq(a)))
    val second = inTask(1) {
      val p = TaskProjections.unsafe(plusOne, Seq(a))
      assertEqual(p(InternalRow(41L)).getLong(0), 42L)
      p
    }
    assertTrue(first eq second, "the projection was made again")
    val other = inTask(2)(TaskProjections.unsafe(Seq(Add(a, Literal(2L))), Seq(a)))
    assertTrue(!(other eq first), "other expressions got the same projection")
  }

  test("tasks running at once never share one") {
    val one = TaskContext.empty()
    val two = TaskContext.empty()
    try {
      TaskContext.setTaskContext(one)
      val p1 = TaskProjections.unsafe(plusOne, Seq(a))
      TaskContext.setTaskContext(two)
      val p2 = TaskProjections.unsafe(plusOne, Seq(a))
      assertTrue(!(p1 eq p2), "two running tasks hold the same projection")
      assertEqual(p1(InternalRow(1L)).getLong(0), 2L)
      assertEqual(p2(InternalRow(5L)).getLong(0), 6L)
    } finally {
      one.markTaskCompleted(None)
      two.markTaskCompleted(None)
      TaskContext.unset()
    }
  }

  test("user functions, nondeterministic expressions and subqueries are made for each task") {
    val udf = ScalaUDF((x: Long) => x + 1, LongType, Seq(BoundReference(0, LongType, false)),
      Nil)
    assertTrue(TaskProjections.reusable(plusOne))
    assertTrue(!TaskProjections.reusable(Seq(udf)), "a Scala UDF")
    assertTrue(!TaskProjections.reusable(Seq(Add(a, Rand(Literal(7L))))), "rand()")
    val made = (0 until 2).map(i => inTask(i)(TaskProjections.unsafe(Seq(udf))))
    assertTrue(!(made(0) eq made(1)), "a projection with a UDF was kept")
    assertEqual(made(1)(InternalRow(1L)).getLong(0), 2L)
  }
}
