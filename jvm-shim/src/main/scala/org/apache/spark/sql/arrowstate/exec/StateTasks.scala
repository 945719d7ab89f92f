package org.apache.spark.sql.arrowstate.exec

import org.json4s.JsonAST.{JObject, JValue}
import org.json4s.JsonDSL._

import scala.jdk.CollectionConverters._
import scala.reflect.ClassTag

import org.apache.spark.{SparkConf, SparkFiles, TaskContext}
import org.apache.spark.api.python.PythonFunction
import org.apache.spark.broadcast.Broadcast
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BoundReference}
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.{CompletionIterator, SerializableConfiguration}

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}
import org.apache.spark.sql.arrowstate.store.StateFiles
import org.apache.spark.sql.arrowstate.tools.StateConversion
import org.apache.spark.sql.arrowstate.worker.{FunctionEnvironment, StateExchange, WorkerSettings}

object ArrowStateVersion {
  lazy val version: String = {
    val props = new java.util.Properties()
    val in = getClass.getResourceAsStream("/arrowstate.properties")
    if (in != null) try props.load(in) finally in.close()
    props.getProperty("version", "unknown")
  }
}

/** A task's header (contract.json's `header` payload; FrameCodec checks it as it is sent). */
object StateHeader {
  def apply(family: String, info: StatefulOperatorStateInfo, partitionId: Int, stateKey: String,
      drop: Seq[String], conf: Map[String, Long], operator: JValue, task: JValue,
      localDir: String): JValue =
    ("family" -> family) ~
      ("stateKey" -> stateKey) ~
      ("queryRunId" -> info.queryRunId.toString) ~
      ("operatorId" -> info.operatorId) ~
      ("partitionId" -> partitionId) ~
      ("version" -> info.storeVersion) ~
      ("drop" -> drop.toList) ~
      ("conf" -> conf) ~
      ("operator" -> operator) ~
      ("task" -> task) ~
      ("sparkFilesDir" -> SparkFiles.getRootDirectory()) ~
      ("localDir" -> LocalStateDir.path(localDir))
}

/**
 * Made on the driver: opens a task's exchange with the Python worker for one partition of an
 * operator's state (header, the schema of the rows sent, the version to update).
 */
case class StatePartitionOpener(
    family: String,
    info: StatefulOperatorStateInfo,
    operator: JValue,
    storeConf: Map[String, Long],
    localDir: String,
    workerSettings: WorkerSettings,
    sentSchema: StructType,
    timeZone: String,
    hadoopConf: Broadcast[SerializableConfiguration]) {

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
      val encoder = new ArrowBatchEncoder(sentSchema, timeZone)
      try {
        exchange.begin(
          StateHeader(family, info, partitionId, dir.toString, exchange.staleKeysToDrop,
            storeConf, operator, TaskEnvironment.current(), localDir),
          encoder.schemaIpc)
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
      field -> (if (Contract.Settings.contains(key)) ArrowStateConf.long(conf, key)
                else conf.getConfString(key).trim.toLong)
    } + ("memoryBytes" -> ArrowStateConf.workerMemoryBytes(conf, session.sparkContext.conf))
    val workerSettings = WorkerSettings(
      affinityWaitMs = ArrowStateConf.long(conf, ArrowStateConf.AffinityWaitMs),
      idleTimeoutMs = ArrowStateConf.long(conf, ArrowStateConf.IdleTimeoutSeconds) * 1000,
      maintenanceIntervalMs = conf.streamingMaintenanceInterval,
      owner = if (Contract.family(family).userCode) Some(info.queryRunId.toString) else None,
      function = function)
    StatePartitionOpener(family, info, operator, storeConf,
      ArrowStateConf.get(conf, ArrowStateConf.LocalDir), workerSettings, sentSchema,
      conf.sessionLocalTimeZone, session.sparkContext.broadcast(
        new SerializableConfiguration(session.sessionState.newHadoopConf())))
  }
}

/**
 * Where state workers keep state over their memory budget: the `spark.arrowstate.worker.localDir`
 * setting, else one directory per executor among Spark's local directories, made on first use
 * and deleted when the executor stops (each worker removes its own part when it exits).
 */
object LocalStateDir {
  private lazy val executorDir: String = {
    val conf = org.apache.spark.SparkEnv.get.conf
    org.apache.spark.util.Utils.createTempDir(
      org.apache.spark.util.Utils.getLocalDir(conf), "arrowstate").getAbsolutePath
  }

  def path(setting: String): String = if (setting.nonEmpty) setting else executorDir
}

/** The running task, as pyspark's TaskContext describes it to Python code. */
object TaskEnvironment {
  def current(): JValue = Option(TaskContext.get()).map { c =>
    ("stageId" -> c.stageId()) ~
      ("stageAttemptNumber" -> c.stageAttemptNumber()) ~
      ("partitionId" -> c.partitionId()) ~
      ("attemptNumber" -> c.attemptNumber()) ~
      ("taskAttemptId" -> c.taskAttemptId()) ~
      ("cpus" -> c.cpus()) ~
      ("localProperties" -> c.getLocalProperties.asScala.toMap): JValue
  }.getOrElse(org.json4s.JNull)

  /** How Spark starts the worker of a Python function: its interpreter, its environment
   * (spark.executorEnv.* and the rest of the function's envVars) and, as Spark's Python
   * runner does, `spark.executor.pyspark.memory` shared by the executor's cores. */
  def forFunction(function: PythonFunction, conf: SparkConf): FunctionEnvironment = {
    val memory = ArrowStateConf.pysparkMemoryMbPerWorker(conf)
      .map(mb => "PYSPARK_EXECUTOR_MEMORY_MB" -> mb.toString)
    FunctionEnvironment(function.pythonExec, function.envVars.asScala.toMap ++ memory)
  }
}

/**
 * The partitions (of a query run: Spark's provider ids) whose state this executor has
 * committed. For the rest of that run no engine of Spark's writes their files, so a task
 * skips the directory listing that asks whether Spark's own store wrote them (one listing
 * per task and micro-batch: on an object store, a request each). Entries go when the
 * worker pool drops the partition's state (PythonStateWorkers' maintenance).
 */
object CommittedPartitions {
  private val committed = java.util.concurrent.ConcurrentHashMap.newKeySet[StateStoreProviderId]()

  def contains(id: StateStoreProviderId): Boolean = committed.contains(id)
  def add(id: StateStoreProviderId): Unit = committed.add(id)
  def remove(id: StateStoreProviderId): Unit = committed.remove(id)
}

/** What one task of an arrowstate writer works with. */
class StateTask(
    val exchange: StateExchange,
    val encoder: ArrowBatchEncoder,
    val batchSize: Int)

object StateTasks {
  /**
   * The RDD of an arrowstate writer, made on the driver: per partition it opens the exchange
   * with the worker and an encoder for the rows sent, lets `body` make the output, counts it,
   * and commits the new state version once all of it is consumed. `countsInstances`: whether
   * the task counts in numStateStoreInstances (Spark's session window save in complete mode
   * does not).
   */
  def rdd[T: ClassTag](
      plan: StateStoreWriter,
      opener: StatePartitionOpener,
      input: RDD[T],
      countsInstances: Boolean = true)(
      body: (StateTask, Iterator[T]) => Iterator[InternalRow]): RDD[InternalRow] = {
    val opMetrics = plan.metrics
    val info = opener.info
    val conf = plan.session.sessionState.conf
    val batchSize = math.max(1, conf.arrowMaxRecordsPerBatch)
    val coordinator = Some(plan.session.streams.stateStoreCoordinator)
    val reportCommits = conf.stateStoreCommitValidationEnabled
    new ArrowStateRDD[T, InternalRow](input, info, coordinator, reportCommits,
      { (partitionId, rows, reporter) =>
        val exchange = opener.open(partitionId)
        val encoder = new ArrowBatchEncoder(opener.sentSchema, opener.timeZone)
        TaskContext.get().addTaskCompletionListener[Unit](_ => encoder.close())
        val numOutputRows = opMetrics("numOutputRows")
        val out = body(new StateTask(exchange, encoder, batchSize), rows)
          .map { r => numOutputRows += 1; r }
        CompletionIterator[InternalRow, Iterator[InternalRow]](out, {
          if (!exchange.inputEnded) exchange.endInput().foreach(_ => ())
          exchange.commit(info.storeVersion + 1, opMetrics, opener.family, countsInstances)
          CommittedPartitions.add(ArrowStateRDD.providerId(info, partitionId))
          reporter.committed(info.storeVersion + 1)
        })
      })
  }

  /** The output of a family that runs a user's function: the input rows (projected to the
   * `sent` columns) go to the worker, and only the function's output rows come back. */
  def functionOutput(task: StateTask, rows: Iterator[InternalRow], sent: Seq[Attribute],
      childOutput: Seq[Attribute], outputSchema: StructType): Iterator[InternalRow] = {
    val project = TaskProjections.unsafe(sent, childOutput)
    val toOutput = TaskProjections.unsafe(outputSchema.fields.toSeq.zipWithIndex.map {
      case (f, i) => BoundReference(i, f.dataType, f.nullable)
    })
    val outputRows = ArrowBatches.rowsInPlace(_: Array[Byte], outputSchema.length).map(toOutput)
    new PostedRows(rows, task.exchange, task.encoder, project, task.batchSize,
      passInput = false, keepInput = false, (_, answer) => answer.iterator.flatMap(outputRows)
    ) ++ task.exchange.endInput().flatMap(outputRows)
  }
}
