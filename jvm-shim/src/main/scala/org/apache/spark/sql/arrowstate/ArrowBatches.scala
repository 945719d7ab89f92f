package org.apache.spark.sql.arrowstate

import java.io.{ByteArrayInputStream, ByteArrayOutputStream}
import java.nio.channels.Channels

import org.apache.arrow.memory.BufferAllocator
import org.apache.arrow.vector.{BitVector, VectorSchemaRoot}
import org.apache.arrow.vector.ipc.{ArrowStreamReader, ArrowStreamWriter}

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.arrow.ArrowWriter
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.ArrowUtils

/** Turns rows into self-contained Arrow IPC stream messages, one record batch each. */
class ArrowBatchEncoder(schema: StructType, timeZoneId: String) extends AutoCloseable {
  private val allocator: BufferAllocator =
    ArrowUtils.rootAllocator.newChildAllocator("arrowstate-encoder", 0, Long.MaxValue)
  private val root = VectorSchemaRoot.create(
    ArrowUtils.toArrowSchema(schema, timeZoneId, true, false), allocator)
  private val writer = ArrowWriter.create(root)

  private def ipc(withBatch: Boolean): Array[Byte] = {
    val bytes = new ByteArrayOutputStream()
    val w = new ArrowStreamWriter(root, null, Channels.newChannel(bytes))
    w.start()
    if (withBatch) w.writeBatch()
    w.end()
    bytes.toByteArray
  }

  /** The schema alone, so the worker knows the columns even when no batch comes. */
  def schemaIpc: Array[Byte] = ipc(withBatch = false)

  def encode(rows: Iterator[InternalRow]): Array[Byte] = {
    writer.reset()
    rows.foreach(writer.write)
    writer.finish()
    ipc(withBatch = true)
  }

  override def close(): Unit = {
    root.close()
    allocator.close()
  }
}

object ArrowBatches {
  /** Reads the single boolean column of a mask batch the worker sent back. */
  def readMask(bytes: Array[Byte]): Array[Boolean] = {
    val allocator = ArrowUtils.rootAllocator.newChildAllocator("arrowstate-mask", 0, Long.MaxValue)
    try {
      val reader = new ArrowStreamReader(new ByteArrayInputStream(bytes), allocator)
      try {
        require(reader.loadNextBatch(), "arrowstate: empty answer from the Python worker")
        val v = reader.getVectorSchemaRoot.getVector(0).asInstanceOf[BitVector]
        Array.tabulate(v.getValueCount)(i => v.get(i) == 1)
      } finally reader.close()
    } finally allocator.close()
  }

  /** Why arrowstate cannot carry a column of this type, if it cannot. */
  def unsupportedReason(dt: DataType): Option[String] = dt match {
    case BooleanType | ByteType | ShortType | IntegerType | LongType | FloatType | DoubleType |
         DateType | TimestampType | TimestampNTZType | BinaryType | NullType => None
    case _: DecimalType => None
    case s: StringType =>
      if (s.supportsBinaryEquality) None
      else Some(s"string with collation ${s.typeName} (keys compare by collation)")
    case s: StructType => s.fields.iterator.map(f => unsupportedReason(f.dataType)).collectFirst {
      case Some(r) => r
    }
    case ArrayType(e, _) => e match {
      case _: StructType | _: ArrayType | _: MapType | FloatType | DoubleType =>
        Some(s"type ${dt.sql} (arrays of ${e.sql})")
      case _ => unsupportedReason(e)
    }
    case other => Some(s"type ${other.sql}")
  }
}
