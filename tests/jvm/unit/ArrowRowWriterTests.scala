package org.apache.spark.sql.arrowstate.unit

import java.io.ByteArrayOutputStream
import java.nio.channels.Channels

import scala.util.Random

import org.apache.arrow.vector.VectorSchemaRoot
import org.apache.arrow.vector.ipc.ArrowStreamWriter

import org.apache.spark.sql.arrowstate.arrow.{ArrowRowWriter, RowsIntoArrow}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeProjection}
import org.apache.spark.sql.execution.arrow.ArrowWriter
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.ArrowUtils
import org.apache.spark.unsafe.types.UTF8String

/** arrowstate's row writer leaves in Arrow's vectors the bytes Spark's ArrowWriter leaves:
 * the same Arrow IPC stream for the same rows, batch after batch in reused vectors. */
object ArrowRowWriterTests extends UnitTests {
  private val window = StructType(Seq(StructField("start", TimestampType),
    StructField("end", TimestampType), StructField("label", StringType)))
  private val written = StructType(Seq(
    StructField("l", LongType), StructField("i", IntegerType), StructField("s", ShortType),
    StructField("b", ByteType), StructField("d", DoubleType), StructField("f", FloatType),
    StructField("flag", BooleanType), StructField("day", DateType),
    StructField("ts", TimestampType), StructField("ntz", TimestampNTZType),
    StructField("text", StringType), StructField("bytes", BinaryType),
    StructField("window", window),
    StructField("nested", StructType(Seq(StructField("w", window), StructField("n", LongType))))))

  private val texts = Array("", "a", "é", "日本語のテキスト", "x" * 300, "\u0000", "🙂 emoji")

  private def value(dt: DataType, r: Random): Any = if (r.nextInt(5) == 0) null else dt match {
    case LongType | TimestampType | TimestampNTZType =>
      Array(Long.MinValue, Long.MaxValue, 0L, -1L, r.nextLong())(r.nextInt(5))
    case IntegerType | DateType => Array(Int.MinValue, Int.MaxValue, 0, r.nextInt())(r.nextInt(4))
    case ShortType => r.nextInt().toShort
    case ByteType => r.nextInt().toByte
    case DoubleType => Array(Double.NaN, -0.0, 0.0, Double.MaxValue, r.nextGaussian())(r.nextInt(5))
    case FloatType => Array(Float.NaN, -0.0f, Float.MinValue, r.nextFloat())(r.nextInt(4))
    case BooleanType => r.nextBoolean()
    case StringType => UTF8String.fromString(texts(r.nextInt(texts.length)) + r.nextInt(9))
    case BinaryType => Array.fill(r.nextInt(40))(r.nextInt().toByte)
    case s: StructType => new GenericInternalRow(s.fields.map(f => value(f.dataType, r)))
  }

  private def rows(schema: StructType, n: Int, seed: Int): Seq[InternalRow] = {
    val r = new Random(seed)
    Seq.fill(n)(new GenericInternalRow(schema.fields.map(f => value(f.dataType, r))))
  }

  private def ipc(root: VectorSchemaRoot): Seq[Byte] = {
    val bytes = new ByteArrayOutputStream()
    val w = new ArrowStreamWriter(root, null, Channels.newChannel(bytes))
    w.start(); w.writeBatch(); w.end()
    bytes.toByteArray.toSeq
  }

  /** Each batch of rows written by both writers, in their own reused vectors: the IPC
   * streams of each batch, both writers' (arrowstate's, Spark's). */
  private def bothStreams(schema: StructType, batches: Seq[Seq[InternalRow]])
    : Seq[(Seq[Byte], Seq[Byte])] = {
    val arrowSchema = ArrowUtils.toArrowSchema(schema, "UTC", false, false)
    val ours = VectorSchemaRoot.create(arrowSchema, ArrowUtils.rootAllocator)
    val theirs = VectorSchemaRoot.create(arrowSchema, ArrowUtils.rootAllocator)
    try {
      val fast = RowsIntoArrow(ours)
      val spark = ArrowWriter.create(theirs)
      batches.map { batch =>
        batch.foreach { row => fast.write(row); spark.write(row) }
        fast.finish(); spark.finish()
        val pair = (ipc(ours), ipc(theirs))
        fast.reset(); spark.reset()
        pair
      }
    } finally { ours.close(); theirs.close() }
  }

  private def assertSameStreams(schema: StructType, batches: Seq[Seq[InternalRow]]): Unit =
    bothStreams(schema, batches).zipWithIndex.foreach { case ((ours, theirs), i) =>
      assertTrue(ours == theirs, s"batch $i of ${batches(i).size} rows: ${ours.size} bytes " +
        s"against Spark's ${theirs.size}, first difference at byte " +
        ours.zip(theirs).indexWhere { case (a, b) => a != b })
    }

  test("every supported type, nulls included, as Spark writes it, batch after batch") {
    // 20,000 rows grow every buffer past Arrow's first allocation; later batches reuse them
    assertSameStreams(written,
      Seq(rows(written, 20000, 1), rows(written, 3, 2), Seq.empty, rows(written, 5000, 3)))
  }

  test("rows in Spark's UnsafeRow form, as they come from a shuffle or a sort") {
    val project = UnsafeProjection.create(written)
    val unsafe = rows(written, 6000, 4).map(r => project(r).copy())
    assertSameStreams(written, Seq(unsafe, unsafe.take(10)))
  }

  test("a column of all nulls and a batch whose strings outgrow the first data buffer") {
    val schema = StructType(Seq(StructField("text", StringType), StructField("n", LongType)))
    val big = UTF8String.fromString("y" * 100000)
    val batch = Seq.tabulate(300)(i =>
      new GenericInternalRow(Array[Any](if (i % 3 == 0) null else big, null)))
    assertSameStreams(schema, Seq(batch, batch.take(1)))
  }

  test("types it does not write go to Spark's writer") {
    def kind(dt: DataType): Boolean = {
      val schema = StructType(Seq(StructField("k", LongType), StructField("v", dt)))
      val root = VectorSchemaRoot.create(
        ArrowUtils.toArrowSchema(schema, "UTC", false, false), ArrowUtils.rootAllocator)
      try RowsIntoArrow(root).isInstanceOf[ArrowRowWriter] finally root.close()
    }
    assertTrue(kind(written), "the supported types take arrowstate's writer")
    assertTrue(!kind(DecimalType(10, 2)) && !kind(ArrayType(LongType)) &&
      !kind(MapType(StringType, LongType)) && !kind(StructType(Seq(
        StructField("d", DecimalType(38, 0))))), "decimals, arrays, maps take Spark's")
    val schema = StructType(Seq(StructField("d", DecimalType(10, 2)),
      StructField("a", ArrayType(StringType))))
    val decimals = Seq.tabulate(50)(i => new GenericInternalRow(Array[Any](
      if (i % 4 == 0) null else org.apache.spark.sql.types.Decimal(i * 1.25),
      org.apache.spark.sql.catalyst.util.ArrayData.toArrayData(
        Array(UTF8String.fromString(s"e$i"))))))
    assertSameStreams(schema, Seq(decimals))
  }
}
