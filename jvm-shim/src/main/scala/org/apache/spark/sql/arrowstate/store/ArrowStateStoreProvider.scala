package org.apache.spark.sql.arrowstate.store

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.{JObject, JString, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.NextIterator

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.exec.ArrowBatches
import org.apache.spark.sql.arrowstate.worker.{PythonStateWorkers, WorkerSettings}

/**
 * Spark's view of arrowstate state: a StateStoreProvider over arrowstate's files, so that
 * Spark's state readers (`statestore`, and what is built on them) read arrowstate
 * checkpoints as they read native ones. The rows come from a Python state worker, which
 * loads the version with the same verification as a task's load and hands it over in the
 * key and value schemas Spark records for the operator. Writing stays with arrowstate's
 * operators.
 *
 * A partition without arrowstate files is native state: everything goes to the provider
 * class the session's state store conf names (Spark's HDFS-backed one when that is this
 * class), so one provider serves checkpoints of either engine.
 */
class ArrowStateStoreProvider extends StateStoreProvider with SupportsFineGrainedReplay
  with Logging {
  private var id: StateStoreId = _
  private var keySchema: StructType = _
  private var valueSchema: StructType = _
  private var storeConf: StateStoreConf = _
  private var hadoopConf: Configuration = _
  /** transformWithState variables a reader registered (Spark's column families of them). */
  private val families = mutable.LinkedHashMap[String, ColumnFamily]()
  /** The native provider, for versions whose state is not arrowstate's (made on first use). */
  private var native: Option[StateStoreProvider] = None
  private var makeNative: () => StateStoreProvider = _

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    this.id = stateStoreId
    this.keySchema = keySchema
    this.valueSchema = valueSchema
    this.storeConf = storeConfs
    this.hadoopConf = hadoopConf
    makeNative = () => {
      val provider = StateStoreProvider.create(ArrowStateStoreProvider.nativeClass(storeConfs))
      provider.init(stateStoreId, keySchema, valueSchema, keyStateEncoderSpec,
        useColumnFamilies, storeConfs, hadoopConf, useMultipleValuesPerKey,
        stateSchemaProvider)
      provider
    }
  }

  /** Spark's provider when `version` of this partition is Spark's state, else None. */
  private def nativeFor(version: Long): Option[StateStoreProvider] =
    if (files.sparkOwns(version)) {
      if (native.isEmpty) native = Some(makeNative())
      native
    } else None

  private def files: StateFiles = new StateFiles(
    StateFiles.partitionDir(id.checkpointRootLocation, id.operatorId, id.partitionId),
    hadoopConf)

  // Spark's condition for an operation a store does not support
  private def readOnly(what: String): Nothing = throw new ArrowStateException(
    "STATE_STORE_UNSUPPORTED_OPERATION",
    Map("operationType" -> what, "entity" -> "ArrowStateStoreProvider"),
    s"$what operation not supported with ArrowStateStoreProvider: the state of $id is " +
      "written by arrowstate's operators only; this provider reads it")

  override def stateStoreId: StateStoreId = id

  override def close(): Unit = native.foreach(_.close())

  override def getStore(
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = nativeFor(version) match {
    case Some(p) => p.getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty)
    case None => readOnly("getStore")
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    nativeFor(version) match {
      case Some(p) => p.getReadStore(version, uniqueId)
      case None => new ArrowStateReadStore(id, version, keySchema, valueSchema, files,
        ArrowStateStoreProvider.workerSettings(storeConf), families,
        encoding = storeConf.stateStoreEncodingFormat)
    }

  override def upgradeReadStoreToWriteStore(
      readStore: ReadStateStore, version: Long, uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean): StateStore = nativeFor(version) match {
    case Some(p) => p.upgradeReadStoreToWriteStore(readStore, version, uniqueId,
      forceSnapshotOnCommit)
    case None => readOnly("upgradeReadStoreToWriteStore")
  }

  override def doMaintenance(): Unit = native.foreach(_.doMaintenance())

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] =
    native.map(_.supportedCustomMetrics).getOrElse(Nil)

  override def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] =
    native.map(_.supportedInstanceMetrics).getOrElse(Nil)

  private def nativeReplay(version: Long): Option[SupportsFineGrainedReplay] =
    nativeFor(version).map {
      case p: SupportsFineGrainedReplay => p
      case p => throw StateStoreErrors.stateStoreProviderDoesNotSupportFineGrainedReplay(
        p.getClass.getName)
    }

  override def replayStateFromSnapshot(
      snapshotVersion: Long, endVersion: Long, readOnly: Boolean,
      snapshotVersionStateStoreCkptId: Option[String],
      endVersionStateStoreCkptId: Option[String]): StateStore = nativeReplay(endVersion) match {
    case Some(p) => p.replayStateFromSnapshot(snapshotVersion, endVersion, readOnly,
      snapshotVersionStateStoreCkptId, endVersionStateStoreCkptId)
    case None => this.readOnly("replayStateFromSnapshot")
  }

  override def replayReadStateFromSnapshot(
      snapshotVersion: Long, endVersion: Long,
      snapshotVersionStateStoreCkptId: Option[String],
      endVersionStateStoreCkptId: Option[String]): ReadStateStore =
    nativeReplay(endVersion) match {
    case Some(p) => p.replayReadStateFromSnapshot(snapshotVersion, endVersion,
      snapshotVersionStateStoreCkptId, endVersionStateStoreCkptId)
    case None => new ArrowStateReadStore(id, endVersion, keySchema, valueSchema, files,
      ArrowStateStoreProvider.workerSettings(storeConf), families, Some(snapshotVersion),
      storeConf.stateStoreEncodingFormat)
  }

  override def getStateStoreChangeDataReader(
      startVersion: Long, endVersion: Long, colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String])
    : NextIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] =
    nativeReplay(endVersion) match {
    case Some(p) => p.getStateStoreChangeDataReader(startVersion, endVersion,
      colFamilyNameOpt, endVersionStateStoreCkptId)
    case None =>
      // a transformWithState variable: the reader made this provider in its family's
      // schemas (or registered the family)
      val family = colFamilyNameOpt.filter(_ != StateStore.DEFAULT_COL_FAMILY_NAME)
      val (keys, values) = family.flatMap(families.get)
        .map(f => (f.keySchema, f.valueSchema)).getOrElse((keySchema, valueSchema))
      val request = Seq[(String, JValue)]("version" -> endVersion,
        "changesFrom" -> startVersion,
        "stateEncoding" -> JString(storeConf.stateStoreEncodingFormat.toLowerCase)) ++
        family.map(name => "columnFamily" -> JString(name))
      val changes = new WorkerReadStream(id, files,
        ArrowStateStoreProvider.workerSettings(storeConf), keys, values, request: _*)({
          (row, key, value) =>
            val kind = row.getByte(2) match {   // state_data.FEED_*
              case 1 => RecordType.PUT_RECORD
              case 2 => RecordType.MERGE_RECORD
              case _ => RecordType.DELETE_RECORD
            }
            (kind, key, if (kind == RecordType.DELETE_RECORD) null else value,
              row.getLong(3) - 1)   // as Spark's: the batch id
        })
      new NextIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] {
        override protected def getNext() =
          if (changes.hasNext) changes.next() else { finished = true; null }
        override protected def close(): Unit = changes.close()
      }
  }
}

object ArrowStateStoreProvider {
  val ClassName: String = classOf[ArrowStateStoreProvider].getName

  /** The provider of native state: the class the store conf names, unless that is us. */
  def nativeClass(storeConf: StateStoreConf): String =
    storeConf.sqlConfs.get(SQLConf.STATE_STORE_PROVIDER_CLASS.key)
      .filter(_ != ClassName)
      .getOrElse(classOf[HDFSBackedStateStoreProvider].getName)

  def workerSettings(storeConf: StateStoreConf): WorkerSettings = {
    val conf = SQLConf.get
    WorkerSettings(
      affinityWaitMs = ArrowStateConf.long(conf, ArrowStateConf.AffinityWaitMs),
      idleTimeoutMs = ArrowStateConf.long(conf, ArrowStateConf.IdleTimeoutSeconds) * 1000,
      maintenanceIntervalMs = storeConf.maintenanceInterval)
  }
}

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
    encoding: String = "unsaferow") extends ReadStateStore with Logging {

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
      ("stateEncoding" -> encoding.toLowerCase)).obj ++ more
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
      ("valueSchema" -> valueSchema.json)
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
