package org.apache.spark.sql.arrowstate.arrow

import scala.jdk.CollectionConverters._

import org.apache.arrow.vector._
import org.apache.arrow.vector.complex.StructVector

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters
import org.apache.spark.sql.execution.arrow.ArrowWriter
import org.apache.spark.unsafe.Platform

/** Writes Spark rows into the vectors of a VectorSchemaRoot. */
trait RowsIntoArrow {
  def write(row: InternalRow): Unit
  /** Sets the row count of the root and of every vector, ready to be sent. */
  def finish(): Unit
  /** Empties the vectors (keeping their memory) for the next batch. */
  def reset(): Unit
}

object RowsIntoArrow {
  /** arrowstate's writer when every column is of a type it writes (numbers, booleans,
   * dates, timestamps, strings, binary, and structs of them: the keys and values of state
   * and most rows a function gets), else Spark's ArrowWriter. Both leave the same bytes in
   * the vectors; Spark's checks capacity and bounds per value through Arrow's `setSafe` and,
   * for a string, wraps it in a new ByteBuffer (a quarter of the JVM's time writing a
   * transformWithState function's rows, in JFR). */
  def apply(root: VectorSchemaRoot): RowsIntoArrow = {
    val columns = root.getFieldVectors.asScala.map(ColumnWriter.of).toArray
    if (columns.forall(_.isDefined)) new ArrowRowWriter(root, columns.map(_.get))
    else {
      val spark = ArrowWriter.create(root)
      new RowsIntoArrow {
        def write(row: InternalRow): Unit = spark.write(row)
        def finish(): Unit = spark.finish()
        def reset(): Unit = spark.reset()
      }
    }
  }
}

/** Rows written column by column straight into the vectors' memory: each column keeps the
 * addresses of its buffers and their capacity, and grows them (Arrow's own reallocation,
 * which doubles) only when a row would not fit. Values, validity bits and offsets are the
 * ones Arrow's `setSafe`/`setNull` leave. */
final class ArrowRowWriter(root: VectorSchemaRoot, columns: Array[ColumnWriter])
  extends RowsIntoArrow {
  columns.foreach(_.allocate())
  private var count = 0

  def write(row: InternalRow): Unit = {
    var i = 0
    while (i < columns.length) {
      columns(i).write(row, i, count)
      i += 1
    }
    count += 1
  }

  def finish(): Unit = {
    // the columns first: the root's row count sets every vector's value count, which fills
    // a variable-width vector's offsets from the last value it knows was set
    columns.foreach(_.finish(count))
    root.setRowCount(count)
  }

  def reset(): Unit = {
    root.setRowCount(0)
    count = 0
    columns.foreach(_.reset())
  }
}

/** One column's writer; `index` is the row's position in the batch. */
sealed abstract class ColumnWriter {
  def vector: ValueVector
  def allocate(): Unit = { vector.allocateNew(); refresh() }
  /** Reads the buffers' addresses and capacity again (after an allocation). */
  private[arrow] def refresh(): Unit
  def write(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    if (input.isNullAt(ordinal)) writeNull(index) else writeValue(input, ordinal, index)
  def writeNull(index: Int): Unit
  protected def writeValue(input: SpecializedGetters, ordinal: Int, index: Int): Unit
  def finish(count: Int): Unit = vector.setValueCount(count)
  /** Empties the vector for the next batch: Arrow's reset zeroes its buffers in place (a
   * struct's, its fields' too), so the addresses stay. */
  final def reset(): Unit = { vector.reset(); emptied() }
  /** What the writer itself keeps about the vector's contents, forgotten. */
  private[arrow] def emptied(): Unit = ()
}

object ColumnWriter {
  /** The writer of a vector of a type this writer handles. */
  def of(vector: ValueVector): Option[ColumnWriter] = vector match {
    case v: BigIntVector => Some(new LongColumn(v))
    case v: TimeStampMicroTZVector => Some(new LongColumn(v))
    case v: TimeStampMicroVector => Some(new LongColumn(v))
    case v: IntVector => Some(new IntColumn(v))
    case v: DateDayVector => Some(new IntColumn(v))
    case v: SmallIntVector => Some(new ShortColumn(v))
    case v: TinyIntVector => Some(new ByteColumn(v))
    case v: Float8Vector => Some(new DoubleColumn(v))
    case v: Float4Vector => Some(new FloatColumn(v))
    case v: BitVector => Some(new BooleanColumn(v))
    case v: VarCharVector => Some(new BytesColumn(v, utf8 = true))
    case v: VarBinaryVector => Some(new BytesColumn(v, utf8 = false))
    case v: StructVector =>
      val children = (0 until v.size).map(i => of(v.getChildByOrdinal(i)))
      if (children.forall(_.isDefined)) Some(new StructColumn(v, children.map(_.get).toArray))
      else None
    case _ => None
  }

  @inline private[arrow] def setBit(address: Long, index: Int): Unit = {
    val at = address + (index >> 3)
    Platform.putByte(null, at, (Platform.getByte(null, at) | (1 << (index & 7))).toByte)
  }
}

/** A fixed-width vector: a value slot and a validity bit per row. */
sealed abstract class FixedColumn(val vector: BaseFixedWidthVector) extends ColumnWriter {
  protected var capacity = 0
  protected var validity = 0L
  protected var values = 0L

  private[arrow] def refresh(): Unit = {
    capacity = vector.getValueCapacity
    validity = vector.getValidityBufferAddress
    values = vector.getDataBufferAddress
  }

  @inline protected final def ensure(index: Int): Unit =
    if (index >= capacity) {
      while (index >= vector.getValueCapacity) vector.reAlloc()
      refresh()
    }

  // a null leaves its slot and bit as they are: zero, as after Arrow's setNull
  def writeNull(index: Int): Unit = ensure(index)

  protected def writeValue(input: SpecializedGetters, ordinal: Int, index: Int): Unit = {
    ensure(index)
    ColumnWriter.setBit(validity, index)
    put(input, ordinal, index)
  }

  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit
}

final class LongColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putLong(null, values + 8L * index, input.getLong(ordinal))
}

final class IntColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putInt(null, values + 4L * index, input.getInt(ordinal))
}

final class ShortColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putShort(null, values + 2L * index, input.getShort(ordinal))
}

final class ByteColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putByte(null, values + index, input.getByte(ordinal))
}

final class DoubleColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putDouble(null, values + 8L * index, input.getDouble(ordinal))
}

final class FloatColumn(v: BaseFixedWidthVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    Platform.putFloat(null, values + 4L * index, input.getFloat(ordinal))
}

/** Booleans are bits in the data buffer too. */
final class BooleanColumn(v: BitVector) extends FixedColumn(v) {
  protected def put(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    if (input.getBoolean(ordinal)) ColumnWriter.setBit(values, index)
}

/** Strings (UTF-8) and binary: offsets, validity, and the bytes copied from the row's
 * memory. `end` is where the next value's bytes start. */
final class BytesColumn(val vector: BaseVariableWidthVector, utf8: Boolean)
  extends ColumnWriter {
  private var capacity = 0
  private var byteCapacity = 0L
  private var validity = 0L
  private var offsets = 0L
  private var data = 0L
  private var end = 0

  private[arrow] def refresh(): Unit = {
    capacity = vector.getValueCapacity
    byteCapacity = vector.getDataBuffer.capacity
    validity = vector.getValidityBufferAddress
    offsets = vector.getOffsetBufferAddress
    data = vector.getDataBufferAddress
  }

  override private[arrow] def emptied(): Unit = end = 0

  private def ensure(index: Int, bytes: Int): Unit =
    if (index >= capacity || end.toLong + bytes > byteCapacity) {
      if (end.toLong + bytes > Int.MaxValue) {   // offsets are 32-bit, as with Arrow's setSafe
        throw new IllegalStateException(
          s"${vector.getField.getName}: over 2 GB of values in one Arrow batch")
      }
      while (index >= vector.getValueCapacity) vector.reallocValidityAndOffsetBuffers()
      if (end.toLong + bytes > vector.getDataBuffer.capacity) {
        vector.reallocDataBuffer(end.toLong + bytes)
      }
      refresh()
    }

  def writeNull(index: Int): Unit = {
    ensure(index, 0)
    Platform.putInt(null, offsets + 4L * (index + 1), end)
  }

  protected def writeValue(input: SpecializedGetters, ordinal: Int, index: Int): Unit =
    if (utf8) {
      val s = input.getUTF8String(ordinal)
      append(s.getBaseObject, s.getBaseOffset, s.numBytes, index)
    } else {
      val b = input.getBinary(ordinal)
      append(b, Platform.BYTE_ARRAY_OFFSET, b.length, index)
    }

  /** A value's bytes, from memory at (base, offset), as row `index`. */
  private def append(base: AnyRef, offset: Long, n: Int, index: Int): Unit = {
    ensure(index, n)
    Platform.copyMemory(base, offset, null, data + end, n)
    end += n
    ColumnWriter.setBit(validity, index)
    Platform.putInt(null, offsets + 4L * (index + 1), end)
  }

  override def finish(count: Int): Unit = {
    vector.setLastSet(count - 1)   // every offset up to count is written: no holes to fill
    vector.setValueCount(count)
  }
}

/** A struct: its validity bit, and its fields written at the same index (null fields when
 * the struct is null, as Spark's writer does). */
final class StructColumn(val vector: StructVector, children: Array[ColumnWriter])
  extends ColumnWriter {
  private[arrow] def refresh(): Unit = children.foreach(_.refresh())   // allocateNew: theirs too
  override private[arrow] def emptied(): Unit = children.foreach(_.emptied())

  def writeNull(index: Int): Unit = {
    vector.setNull(index)
    children.foreach(_.writeNull(index))
  }

  protected def writeValue(input: SpecializedGetters, ordinal: Int, index: Int): Unit = {
    vector.setIndexDefined(index)
    val struct = input.getStruct(ordinal, children.length)
    var i = 0
    while (i < children.length) {
      children(i).write(struct, i, index)
      i += 1
    }
  }

  override def finish(count: Int): Unit = {
    children.foreach(_.finish(count))
    vector.setValueCount(count)
  }

}
