package org.apache.spark.sql.arrowstate.families

import java.util.Base64

import scala.jdk.CollectionConverters._
import scala.util.Try

import org.json4s.JValue
import org.json4s.JsonDSL._

import org.apache.hadoop.conf.Configuration

import org.apache.spark.{SparkException, SparkFiles}
import org.apache.spark.api.python.PythonFunction
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, PythonUDF}
import org.apache.spark.sql.catalyst.plans.logical.TransformWithStateInPySpark.UserFacingDataType
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.python.streaming.{TransformWithStateInPySparkExec, TransformWithStateInPySparkPythonRunnerUtils, TransformWithStateInPySparkStateServer}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.statefulprocessor.DriverStatefulProcessorHandleImpl
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.streaming.{OutputMode, TimeMode}
import org.apache.spark.sql.types.{StructField, StructType}

import org.apache.spark.sql.arrowstate.exec.{TaskEnvironment, TriggerMode}
import org.apache.spark.sql.arrowstate.worker.{FunctionEnvironment, PythonStateWorkers}

/**
 * Spark's transformWithState node as arrowstate plans it (PreInitStrategy): the same node in
 * every way but one, the processor's init() that Spark runs on the driver while it plans a
 * query run's first batch (TransformWithStatePreInit). IncrementalExecution asks it before
 * arrowstate's rule replaces nodes, so the node itself must be ours; Spark's rules copy it
 * with `copy`, which therefore makes one of these again. Whether arrowstate then runs it or
 * Spark does is the usual decision (ArrowStateOverrides).
 */
class TransformWithStateInPySparkPlanned(
    functionExpr: Expression,
    groupingAttributes: Seq[Attribute],
    outputAttrs: Seq[Attribute],
    outputMode: OutputMode,
    timeMode: TimeMode,
    stateInfo: Option[StatefulOperatorStateInfo],
    batchTimestampMs: Option[Long],
    prevBatchTimestampMs: Option[Long],
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    userFacingDataType: UserFacingDataType.Value,
    child: SparkPlan,
    isStreaming: Boolean,
    hasInitialState: Boolean,
    initialState: SparkPlan,
    initialStateGroupingAttrs: Seq[Attribute],
    initialStateSchema: StructType)
  extends TransformWithStateInPySparkExec(functionExpr, groupingAttributes, outputAttrs,
    outputMode, timeMode, stateInfo, batchTimestampMs, prevBatchTimestampMs,
    eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction, userFacingDataType, child,
    isStreaming, hasInitialState, initialState, initialStateGroupingAttrs, initialStateSchema) {

  // Spark's name in plans and EXPLAIN (a node Spark keeps shows as Spark's)
  override def nodeName: String = "TransformWithStateInPySpark"

  override def copy(
      functionExpr: Expression = functionExpr,
      groupingAttributes: Seq[Attribute] = groupingAttributes,
      outputAttrs: Seq[Attribute] = outputAttrs,
      outputMode: OutputMode = outputMode,
      timeMode: TimeMode = timeMode,
      stateInfo: Option[StatefulOperatorStateInfo] = stateInfo,
      batchTimestampMs: Option[Long] = batchTimestampMs,
      prevBatchTimestampMs: Option[Long] = prevBatchTimestampMs,
      eventTimeWatermarkForLateEvents: Option[Long] = eventTimeWatermarkForLateEvents,
      eventTimeWatermarkForEviction: Option[Long] = eventTimeWatermarkForEviction,
      userFacingDataType: UserFacingDataType.Value = userFacingDataType,
      child: SparkPlan = child,
      isStreaming: Boolean = isStreaming,
      hasInitialState: Boolean = hasInitialState,
      initialState: SparkPlan = initialState,
      initialStateGroupingAttrs: Seq[Attribute] = initialStateGroupingAttrs,
      initialStateSchema: StructType = initialStateSchema): TransformWithStateInPySparkExec =
    new TransformWithStateInPySparkPlanned(functionExpr, groupingAttributes, outputAttrs,
      outputMode, timeMode, stateInfo, batchTimestampMs, prevBatchTimestampMs,
      eventTimeWatermarkForLateEvents, eventTimeWatermarkForEviction, userFacingDataType, child,
      isStreaming, hasInitialState, initialState, initialStateGroupingAttrs, initialStateSchema)

  override def validateAndMaybeEvolveStateSchema(
      hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int)
    : List[StateSchemaValidationResult] = {
    val function = functionExpr.asInstanceOf[PythonUDF].func
    if (TransformWithStatePreInit.run(this, function,
        TaskEnvironment.forFunction(function, sparkContext.getConf))) {
      // what Spark's node does once its runner has filled the handle; in real-time mode as
      // Spark's JVM transformWithState does (a batch's offsets are logged at its end, so the
      // metadata of the batch being planned is not looked for in the offset log)
      validateAndWriteStateSchema(hadoopConf, batchId, stateSchemaVersion, getStateInfo,
        stateSchemaDirPath(), session, operatorStateMetadataVersion,
        conf.stateStoreEncodingFormat, TriggerMode.of(this) == TriggerMode.RealTime)
    } else {
      super.validateAndMaybeEvolveStateSchema(hadoopConf, batchId, stateSchemaVersion)
    }
  }
}

object TransformWithStateInPySparkPlanned {
  /** Spark's planned node as one of ours, every field kept. */
  def apply(node: TransformWithStateInPySparkExec): TransformWithStateInPySparkPlanned =
    new TransformWithStateInPySparkPlanned(node.functionExpr, node.groupingAttributes,
      node.outputAttrs, node.outputMode, node.timeMode, node.stateInfo, node.batchTimestampMs,
      node.prevBatchTimestampMs, node.eventTimeWatermarkForLateEvents,
      node.eventTimeWatermarkForEviction, node.userFacingDataType, node.child, node.isStreaming,
      node.hasInitialState, node.initialState, node.initialStateGroupingAttrs,
      node.initialStateSchema)
}

/**
 * transformWithState's planning on the driver. Spark learns a processor's state variables
 * by running its init() in Python against a state server on the driver that records what
 * the handle asks for (the node's DriverStatefulProcessorHandleImpl), then validates and
 * writes the state schema from that record. Spark starts a new interpreter for it, which
 * imports pandas and pyspark: a second or more of a query run's first batch. Here a worker
 * forked from the function daemon (those imports done) runs pyspark's own pre-init against
 * Spark's own server and handle, so the record, and any error, is Spark's.
 */
object TransformWithStatePreInit extends Logging {
  /** Spark's node keeps its handle private; a Spark whose node has none runs its own. */
  private lazy val driverHandleOf: Option[java.lang.reflect.Method] = Try {
    val method = classOf[TransformWithStateInPySparkExec].getDeclaredMethod("driverProcessorHandle")
    method.setAccessible(true)
    method
  }.toOption

  /** Spark's state server socket, bound as Spark's runners bind it (loopback port or Unix
   * socket, by spark.python.unix.domain.socket.enabled). */
  private class ServerSocket extends TransformWithStateInPySparkPythonRunnerUtils {
    initStateServer()
    def channel: java.nio.channels.ServerSocketChannel = stateServerSocket
    def address: String =
      if (isUnixDomainSock) stateServerSocketPath else stateServerSocketPort.toString
    def close(): Unit = closeServerSocketChannelSilently(stateServerSocket)
  }

  /**
   * Records `native`'s state variables in its driver handle by running the processor's
   * init() in an arrowstate worker; false when this Spark's node does not let us (the
   * caller then lets Spark run its own).
   */
  def run(native: TransformWithStateInPySparkExec, function: PythonFunction,
      environment: FunctionEnvironment): Boolean = {
    val handle = driverHandleOf.flatMap(m =>
      Try(m.invoke(native).asInstanceOf[DriverStatefulProcessorHandleImpl]).toOption)
    handle.foreach { h =>
      // as Spark's node makes it: the grouping attributes' names, types and nullability
      val keySchema = StructType(native.groupingAttributes.map(a =>
        StructField(a.name, a.dataType, a.nullable)))
      val socket = new ServerSocket
      val maxRecords = SQLConf.get.arrowTransformWithStateInPySparkMaxStateRecordsPerBatch
      val server = new Thread(() =>
        try new TransformWithStateInPySparkStateServer(socket.channel, h, keySchema, maxRecords)
          .run()
        catch {
          case e: Exception => logWarning("arrowstate: the pre-init state server stopped", e)
        }, "arrowstate-pre-init-state-server")
      server.setDaemon(true)
      server.start()
      val request: JValue =
        ("command" -> Base64.getEncoder.encodeToString(function.command.toArray)) ~
          ("pythonIncludes" -> function.pythonIncludes.asScala.toList) ~
          ("sparkFilesDir" -> SparkFiles.getRootDirectory()) ~
          ("stateServer" -> socket.address) ~
          ("keySchema" -> keySchema.json)
      try {
        val worker = PythonStateWorkers.startForFunction(environment)
        try worker.preInit(request)
        finally PythonStateWorkers.destroy(worker)
      } catch {
        // Spark's own words for a failed init(), with the worker's error (and the Python
        // traceback) as the cause
        case e: Exception => throw new SparkException(
          "TransformWithStateInPySpark driver worker exited unexpectedly (crashed)", e)
      } finally {
        socket.close()
        server.interrupt()
      }
    }
    handle.isDefined
  }
}
