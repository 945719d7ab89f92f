package org.apache.spark.sql.arrowstate.families

import java.util.Base64
import java.util.concurrent.ConcurrentHashMap

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.json4s.JsonAST.{JObject, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.SparkException
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, PythonUDF, SortOrder, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.logical.TransformWithStateInPySpark.UserFacingDataType
import org.apache.spark.sql.catalyst.plans.physical.Distribution
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.python.ArrowPythonRunner
import org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkExec
import org.apache.spark.sql.execution.streaming.operators.stateful._
import org.apache.spark.sql.execution.streaming.state.{OperatorStateMetadata, StateSchemaValidationResult}
import org.apache.spark.sql.streaming.{OutputMode, TimeMode}
import org.apache.spark.sql.types.StructType

import org.apache.spark.sql.arrowstate.arrow.{ArrowBatchEncoder, ArrowBatches}
import org.apache.spark.sql.arrowstate.exec.{ArrowStateWriter, StatePartitionOpener, StateTasks, TaskEnvironment, WorkerSort}
import org.apache.spark.sql.arrowstate.store.StateFiles

/**
 * PySpark's `transformWithState` / `transformWithStateInPandas` with the user's
 * StatefulProcessor running in the Python worker that holds the partition's state: input
 * rows (sorted by grouping key) go to Python, the processor's output comes back, and no
 * state operation crosses the bridge.
 *
 * In the query's first batch an initial state (a second child, `initialState`) goes to the
 * worker first: the processor's handleInitialState sees each of its keys before any input.
 *
 * Spark's own node (`spark`, with this node's children) keeps what is decided on the driver:
 * the state schema checks and files (schema v3, operator metadata v2), the output
 * watermark and whether another batch runs; so a query's checkpoint metadata is what
 * Spark's operator writes.
 */
case class ArrowTransformWithStateExec(
    spark: TransformWithStateInPySparkExec,
    child: SparkPlan,
    initialState: Option[SparkPlan])
  extends SparkPlan with ArrowStateWriter with WatermarkSupport {

  // built once per node: Spark's node makes its encoders when constructed
  @transient private lazy val native: TransformWithStateInPySparkExec =
    spark.copy(child = child, initialState = initialState.getOrElse(spark.initialState))

  override def children: Seq[SparkPlan] = child +: initialState.toSeq

  override def nodeName: String = "ArrowTransformWithState"
  override def simpleString(maxFields: Int): String =
    s"$nodeName ${spark.groupingAttributes.mkString("[", ", ", "]")}, ${spark.outputMode}, " +
      s"${spark.timeMode}, ${stateInfo.getOrElse("no state info")}"
  override def output: Seq[Attribute] = spark.output
  override def stateInfo: Option[StatefulOperatorStateInfo] = spark.stateInfo
  override def keyExpressions: Seq[Attribute] = spark.groupingAttributes
  override def eventTimeWatermarkForLateEvents: Option[Long] =
    spark.eventTimeWatermarkForLateEvents
  override def eventTimeWatermarkForEviction: Option[Long] = spark.eventTimeWatermarkForEviction
  override def shortName: String = spark.shortName
  override def family: String = TransformWithStateFamily.name
  // as Spark's: late rows are dropped in EventTime mode only, by an event-time column
  override protected def inapplicableMetrics: Set[String] =
    if (spark.timeMode == TimeMode.EventTime() && eventTimeWatermarkForLateEvents.isDefined &&
        WatermarkSupport.findEventTimeColumn(child.output,
          allowMultipleEventTimeColumns = !allowMultipleStatefulOperators).isDefined) Set.empty
    else ArrowStateWriter.LateRows

  override def requiredChildDistribution: Seq[Distribution] =
    native.requiredChildDistribution.take(children.size)
  // the worker sorts the rows by key where it can (WorkerSort)
  @transient private lazy val inputSorted: Boolean =
    !WorkerSort.inWorker(this, spark.groupingAttributes, session)

  override def requiredChildOrdering: Seq[Seq[SortOrder]] = {
    val sparks = native.requiredChildOrdering.take(children.size)
    if (inputSorted) sparks else Nil +: sparks.drop(1)   // the initial state stays sorted
  }

  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    native.shouldRunAnotherBatch(newInputWatermark)
  override def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] =
    native.produceOutputWatermark(inputWatermarkMs)

  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] =
    native.validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)
  override def operatorStateMetadataVersion: Int = native.operatorStateMetadataVersion
  override def operatorStateMetadata(stateSchemaPaths: List[List[String]])
    : OperatorStateMetadata = native.operatorStateMetadata(stateSchemaPaths)
  override def validateNewMetadata(
      oldMetadata: OperatorStateMetadata, newMetadata: OperatorStateMetadata): Unit =
    native.validateNewMetadata(oldMetadata, newMetadata)
  override def stateSchemaList(
      stateSchemaValidationResults: List[StateSchemaValidationResult],
      oldMetadata: Option[OperatorStateMetadata]): List[List[String]] =
    native.stateSchemaList(stateSchemaValidationResults, oldMetadata)
  override def supportsSchemaEvolution: Boolean = native.supportsSchemaEvolution

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val udf = spark.functionExpr.asInstanceOf[PythonUDF]
    val function = udf.func
    val sent = ArrowTransformWithState.sentColumns(spark.groupingAttributes, udf, child.output)
    val sentSchema = DataTypeUtils.fromAttributes(sent.map(_.withNullability(true)))
    // as Spark's runner refuses it: pandas and Rows would lose a field a struct names twice
    org.apache.spark.sql.util.ArrowUtils.failDuplicatedFieldNames(sentSchema)
    val grouping = spark.groupingAttributes.size
    val eventTime = WatermarkSupport.findEventTimeColumn(child.output,
      allowMultipleEventTimeColumns = !allowMultipleStatefulOperators)
    val eventTimeMode = spark.timeMode == TimeMode.EventTime()
    val operator: JValue =
      ("command" -> Base64.getEncoder.encodeToString(function.command.toArray)) ~
        ("pythonIncludes" -> function.pythonIncludes.asScala.toList) ~
        ("keyIndices" -> (0 until grouping).toList) ~
        ("valueIndices" -> (grouping until sent.size).toList) ~
        ("pandas" -> (spark.userFacingDataType == UserFacingDataType.PANDAS)) ~
        ("maxRecordsPerBatch" -> conf.arrowMaxRecordsPerBatch) ~
        ("maxBytesPerBatch" -> conf.arrowMaxBytesPerBatch) ~
        ("runnerConf" -> ArrowPythonRunner.getPythonRunnerConfMap(conf)) ~
        ("outputSchema" -> DataTypeUtils.fromAttributes(spark.outputAttrs).json) ~
        ("variables" -> ArrowTransformWithState.variableSchemas(info)) ~
        ("timeMode" -> spark.timeMode.toString) ~
        ("stateEncoding" -> conf.getConfString(
          "spark.sql.streaming.stateStore.encodingFormat", "unsaferow").toLowerCase) ~
        ("batchTimestampMs" -> spark.batchTimestampMs) ~
        ("evictionWatermarkMs" -> spark.eventTimeWatermarkForEviction) ~
        // Spark drops late rows in EventTime mode only
        ("lateEventsWatermarkMs" -> spark.eventTimeWatermarkForLateEvents.filter(_ => eventTimeMode)) ~
        ("eventTimeIndex" -> eventTime.map(et => sent.indexWhere(_.exprId == et.exprId)).getOrElse(-1)) ~
        ("initialKeyCount" -> initialState.map(_ => spark.initialStateGroupingAttrs.size)) ~
        ("inputSorted" -> inputSorted)
    val opener =
      StatePartitionOpener.forSession(session, TransformWithStateFamily.name, info, operator,
        sentSchema, Some(TaskEnvironment.forFunction(function, sparkContext.getConf)))
    val outputSchema = DataTypeUtils.fromAttributes(output)
    val childOutput = child.output

    initialState match {
      case None =>
        StateTasks.rdd(this, opener, child.execute()) { (task, rows) =>
          StateTasks.functionOutput(task, rows, sent, childOutput, outputSchema)
        }
      case Some(initial) =>
        // the grouping columns, then the initial state's own columns (its output begins
        // with the grouping projection, which handleInitialState does not get, as in Spark)
        val grouping = spark.initialStateGroupingAttrs
        val initialSent = grouping ++ initial.output.drop(grouping.size)
        val initialSchema = DataTypeUtils.fromAttributes(initialSent.map(_.withNullability(true)))
        val timeZone = conf.sessionLocalTimeZone
        val initialOutput = initial.output
        val both = child.execute().zipPartitions(initial.execute()) { (rows, initialRows) =>
          Iterator.single((rows, initialRows))
        }
        StateTasks.rdd(this, opener, both) { (task, input) =>
          val (rows, initialRows) = input.next()
          val project = UnsafeProjection.create(initialSent, initialOutput)
          val encoder = new ArrowBatchEncoder(initialSchema, timeZone)
          try {
            var pending = 0
            initialRows.foreach { row =>
              encoder.append(project(row))
              pending += 1
              if (pending == task.batchSize) {
                task.exchange.initialState(encoder.finishBatch())
                pending = 0
              }
            }
            if (pending > 0) task.exchange.initialState(encoder.finishBatch())
          } finally encoder.close()
          StateTasks.functionOutput(task, rows, sent, childOutput, outputSchema)
        }
    }
  }

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan])
    : SparkPlan = copy(child = newChildren.head, initialState = newChildren.lift(1))
}

object ArrowTransformWithState {
  /**
   * The schemas of the processor's state variables as Spark parsed them (a processor may
   * give DDL strings, which only the JVM parses): name -> value schema and, for a map, the
   * user key schema. Spark learns them on the driver (running the processor's init() in
   * Python) and hands them to its stores in the state info's schema broadcast.
   */
  def variableSchemas(info: StatefulOperatorStateInfo): JValue = {
    val active = info.stateSchemaMetadata.map(_.broadcast.value.activeSchemas).getOrElse(
      throw SparkException.internalError(s"arrowstate: Spark gave no state schemas for " +
        s"transformWithState operator ${info.operatorId} (query run ${info.queryRunId})"))
    def newest(name: String, isKey: Boolean): Option[StructType] =
      active.filter { case (k, _) => k.colFamilyName == name && k.isKey == isKey }
        .maxByOption(_._1.schemaId).map(_._2.sqlSchema)
    val all = active.keys.map(_.colFamilyName).toSeq.distinct.sorted
    // a variable with a TTL has an index beside it, and its stored value is
    // struct<value: the variable's schema, ttlExpirationMs>
    val withTtl = all.filter(_.startsWith("$ttl_")).map(_.stripPrefix("$ttl_")).toSet
    val names = all.filterNot(n => n.startsWith("$") || n == "default")
    JObject(names.toList.map { name =>
      val userKey = newest(name, isKey = true).flatMap(_.fields.find(_.name == "userKey"))
        .map(_.dataType.json)
      val value = newest(name, isKey = false).map { stored =>
        if (withTtl(name)) stored("value").dataType.json else stored.json
      }
      name -> (("value" -> value) ~ ("userKey" -> userKey))
    })
  }

  /** The grouping columns, then the columns the processor's rows hold (the UDF's inputs). */
  def sentColumns(grouping: Seq[Attribute], udf: PythonUDF, childOutput: Seq[Attribute])
    : Seq[Attribute] = {
    val inputs = udf.children.map {
      case a: Attribute => childOutput.find(_.exprId == a.exprId).getOrElse(a)
      case other => throw SparkException.internalError(
        s"arrowstate: transformWithState input $other is not a column")
    }
    grouping ++ inputs
  }
}

/** PySpark's `transformWithState` and `transformWithStateInPandas`: the processor runs
 * next to its state: any time mode, TTLs and an initial state. */
object TransformWithStateFamily extends ArrowStateFamily {
  override val name = "transformWithState"

  override def matches(plan: SparkPlan): Boolean = plan.isInstanceOf[TransformWithStateInPySparkExec]

  // real-time mode: the processor is called per key of each flush, as rows arrive
  override val modes: TriggerModes = TriggerModes(
    microBatch = Runs(classOf[ArrowTransformWithStateExec]),
    realTime = Runs(classOf[ArrowTransformWithStateExec]).unless { plan =>
      val p = plan.asInstanceOf[TransformWithStateInPySparkExec]
      (if (p.hasInitialState) Some("an initial state (arrowstate seeds it in a micro-batch)")
       else None).toSeq ++ WorkerSort.realTimeKeyReason(p.groupingAttributes)
    })

  override def unsupportedReasons(plan: SparkPlan): Seq[String] = {
    val p = plan.asInstanceOf[TransformWithStateInPySparkExec]
    val udf = p.functionExpr.asInstanceOf[PythonUDF]
    Seq(
      // Spark's state of this operator (column families) is not adopted: the query stays
      // on the engine that began it (an initial state keeps the first batch Spark's)
      if (p.stateInfo.exists(sparkStateIn)) {
        Some("the checkpoint holds Spark's own state for this operator (transformWithState " +
          "state is not adopted)")
      } else None,
      if (!p.isStreaming) Some("not a streaming query") else None,
      if (p.outputMode == OutputMode.Complete()) Some("output mode Complete") else None,
      if (!udf.func.broadcastVars.isEmpty) {
        Some("the pickled processor is shipped as a broadcast (it is over 1 MB)")
      } else None,
      if (!udf.children.forall(_.isInstanceOf[Attribute])) {
        Some("the processor's input is not plain columns")
      } else None).flatten ++
      p.groupingAttributes.flatMap { a =>
        ArrowBatches.unsupportedKeyReason(a.dataType).map(r => s"key ${a.name}: unsupported $r")
      }
  }

  /** Per query run and operator, once its state exists: which engine wrote it does not
   * change within a run, so its partition directories are listed once, not every batch. */
  private val sparkState = new ConcurrentHashMap[(String, Long), java.lang.Boolean]()

  private def sparkStateIn(info: StatefulOperatorStateInfo): Boolean =
    info.storeVersion > 0 && sparkState.computeIfAbsent(
      (info.queryRunId.toString, info.operatorId), { _ =>
        java.lang.Boolean.valueOf(StateFiles.operatorHoldsSparkState(
          new Path(info.checkpointLocation, info.operatorId.toString),
          SparkSession.active.sessionState.newHadoopConf()))
      })

  override def replace(plan: SparkPlan): SparkPlan = {
    val p = plan.asInstanceOf[TransformWithStateInPySparkExec]
    ArrowTransformWithStateExec(p, WorkerSort.child(p.child, p.groupingAttributes),
      if (p.hasInitialState) Some(p.initialState) else None)
  }
}
