package org.apache.spark.sql.arrowstate.exec

import org.json4s.JsonAST.{JBool, JLong, JNull, JObject, JString, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.broadcast.Broadcast
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.SerializableConfiguration

import org.apache.spark.sql.arrowstate.arrow.ArrowBatchEncoder
import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, CheckedJson, Contract}
import org.apache.spark.sql.arrowstate.store.{CheckpointIds, StateFiles}
import org.apache.spark.sql.arrowstate.tools.StateConversion
import org.apache.spark.sql.arrowstate.worker.{CommittedPartitions, FunctionEnvironment,
  StateExchange, StateHeader, WorkerSettings}

/**
 * Made on the driver: opens a task's exchange with the Python worker for one partition of an
 * operator's state (header, the schema of the rows sent, the version to update).
 */
case class StatePartitionOpener(
    family: String,
    info: StatefulOperatorStateInfo,
    operator: JValue,
    storeConf: Map[String, JValue],
    localDir: String,
    workerSettings: WorkerSettings,
    sentSchema: StructType,
    timeZone: String,
    hadoopConf: Broadcast[SerializableConfiguration],
    checkpointIdsEnabled: Boolean) {

  /** The opener of a node running in `mode`: the mode's fields in the operator payload. */
  def in(mode: TriggerMode): StatePartitionOpener = (operator, mode.operatorFields) match {
    case (JObject(fields), JObject(added)) if added.nonEmpty =>
      val names = added.map(_._1).toSet
      copy(operator = JObject(fields.filterNot(f => names(f._1)) ++ added))
    case _ => this
  }

  /** What every task of this operator in this micro-batch shares (the `operatorRun`
   * payload): checked and rendered once, on the driver (StateTasks.rdd reads it there). */
  lazy val run: CheckedJson = new CheckedJson("operatorRun",
    ("family" -> family) ~ ("queryRunId" -> info.queryRunId.toString) ~
      ("operatorId" -> info.operatorId) ~ ("conf" -> storeConf) ~ ("operator" -> operator))

  def open(partitionId: Int): StateExchange = {
    val dir = StateFiles.partitionDir(info.checkpointLocation, info.operatorId, partitionId)
    val files = new StateFiles(dir, hadoopConf.value.value)
    StateExchange.forTask(dir.toString, files,
        ArrowStateRDD.providerId(info, partitionId), workerSettings) { exchange =>
      // a checkpoint written by Spark's own operators continues here: its state becomes
      // arrowstate's on this first load (a partition this executor has committed in this
      // query run is arrowstate's: its directory need not be listed again to ask)
      if (!CommittedPartitions.contains(ArrowStateRDD.providerId(info, partitionId))) {
        exchange.adoptedRows = StateConversion.adoptIfSparkState(family, info, partitionId,
          files, hadoopConf.value.value, workerSettings.copy(owner = None, function = None),
          timeZone)
      }
      exchange.checkpointIds = CheckpointIds.forTask(info, partitionId, checkpointIdsEnabled,
        adopted = exchange.adoptedRows > 0)
      val encoder = new ArrowBatchEncoder(sentSchema, timeZone)
      try {
        exchange.begin(
          StateHeader(info, partitionId, dir.toString, exchange.staleKeysToDrop,
            // pyspark's TaskContext, for user code only: its local properties (every SQL
            // setting of a streaming query's session) are kilobytes a task
            if (Contract.family(family).userCode) TaskEnvironment.current() else JNull,
            exchange.checkpointIds),
          StateHeader.executor(localDir), run, encoder.schemaIpc)
      } finally encoder.close()
    }
  }
}

object StatePartitionOpener {
  /** The opener for an operator of this session, with the session's settings. */
  def forSession(
      session: SparkSession,
      family: String,
      info: StatefulOperatorStateInfo,
      operator: JValue,
      sentSchema: StructType,
      function: Option[FunctionEnvironment] = None): StatePartitionOpener = {
    val conf = session.sessionState.conf
    val storeConf = Contract.StoreConf.map { case (field, key) =>
      field -> (if (Contract.Settings.contains(key)) JLong(ArrowStateConf.long(conf, key))
                else if (key == SQLConf.STATE_STORE_COMPRESSION_CODEC.key) JString(conf.getConfString(key))
                else JLong(conf.getConfString(key).trim.toLong))
    } + ("memoryBytes" -> JLong(ArrowStateConf.workerMemoryBytes(conf, session.sparkContext.conf))) +
      ("verifyHeldState" -> JBool(session.sparkContext.conf.getBoolean("spark.speculation", false)))
    val workerSettings = WorkerSettings(
      affinityWaitMs = ArrowStateConf.long(conf, ArrowStateConf.AffinityWaitMs),
      idleTimeoutMs = ArrowStateConf.long(conf, ArrowStateConf.IdleTimeoutSeconds) * 1000,
      maintenanceIntervalMs = conf.streamingMaintenanceInterval,
      owner = if (Contract.family(family).userCode) Some(info.queryRunId.toString) else None,
      function = function)
    StatePartitionOpener(family, info, operator, storeConf,
      ArrowStateConf.get(conf, ArrowStateConf.LocalDir), workerSettings, sentSchema,
      conf.sessionLocalTimeZone, session.sparkContext.broadcast(
        new SerializableConfiguration(session.sessionState.newHadoopConf())),
      StatefulOperatorStateInfo.enableStateStoreCheckpointIds(conf))
  }
}
