package org.apache.spark.sql.arrowstate.unit

import org.apache.spark.{TaskContext, TaskContextImpl}
import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.types.{LongType, StructField, StructType}
import org.apache.spark.sql.util.ArrowUtils

/** The worker's answers as the JVM reads them: their memory goes back when read, or at the
 * task's end at the latest. */
object ArrowBatchesTests extends UnitTests {
  private def answer(values: Long*): Array[Byte] = {
    val encoder = new ArrowBatchEncoder(StructType(Seq(StructField("c0", LongType))), "UTC")
    try encoder.encode(values.iterator.map(v => InternalRow(v))) finally encoder.close()
  }

  private def completionListeners(context: TaskContext): Int = {
    val field = classOf[TaskContextImpl].getDeclaredField("onCompleteCallbacks")
    field.setAccessible(true)
    field.get(context).asInstanceOf[java.util.Collection[_]].size
  }

  test("a task's open answers close at its end, with one listener however many it read") {
    val bytes = answer(1L, 2L)
    val before = ArrowUtils.rootAllocator.getAllocatedMemory
    val context = TaskContext.empty()
    TaskContext.setTaskContext(context)
    try {
      val listeners = completionListeners(context)
      // a real-time task reads an answer per flush, each read whole
      (1 to 50).foreach { _ =>
        assertEqual(ArrowBatches.rowsInPlace(bytes, 1).map(_.getLong(0)).toList, List(1L, 2L))
      }
      assertEqual(ArrowUtils.rootAllocator.getAllocatedMemory, before, "memory of read answers")
      val open = (1 to 3).map(_ => ArrowBatches.open(bytes, 1))
      assertEqual(open.map(_.row(1).getLong(0)), Seq(2L, 2L, 2L))
      assertEqual(completionListeners(context) - listeners, 1, "listeners added")
      assertTrue(ArrowUtils.rootAllocator.getAllocatedMemory > before, "open answers' memory")
      open.head.close()
      context.markTaskCompleted(None)
      assertEqual(ArrowUtils.rootAllocator.getAllocatedMemory, before, "memory after the task")
    } finally TaskContext.unset()
  }
}
