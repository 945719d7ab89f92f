package org.apache.spark.sql.arrowstate.tools

import java.io.DataOutputStream
import java.util.UUID

import org.json4s.JValue
import org.json4s.JsonDSL._

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.SparkEnv
import org.apache.spark.SparkException
import org.apache.spark.io.CompressionCodec
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.state.{HDFSBackedStateStoreProvider, KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, OperatorStateMetadataV1Reader, PrefixKeyScanStateEncoderSpec, StateStore, StateStoreConf, StateStoreId, StateStoreProvider, StateStoreProviderId, UnsafeRowPair}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{DataType, NullType, StructField, StructType}
import org.apache.spark.util.SerializableConfiguration

import org.apache.spark.sql.arrowstate.arrow.ArrowBatchEncoder
import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.{CheckpointIds, CheckpointLineage, StateFiles}
import org.apache.spark.sql.arrowstate.worker.{PythonStateWorkers, WorkerSettings}

/**
 * Converts state between the engines, per operator and partition, at the newest committed
 * version: `python -m arrowstate state export` and `import`.
 *
 * Export: per partition, the rows of the newest committed version, read
 * through a Python state worker (verified as a task's load), are written as that version's
 * `<v>.snapshot`, in the format HDFSBackedStateStoreProvider writes and loads (its
 * compression codec; per row the key's and the value's UnsafeRow bytes, each after its
 * length; -1 at the end). The file is written atomically; arrowstate's own files are left
 * for the caller to move away once every partition is written.
 */
object StateConversion {
  /**
   * The state tools' one entry point (py4j): converts `version` of every partition of one
   * operator, `direction` "export" (arrowstate's state to the format of Spark's
   * `providerClass`) or "import" (Spark's `providerClass` state to arrowstate's, timestamps
   * in `timeZone`); the rows per partition.
   */
  def convertOperator(
      direction: String,
      session: SparkSession,
      stateRoot: String,
      operatorId: Long,
      partitions: Int,
      version: Long,
      keySchemaJson: String,
      valueSchemaJson: String,
      providerClass: String,
      timeZone: String): Array[Long] = {
    val (keySchema, valueSchema) = (schema(keySchemaJson), schema(valueSchemaJson))
    // a checkpoint whose commit log names ids is of format v2 (the offset log does not say):
    // Spark's store reads a version by its id only when its conf says so
    val committedIds = if (direction != "import") Nil else CheckpointLineage.committedIds(
      stateRoot, operatorId, version, session.sessionState.newHadoopConf())
    val formatV2 = committedIds.exists(_.isDefined)
    val storeConf = storeConfWith(session.sessionState.conf, providerClass,
      sqlSettings = if (formatV2) Map(SQLConf.STATE_STORE_CHECKPOINT_FORMAT_VERSION.key -> "2")
                    else Map.empty)
    val settings = ArrowStateStoreProvider.workerSettings(storeConf)
    direction match {
      // export: per partition holding arrowstate's state, its rows in the format of Spark's
      // provider. HDFS-backed: that version's `<v>.snapshot`. Another (RocksDB): a fresh
      // store of the provider, committed as that version with a snapshot, as Spark's offline
      // repartition writes its state.
      case "export" =>
        val hdfs = providerClass == classOf[HDFSBackedStateStoreProvider].getName
        perPartition(session, partitions) { (partition, conf) =>
          val dir = StateFiles.partitionDir(stateRoot, operatorId, partition)
          val files = new StateFiles(dir, conf)
          if (!files.holdsArrowState) 0L else {
            val id = StateStoreId(stateRoot, operatorId, partition)
            val rows = new ArrowStateReadStore(id, version, keySchema, valueSchema, files,
              settings).iterator()
            try {
              if (hdfs) writeHdfsSnapshot(dir, version, rows, storeConf, conf)
              else writeThroughProvider(id, version, keySchema, valueSchema, rows, storeConf,
                conf)
            } finally rows.close()
          }
        }
      // import: per partition, `<version>.arrowstate.snapshot` of what Spark's store holds at
      // that version (rows to a Python state worker in Spark's schemas, as Arrow with the
      // query's time zone; it lays them out as the family's columns). Under checkpoint format
      // v2, the version the commit log names (read with its id) and the snapshot named with
      // that id, the lineage the query's next batch loads from
      case "import" =>
        val rowsPerBatch = batchSize(session.sessionState.conf)
        perPartition(session, partitions) { (partition, conf) =>
          val id = committedIds.lift(partition).flatten
          importPartition(StateStoreId(stateRoot, operatorId, partition), version, id, id,
            keySchema, valueSchema, storeConf, conf, settings, timeZone, rowsPerBatch)
        }
      case other => throw SparkException.internalError(
        s"arrowstate: no state conversion '$other' (export or import)")
    }
  }

  private def writeHdfsSnapshot(dir: Path, version: Long, rows: Iterator[UnsafeRowPair],
      storeConf: StateStoreConf, conf: Configuration): Long = {
    val fm = CheckpointFileManager.create(dir, conf)
    val raw = fm.createAtomic(new Path(dir, s"$version.snapshot"), true)
    var count = 0L
    try {
      val out = new DataOutputStream(CompressionCodec.createCodec(SparkEnv.get.conf,
        storeConf.compressionCodec).compressedOutputStream(raw))
      rows.foreach { pair =>
        val key = pair.key.getBytes
        val value = pair.value.getBytes
        out.writeInt(key.length)
        out.write(key)
        out.writeInt(value.length)
        out.write(value)
        count += 1
      }
      out.writeInt(-1)
      out.close()
    } catch {
      case e: Throwable =>
        raw.cancel()
        throw e
    }
    count
  }

  private def writeThroughProvider(id: StateStoreId, version: Long, keySchema: StructType,
      valueSchema: StructType, rows: Iterator[UnsafeRowPair], storeConf: StateStoreConf,
      conf: Configuration): Long = {
    writeFreshVersion(sparkProvider(id, keySchema, valueSchema, storeConf, conf), version) {
      store =>
        var count = 0L
        rows.foreach { pair =>
          store.put(pair.key, pair.value)
          count += 1
        }
        count
    }
  }

  /** A fresh store of `provider`, empty at `version` - 1, filled by `fill` and committed as
   * `version`, snapshot included (nothing is committed if `fill` fails); what `fill` gives.
   * The provider is closed after. */
  def writeFreshVersion(provider: StateStoreProvider, version: Long)(
      fill: StateStore => Long): Long = {
    try {
      val store = provider.getStore(version - 1, None, forceSnapshotOnCommit = true,
        loadEmpty = true)
      try {
        val written = fill(store)
        store.commit()
        written
      } finally if (!store.hasCommitted) store.abort()
    } finally provider.close()
  }

  /** The provider `storeConf` names, for one partition of an operator's default store. */
  private def sparkProvider(id: StateStoreId, keySchema: StructType, valueSchema: StructType,
      storeConf: StateStoreConf, conf: Configuration): StateStoreProvider =
    StateStoreProvider.createAndInit(StateStoreProviderId(id, UUID.randomUUID()), keySchema,
      valueSchema, keyEncoderSpec(id, keySchema, conf), false, storeConf, conf, false, None)

  /**
   * How the operator's store encodes its keys: a store scanned by a key prefix (session
   * windows: the keys without the session start) encodes them differently (RocksDB lays out
   * the prefix first), so it is read and written with the prefix spec Spark's operator uses.
   */
  private def keyEncoderSpec(id: StateStoreId, keySchema: StructType, conf: Configuration)
    : KeyStateEncoderSpec = {
    val prefixColumns = prefixColumnsOf(id, conf)
    if (prefixColumns > 0) PrefixKeyScanStateEncoderSpec(keySchema, prefixColumns)
    else NoPrefixKeyStateEncoderSpec(keySchema)
  }

  /** The key columns the operator's store is scanned by (its rows partitioned by), as its
   * operator metadata records them; 0 for none (also without metadata: older checkpoints). */
  private def prefixColumnsOf(id: StateStoreId, conf: Configuration): Int = {
    val operatorDir = new Path(id.checkpointRootLocation, id.operatorId.toString)
    val metadata = new Path(new Path(operatorDir, "_metadata"), "metadata")
    if (!metadata.getFileSystem(conf).exists(metadata)) 0
    else new OperatorStateMetadataV1Reader(operatorDir, conf).read().toSeq
      .flatMap(_.stateStoresMetadata).find(_.storeName == id.storeName)
      .map(_.numColsPrefixKey).getOrElse(0)
  }

  /** `f` for each partition in a Spark job, with the session's Hadoop configuration. */
  private def perPartition(session: SparkSession, partitions: Int)(
      f: (Int, Configuration) => Long): Array[Long] = {
    val hadoopConf = broadcastHadoopConf(session)
    session.sparkContext.parallelize(0 until partitions, partitions)
      .map(partition => f(partition, hadoopConf.value.value)).collect()
  }

  private def broadcastHadoopConf(session: SparkSession) = session.sparkContext.broadcast(
    new SerializableConfiguration(session.sessionState.newHadoopConf()))

  /** Rows per Arrow batch sent to a worker: Spark's setting for Python's Arrow batches. */
  private def batchSize(conf: SQLConf): Int = math.max(1, conf.arrowMaxRecordsPerBatch)

  private def schema(json: String): StructType =
    DataType.fromJson(json).asInstanceOf[StructType]

  /** One partition of an import; also how an arrowstate operator adopts Spark's state
   * on its first load. `readId`: the checkpoint id Spark's store committed the version with
   * (format v2); `snapshotId`: the one the snapshot is named with (none: format v1's name). */
  def importPartition(
      id: StateStoreId,
      version: Long,
      readId: Option[String],
      snapshotId: Option[String],
      keySchema: StructType,
      valueSchema: StructType,
      storeConf: StateStoreConf,
      conf: Configuration,
      settings: WorkerSettings,
      timeZone: String,
      batchSize: Int): Long = {
    val provider = sparkProvider(id, keySchema, valueSchema, storeConf, conf)
    try {
      val store = provider.getReadStore(version, readId)
      try {
        writeSnapshot(id, version, snapshotId, keySchema, valueSchema,
          store.iterator().map(pair => InternalRow(pair.key, pair.value)), conf, settings,
          timeZone, batchSize)
      } finally store.abort()
    } finally provider.close()
  }

  /**
   * Writes `<version>.arrowstate.snapshot` of one partition (`<version>_<checkpointId>...`
   * with a checkpoint id, which it carries as its unique id) holding `rows` (each a key
   * struct and a value struct in Spark's schemas): they go to a Python state worker as
   * Arrow (with the query's session time zone), which lays them out as the family's
   * columns and encodes the snapshot. The rows written.
   */
  private def writeSnapshot(
      id: StateStoreId,
      version: Long,
      checkpointId: Option[String],
      keySchema: StructType,
      valueSchema: StructType,
      rows: Iterator[InternalRow],
      conf: Configuration,
      settings: WorkerSettings,
      timeZone: String,
      batchSize: Int): Long = {
    val encoder = new ArrowBatchEncoder(
      StructType(Seq(StructField("key", keySchema), StructField("value", valueSchema))),
      timeZone)
    val request: JValue = ("version" -> version) ~ ("valueSchema" -> valueSchema.json) ~
      ("fileChunkBytes" -> ArrowStateConf.fileChunkBytes(SQLConf.get)) ~
      ("checkpointId" -> checkpointId)
    val worker = PythonStateWorkers.borrowAny(settings)
    var done = false
    var count = 0L
    try {
      worker.beginImport(request, encoder.schemaIpc)
      var inBatch = 0
      def send(): Unit = {
        worker.sendBatch(Contract.Frame.Data, encoder.finishBatch(), flush = false)
        inBatch = 0
      }
      rows.foreach { row =>
        encoder.append(row)
        inBatch += 1
        count += 1
        if (inBatch == batchSize) send()
      }
      if (inBatch > 0) send()
      val files = new StateFiles(StateFiles.partitionDir(id.checkpointRootLocation,
        id.operatorId, id.partitionId), conf)
      val name = checkpointId.fold(s"$version")(c => s"${version}_$c")
      worker.readImportedSnapshot(files.write(s"$name${StateFiles.SnapshotSuffix}", _))
      done = true
      PythonStateWorkers.giveBack(worker)
      count
    } finally {
      if (!done) PythonStateWorkers.destroy(worker)
      encoder.close()
    }
  }

  /**
   * Offline repartition of one arrowstate operator (`python -m arrowstate state
   * repartition`): `rows` (Spark's `statestore` reader's key and value columns at the last
   * committed batch) are hash-partitioned into `partitions` by the key, where the
   * operator's HashPartitioning puts them, and each new partition's rows become its
   * arrowstate snapshot of `version`. The rows per partition.
   */
  def repartitionOperator(
      session: SparkSession,
      rows: org.apache.spark.sql.DataFrame,
      stateRoot: String,
      operatorId: Long,
      partitions: Int,
      version: Long,
      keySchemaJson: String,
      valueSchemaJson: String,
      timeZone: String): Array[Long] = {
    val (keySchema, valueSchema) = (schema(keySchemaJson), schema(valueSchemaJson))
    val settings = ArrowStateStoreProvider.workerSettings(
      new StateStoreConf(session.sessionState.conf))
    val rowsPerBatch = batchSize(session.sessionState.conf)
    val hadoopConf = broadcastHadoopConf(session)
    val (k, v) = (keySchema.length, valueSchema.length)
    // the operator partitions its rows by the keys its store is scanned by, if it is (session
    // windows: without the session start), else by the whole key
    val prefixColumns = prefixColumnsOf(StateStoreId(stateRoot, operatorId, 0),
      session.sessionState.newHadoopConf())
    val partitionBy =
      if (prefixColumns == 0) Seq(rows.col("key"))
      else keySchema.fieldNames.take(prefixColumns).map(rows.col("key").getField).toSeq
    rows.repartition(partitions, partitionBy: _*).select("key", "value")
      .queryExecution.toRdd.mapPartitionsWithIndex { (partition, it) =>
        Iterator(writeSnapshot(StateStoreId(stateRoot, operatorId, partition), version, None,
          keySchema, valueSchema, it.map(r => InternalRow(r.getStruct(0, k), r.getStruct(1, v))),
          hadoopConf.value.value, settings, timeZone, rowsPerBatch))
      }.collect()
  }

  /** The state store conf of `sqlConf` (a task's conf is read-only) with another provider. */
  private def storeConfWith(sqlConf: SQLConf, providerClass: String,
      extraOptions: Map[String, String] = Map.empty,
      sqlSettings: Map[String, String] = Map.empty): StateStoreConf = {
    val conf = new SQLConf
    sqlConf.getAllConfs.foreach { case (k, v) => conf.setConfString(k, v) }
    conf.setConfString(SQLConf.STATE_STORE_PROVIDER_CLASS.key, providerClass)
    sqlSettings.foreach { case (k, v) => conf.setConfString(k, v) }
    new StateStoreConf(conf, extraOptions)
  }

  /** The key and value schemas of a state schema file (format v1 or v2). */
  def readSchemaFile(path: Path, conf: Configuration): (StructType, StructType) = {
    val in = new java.io.DataInputStream(path.getFileSystem(conf).open(path))
    try {
      val version = in.readUTF()
      if (version != "v1" && version != "v2") {
        throw new ArrowStateException("STDS_FAILED_TO_READ_STATE_SCHEMA",
          Map("sourceOptions" -> path.toString),
          s"Failed to read the state schema: $path has format $version (v1 and v2 are read)")
      }
      def nextSchema(): StructType = schema(
        if (version == "v1") in.readUTF() else Seq.fill(in.readInt())(in.readUTF()).mkString)
      val key = nextSchema()
      (key, nextSchema())
    } finally in.close()
  }

  /** The deduplicate family's name, checked against contract.json on first use (the families
   * sit above tools: an operator's first load comes here). */
  private lazy val Deduplicate: String = Contract.family("deduplicate").name

  /**
   * An arrowstate operator's first load of a partition whose state at the loaded version is
   * Spark's own (a checkpoint of Spark's operators, or Spark's offline repartition of an
   * arrowstate checkpoint): that state becomes arrowstate's (one snapshot), once. The rows
   * converted (0 when there was nothing to adopt).
   */
  def adoptIfSparkState(
      family: String, info: StatefulOperatorStateInfo, partitionId: Int, files: StateFiles,
      conf: Configuration, settings: WorkerSettings, timeZone: String): Long = {
    // sparkOwns lists only arrowstate's files once the partition is arrowstate's
    if (info.storeVersion == 0 || !files.sparkOwns(info.storeVersion) ||
      !files.holdsSparkState) return 0L
    val sqlConf = SQLConf.get
    val schemaFile = new Path(new Path(StateFiles.partitionDir(info.checkpointLocation,
      info.operatorId, 0), "_metadata"), "schema")
    val (keySchema, fileValueSchema) = readSchemaFile(schemaFile, conf)
    // Spark's dedup reads its value as the empty row it always stored, whatever schema the
    // checkpoint records (before 3.3.1 it recorded every input column: SPARK-39650), and
    // does not check it (only dedup within the watermark keeps a value, its expiry)
    val plainDedup = family == Deduplicate &&
      !fileValueSchema.fieldNames.sameElements(Seq("expiresAtMicros"))
    val valueSchema =
      if (plainDedup) StructType(Array(StructField("__dummy__", NullType))) else fileValueSchema
    val storeConf = storeConfWith(sqlConf,
      ArrowStateStoreProvider.nativeClass(new StateStoreConf(sqlConf)),
      if (plainDedup) Map(StateStoreConf.FORMAT_VALIDATION_CHECK_VALUE_CONFIG -> "false")
      else Map.empty)
    // under format v2, the version the commit log names, read with its id; the snapshot
    // keeps format v1's name, which this task's worker loads (CheckpointIds' checkedBase)
    importPartition(StateStoreId(info.checkpointLocation, info.operatorId, partitionId),
      info.storeVersion, CheckpointIds.committedBase(info, partitionId), None, keySchema,
      valueSchema, storeConf, conf, settings, timeZone, batchSize(sqlConf))
  }
}
