package org.apache.spark.sql.arrowstate.arrow

import java.io.{ByteArrayInputStream, ByteArrayOutputStream}
import java.nio.channels.Channels
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.arrow.memory.BufferAllocator
import org.apache.arrow.vector.{BitVector, VectorSchemaRoot, VectorUnloader}
import org.apache.arrow.vector.ipc.{ArrowStreamReader, ArrowStreamWriter, WriteChannel}
import org.apache.arrow.vector.ipc.message.{IpcOption, MessageSerializer}

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.ArrowUtils
import org.apache.spark.sql.vectorized.{ArrowColumnVector, ColumnVector, ColumnarBatch}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException

/** Turns rows into self-contained Arrow IPC stream messages, one record batch each. */
class ArrowBatchEncoder(schema: StructType, timeZoneId: String) extends AutoCloseable {
  private val allocator: BufferAllocator =
    ArrowUtils.rootAllocator.newChildAllocator("arrowstate-encoder", 0, Long.MaxValue)
  // Arrow's struct vectors key their children by name: a name a struct repeats (Spark allows
  // it) becomes name_0, name_1, ... as Spark's own Arrow conversion makes it. Both sides read
  // columns and fields by position; unrepeated names stay as they are, so do stored files.
  private val root = VectorSchemaRoot.create(
    ArrowUtils.toArrowSchema(schema, timeZoneId, false, false), allocator)
  private val writer = RowsIntoArrow(root)

  // The schema's IPC message, made once: each batch's stream starts with it (a new stream
  // writer serialised it again for every batch, a third of a one-row flush's encoding)
  private val schemaMessage: Array[Byte] = {
    val bytes = new ByteArrayOutputStream()
    MessageSerializer.serialize(new WriteChannel(Channels.newChannel(bytes)), root.getSchema,
      IpcOption.DEFAULT)
    bytes.toByteArray
  }

  /** A stream of the schema, the batch built (when `withBatch`) and the end of the stream:
   * the bytes an ArrowStreamWriter writes for them. */
  private def ipc(withBatch: Boolean): Array[Byte] = {
    // sized for the batch's buffers and the schema and message headers, so the stream is
    // not copied as it grows (a doubling from 32 bytes copies a large batch a dozen times)
    val size = if (withBatch) root.getFieldVectors.asScala.map(_.getBufferSize.toLong).sum else 0L
    val bytes = new ByteArrayOutputStream(
      math.min(size + schemaMessage.length + 4096L, Int.MaxValue - 8L).toInt)
    bytes.write(schemaMessage)
    val out = new WriteChannel(Channels.newChannel(bytes))
    if (withBatch) {
      val batch = new VectorUnloader(root).getRecordBatch
      try MessageSerializer.serialize(out, batch, IpcOption.DEFAULT) finally batch.close()
    }
    ArrowStreamWriter.writeEndOfStream(out, IpcOption.DEFAULT)
    bytes.toByteArray
  }

  /** The schema alone, so the worker knows the columns even when no batch comes. */
  def schemaIpc: Array[Byte] = ipc(withBatch = false)

  /** Adds a row to the batch being built (its values are copied into Arrow). */
  def append(row: InternalRow): Unit = writer.write(row)

  /** The batch built since the last one, as IPC bytes; starts the next one. */
  def finishBatch(): Array[Byte] = {
    writer.finish()
    val bytes = ipc(withBatch = true)
    writer.reset()
    bytes
  }

  def encode(rows: Iterator[InternalRow]): Array[Byte] = {
    rows.foreach(append)
    finishBatch()
  }

  override def close(): Unit = {
    root.close()
    allocator.close()
  }
}

object ArrowBatches {
  /** The schema rows of these columns cross to Python with (positional names). */
  def schemaOf(attributes: Seq[Attribute]): StructType =
    StructType(attributes.zipWithIndex.map { case (a, i) =>
      StructField(s"c$i", a.dataType, a.nullable)
    })

  /** The batch of an IPC stream of one, loaded; `close` lets its memory go. */
  private class LoadedBatch(bytes: Array[Byte]) extends AutoCloseable {
    private val allocator =
      ArrowUtils.rootAllocator.newChildAllocator("arrowstate-read", 0, Long.MaxValue)
    // let go of when closed: a task keeps a closed batch until it ends (its listener), and
    // the reader keeps the stream's bytes
    private var reader = try new ArrowStreamReader(new ByteArrayInputStream(bytes), allocator)
      catch { case e: Throwable => allocator.close(); throw e }
    try {
      if (!reader.loadNextBatch()) {
        throw ArrowStateException.contract("DATA", "batch", "an Arrow stream with no batch")
      }
    } catch { case e: Throwable => close(); throw e }

    def root: VectorSchemaRoot = reader.getVectorSchemaRoot

    /** It as Spark reads columns, checked to have `width` (any number when negative). */
    def columnar(width: Int): ColumnarBatch = {
      val columns: Array[ColumnVector] =
        root.getFieldVectors.asScala.map(v => new ArrowColumnVector(v): ColumnVector).toArray
      if (width >= 0 && columns.length != width) {
        throw ArrowStateException.contract("DATA", "batch",
          s"${columns.length} columns, where the operator reads $width")
      }
      new ColumnarBatch(columns, root.getRowCount)
    }

    /** Its rows as Spark reads columnar rows (one row object, moved along). */
    def rows(width: Int): Iterator[InternalRow] = columnar(width).rowIterator().asScala

    override def close(): Unit = if (reader != null) {
      try reader.close() finally {
        reader = null
        allocator.close()
      }
    }
  }

  private def withBatch[T](bytes: Array[Byte])(read: LoadedBatch => T): T = {
    val batch = new LoadedBatch(bytes)
    try read(batch) finally batch.close()
  }

  /** A batch the worker sent back, open for its rows by index (one row object, moved to the
   * row asked for) until closed, or until the task ends. */
  final class OpenBatch private[ArrowBatches] (loaded: LoadedBatch, width: Int)
    extends AutoCloseable {
    private val batch =
      try loaded.columnar(width) catch { case e: Throwable => loaded.close(); throw e }
    private val openInTask = OpenInTask.add(loaded)
    def numRows: Int = batch.numRows
    def row(i: Int): InternalRow = batch.getRow(i)
    override def close(): Unit = {
      loaded.close()
      openInTask.foreach(_.remove(loaded))
    }
  }

  /** The batches each running task holds open, closed when it ends: one completion listener a
   * task, not one a batch, which a real-time task would add per flush for as long as its
   * batch runs (each keeping its batch's objects until the task's end). */
  private object OpenInTask {
    private val byTask = new ConcurrentHashMap[Long, java.util.Set[LoadedBatch]]()

    def add(batch: LoadedBatch): Option[java.util.Set[LoadedBatch]] =
      Option(TaskContext.get()).map { context =>
        val task = context.taskAttemptId()
        val fresh = ConcurrentHashMap.newKeySet[LoadedBatch]()
        val open = Option(byTask.putIfAbsent(task, fresh)).getOrElse {
          context.addTaskCompletionListener[Unit] { _ =>
            Option(byTask.remove(task)).foreach(_.toArray(Array.empty[LoadedBatch])
              .foreach(_.close()))
          }
          fresh
        }
        open.add(batch)
        open
      }
  }

  def open(bytes: Array[Byte], width: Int): OpenBatch = new OpenBatch(new LoadedBatch(bytes), width)

  /** Reads the single boolean column of a mask batch the worker sent back. */
  def readMask(bytes: Array[Byte]): Array[Boolean] = withBatch(bytes) { batch =>
    val v = batch.root.getVector(0).asInstanceOf[BitVector]
    Array.tabulate(v.getValueCount)(i => v.get(i) == 1)
  }

  /** Runs `f` on each row of a batch the worker sent back (of `width` columns; any number
   * when negative); the rows die with the batch. */
  def foreachRow(bytes: Array[Byte], width: Int)(f: InternalRow => Unit): Unit =
    withBatch(bytes)(_.rows(width).foreach(f))

  /**
   * The rows of a batch the worker sent back (of `width` columns), read in place as they are
   * asked for: a row is good until the next is asked for (one row object, moved along). The
   * batch's memory goes when its last row has been read, or when the task ends.
   */
  def rowsInPlace(bytes: Array[Byte], width: Int): Iterator[InternalRow] = {
    val batch = open(bytes, width)
    val rows = Iterator.range(0, batch.numRows).map(batch.row)
    new Iterator[InternalRow] {
      private var more = true
      override def hasNext: Boolean =
        more && (rows.hasNext || { batch.close(); more = false; false })
      override def next(): InternalRow = rows.next()
    }
  }

  /** Why arrowstate cannot hold values of this type in state (they only round-trip). */
  def unsupportedValueReason(dt: DataType): Option[String] = dt match {
    case BooleanType | ByteType | ShortType | IntegerType | LongType | FloatType | DoubleType |
         DateType | TimestampType | TimestampNTZType | BinaryType | NullType | _: StringType |
         _: DecimalType => None
    case s: StructType => s.fields.iterator.flatMap(f => unsupportedValueReason(f.dataType))
      .nextOption()
    case ArrayType(e, _) => unsupportedValueReason(e)
    case MapType(k, v, _) => unsupportedValueReason(k).orElse(unsupportedValueReason(v))
    case other => Some(s"type ${other.sql}")
  }

  /** Why arrowstate cannot use a column of this type as a key, if it cannot. */
  def unsupportedKeyReason(dt: DataType): Option[String] = dt match {
    case BooleanType | ByteType | ShortType | IntegerType | LongType | FloatType | DoubleType |
         DateType | TimestampType | TimestampNTZType | BinaryType | NullType => None
    case _: DecimalType => None
    case s: StringType =>
      if (s.supportsBinaryEquality) None
      else Some(s"string with collation ${s.typeName} (keys compare by collation)")
    case s: StructType => s.fields.iterator.map(f => unsupportedKeyReason(f.dataType)).collectFirst {
      case Some(r) => r
    }
    case ArrayType(e, _) => e match {
      case _: StructType | _: ArrayType | _: MapType | FloatType | DoubleType =>
        Some(s"type ${dt.sql} (arrays of ${e.sql})")
      case _ => unsupportedKeyReason(e)
    }
    case other => Some(s"type ${other.sql}")
  }
}
