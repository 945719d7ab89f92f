package org.apache.spark.sql.arrowstate.unit

import java.io.ByteArrayOutputStream
import java.nio.channels.Channels

import org.apache.arrow.vector.VectorSchemaRoot
import org.apache.arrow.vector.ipc.ArrowStreamWriter

import org.apache.spark.{TaskContext, TaskContextImpl}
import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.apache.spark.sql.util.ArrowUtils

/** The rows the JVM sends as Arrow streams, and the worker's answers as the JVM reads them:
 * their memory goes back when read, or at the task's end at the latest. */
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

  test("an encoded batch is the stream Arrow's own writer writes, the schema made once") {
    val schema = StructType(Seq(StructField("c0", StringType), StructField("c1", LongType),
      StructField("c2", StructType(Seq(StructField("a", DoubleType), StructField("a", DateType)))),
      StructField("c3", ArrayType(IntegerType))))
    val rows = Seq(
      InternalRow(UTF8String.fromString("k"), 1L, InternalRow(0.5, 3), null),
      InternalRow(null, 2L, null, org.apache.spark.sql.catalyst.util.ArrayData.toArrayData(
        Array(1, 2, 3))))
    val encoder = new ArrowBatchEncoder(schema, "UTC")
    val arrowSchema = ArrowUtils.toArrowSchema(schema, "UTC", false, false)
    def written(count: Int): Array[Byte] = {
      // Arrow's writer over the same rows, loaded into a root of the same schema
      val root = VectorSchemaRoot.create(arrowSchema, ArrowUtils.rootAllocator)
      val check = new ArrowBatchEncoder(schema, "UTC")
      try {
        val reader = ArrowBatches.open(check.encode(rows.take(count).iterator), 4)
        val writer = org.apache.spark.sql.execution.arrow.ArrowWriter.create(root)
        (0 until reader.numRows).foreach(i => writer.write(reader.row(i)))
        writer.finish()
        reader.close()
        val bytes = new ByteArrayOutputStream()
        val w = new ArrowStreamWriter(root, null, Channels.newChannel(bytes))
        w.start(); w.writeBatch(); w.end()
        bytes.toByteArray
      } finally { check.close(); root.close() }
    }
    try {
      // twice each: the second batch's stream must start with the same schema
      for (count <- Seq(2, 1, 2)) {
        assertTrue(encoder.encode(rows.take(count).iterator).sameElements(written(count)),
          s"a batch of $count rows as Arrow writes it")
      }
      val empty = new ByteArrayOutputStream()
      val root = VectorSchemaRoot.create(arrowSchema, ArrowUtils.rootAllocator)
      try {
        val w = new ArrowStreamWriter(root, null, Channels.newChannel(empty))
        w.start(); w.end()
      } finally root.close()
      assertTrue(encoder.schemaIpc.sameElements(empty.toByteArray), "the schema alone")
    } finally encoder.close()
  }
}
