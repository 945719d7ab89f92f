package org.apache.spark.sql.arrowstate.tools

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.json4s.JsonAST.{JString, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.NextIterator

import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.{CheckpointLineage, StateFiles}
import org.apache.spark.sql.arrowstate.worker.WorkerSettings

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

  /** The checkpoint id of `version` (format v2): the one the reader hands on, else the
   * commit log's where the partition's files carry ids (a reader that hands none on). */
  private def committedId(version: Long, given: Option[String]): Option[String] =
    given.orElse {
      if (!files.names().exists(n => StateFiles.versionOf(n).contains(version) &&
          StateFiles.hasCheckpointId(n))) None
      else CheckpointLineage.committedId(id.checkpointRootLocation, id.operatorId,
        id.partitionId, version, hadoopConf)
    }

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
        encoding = storeConf.stateStoreEncodingFormat, checkpointId = committedId(version, uniqueId))
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
      storeConf.stateStoreEncodingFormat, committedId(endVersion, endVersionStateStoreCkptId))
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
        family.map(name => "columnFamily" -> JString(name)) ++
        committedId(endVersion, endVersionStateStoreCkptId).map(id => "checkpointId" -> JString(id))
      val changes = new WorkerReadStream(id, files,
        ArrowStateStoreProvider.workerSettings(storeConf), keys, values, request: _*)({
          (row, key, value) =>
            val kind = row.getByte(2) match {   // spark_state.transform_with_state.FEED_*
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
