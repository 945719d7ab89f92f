package org.apache.spark.sql.arrowstate.tools

import scala.collection.mutable

import org.json4s.JsonAST.{JObject, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType

import org.apache.spark.sql.arrowstate.arrow.ArrowBatches
import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.StateFiles
import org.apache.spark.sql.arrowstate.worker.{LocalStateDir, PythonStateWorkers, WorkerSettings}

/** A transformWithState variable as Spark's column family of it: its schemas, and whether
 * a key holds several values (a list). */
case class ColumnFamily(keySchema: StructType, valueSchema: StructType, multiValued: Boolean)

/**
 * One committed version of one partition, read through a Python state worker. The default
 * column family is the operator's rows; transformWithState's variables are the column
 * families a reader registers (`registerColFamily`, as Spark's `statestore` reader does
 * before it reads one), each read from the worker in that family's schemas.
 */
class ArrowStateReadStore(
    override val id: StateStoreId,
    override val version: Long,
    keySchema: StructType,
    valueSchema: StructType,
    files: StateFiles,
    settings: WorkerSettings,
    families: mutable.Map[String, ColumnFamily] = mutable.Map.empty,
    snapshot: Option[Long] = None,
    encoding: String = "unsaferow",
    checkpointId: Option[String] = None) extends ReadStateStore with Logging {

  private lazy val byKey: mutable.HashMap[UnsafeRow, UnsafeRow] = {
    val m = mutable.HashMap[UnsafeRow, UnsafeRow]()
    iterator().foreach(pair => m(pair.key) = pair.value)
    m
  }

  private def isDefault(colFamilyName: String): Boolean =
    colFamilyName == StateStore.DEFAULT_COL_FAMILY_NAME || {
      if (!families.contains(colFamilyName)) {
        throw new ArrowStateException("STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY",
          Map("operationType" -> "read", "colFamilyName" -> colFamilyName),
          s"State store operation=read not supported on missing column family=$colFamilyName " +
            s"(state $id)")
      }
      false
    }

  /** A column family's rows grouped by key (a list's values), read once when first asked. */
  private val grouped = mutable.HashMap[String, mutable.LinkedHashMap[UnsafeRow,
    mutable.ArrayBuffer[UnsafeRow]]]()

  private def groupedRows(colFamilyName: String) = grouped.getOrElseUpdate(colFamilyName, {
    val m = mutable.LinkedHashMap[UnsafeRow, mutable.ArrayBuffer[UnsafeRow]]()
    familyRows(colFamilyName).foreach { pair =>
      m.getOrElseUpdate(pair.key, mutable.ArrayBuffer()) += pair.value
    }
    m
  })

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow =
    if (isDefault(colFamilyName)) byKey.get(key).orNull
    else groupedRows(colFamilyName).get(key).map(_.head).orNull

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] =
    if (isDefault(colFamilyName)) Option(get(key, colFamilyName)).iterator
    else groupedRows(colFamilyName).get(key).map(_.iterator).getOrElse(Iterator.empty)

  override def registerColFamily(
      colFamilyName: String, keySchema: StructType, valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec, useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit =
    families(colFamilyName) = ColumnFamily(keySchema, valueSchema, useMultipleValuesPerKey)

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String)
    : StateStoreIterator[UnsafeRowPair] =
    throw new ArrowStateException("STATE_STORE_UNSUPPORTED_OPERATION",
      Map("operationType" -> "prefixScan", "entity" -> "ArrowStateStoreProvider"),
      "prefixScan operation not supported with ArrowStateStoreProvider")

  override def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String)
    : StateStoreIterator[UnsafeRowPair] = prefixScan(prefixKey, colFamilyName)

  override def iteratorWithMultiValues(colFamilyName: String)
    : StateStoreIterator[UnsafeRowPair] =
    if (isDefault(colFamilyName)) iterator(colFamilyName) else familyRows(colFamilyName)

  override def allColumnFamilyNames: Set[String] =
    families.keySet.toSet + StateStore.DEFAULT_COL_FAMILY_NAME

  override def abort(): Unit = ()

  override def release(): Unit = ()

  /** Every row of the version, streamed batch by batch from the worker; of a list, each
   * key once (with its first value: `valuesIterator` gives them all), as Spark's stores. */
  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    if (isDefault(colFamilyName)) pairs(keySchema, valueSchema)
    else if (families(colFamilyName).multiValued) {
      new StateStoreIterator[UnsafeRowPair](groupedRows(colFamilyName).iterator.map {
        case (key, values) => new UnsafeRowPair(key, values.head)
      })
    } else familyRows(colFamilyName)

  private def familyRows(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    val family = families(colFamilyName)
    pairs(family.keySchema, family.valueSchema, "columnFamily" -> colFamilyName)
  }

  /** The version's rows from a worker, in these schemas (`more`: the request's extras). */
  private def pairs(keys: StructType, values: StructType, more: (String, JValue)*)
    : StateStoreIterator[UnsafeRowPair] = {
    val request = (("version" -> version) ~ ("snapshot" -> snapshot) ~
      ("stateEncoding" -> encoding.toLowerCase) ~ ("checkpointId" -> checkpointId)).obj ++ more
    val rows = new WorkerReadStream(id, files, settings, keys, values, request: _*)(
      (_, key, value) => new UnsafeRowPair(key, value))
    new StateStoreIterator[UnsafeRowPair](rows, () => rows.close())
  }
}

/**
 * A READ_STATE request to a borrowed Python state worker and its answer, batch by batch:
 * each row (key struct, value struct, then any further columns) becomes a T through
 * `make`, given the row and its key and value as UnsafeRows. The worker goes back to the
 * pool after the whole answer; one left mid-answer is stopped.
 */
class WorkerReadStream[T](
    id: StateStoreId, files: StateFiles, settings: WorkerSettings, keySchema: StructType,
    valueSchema: StructType, fields: (String, JValue)*)(
    make: (InternalRow, UnsafeRow, UnsafeRow) => T) extends Iterator[T] {
  private val worker = PythonStateWorkers.borrowAny(settings)
  private var finished = false
  private var current: Iterator[T] = Iterator.empty
  private val keyProjection = UnsafeProjection.create(keySchema)
  private val valueProjection = UnsafeProjection.create(valueSchema)

  guarded {
    val request: JObject = JObject(fields.toList) ~
      ("where" -> files.dir.toString) ~
      ("context" -> s"operator ${id.operatorId}, partition ${id.partitionId}") ~
      ("keySchema" -> keySchema.json) ~
      ("valueSchema" -> valueSchema.json) ~
      // where a large file the worker reads goes (its tasks' local directory)
      ("localDir" -> LocalStateDir.path(ArrowStateConf.get(SQLConf.get, ArrowStateConf.LocalDir))) ~
      ("fileMemoryBytes" -> ArrowStateConf.long(SQLConf.get, ArrowStateConf.FileMemoryBytes))
    worker.requestState(request)
  }

  private def guarded[A](body: => A): A =
    try body catch {
      case e: Throwable =>
        close()
        throw e
    }

  private def fetch(): Unit = guarded {
    val answer = worker.serveFilesUntil(Contract.Frame.End, files)
    if (answer.isEmpty) {
      finished = true
      PythonStateWorkers.giveBack(worker)
    } else {
      val batch = answer.get
      val out = Array.newBuilder[Any]
      ArrowBatches.foreachRow(batch, -1) { row =>
        val key = keyProjection(row.getStruct(0, keySchema.length)).copy()
        val value = if (row.isNullAt(1)) null  // a removal in a change feed
          else valueProjection(row.getStruct(1, valueSchema.length)).copy()
        out += make(row, key, value)
      }
      current = out.result().iterator.asInstanceOf[Iterator[T]]
    }
  }

  override def hasNext: Boolean = {
    while (!current.hasNext && !finished) fetch()
    current.hasNext
  }

  override def next(): T = {
    if (!hasNext) throw new NoSuchElementException
    current.next()
  }

  def close(): Unit = if (!finished) {
    finished = true
    PythonStateWorkers.destroy(worker)
  }
}
