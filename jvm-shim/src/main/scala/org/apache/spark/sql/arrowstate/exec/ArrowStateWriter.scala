package org.apache.spark.sql.arrowstate.exec

import scala.jdk.CollectionConverters._

import org.apache.spark.SparkContext
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorCustomMetric, StateStoreWriter}
import org.apache.spark.sql.streaming.StateOperatorProgress

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract, ContractMetric}

/**
 * The SQL metrics and progress of an arrowstate operator. Spark's StateStoreWriter shows,
 * beside the operator's state figures, the custom metrics of the session's state store
 * provider and the metrics of Spark's Python runner: an arrowstate operator uses neither, so
 * they would show at zero. Its node shows instead the state figures that apply to it, the
 * contract's metrics of its family, and its Python figures under the names and labels of
 * Spark's Python operators (time to run Python workers, data sent to and returned from Python
 * workers), each figure once.
 */
trait ArrowStateWriter extends StateStoreWriter { self: SparkPlan =>

  /** The contract's family of the operator. */
  def family: String

  /** Figures this node cannot make other than zero (say, rows dropped by watermark without
   * a watermark): left out of its metrics rather than shown at zero. */
  protected def inapplicableMetrics: Set[String] = Set.empty

  /** The contract's metrics the node shows: its family's, less those that cannot apply (state
   * on local disk needs a memory budget to spill under). */
  private lazy val shown: Seq[Contract.Metric] = {
    val noDisk = ArrowStateConf.workerMemoryBytes(conf, sparkContext.conf) == 0
    val leftOut = inapplicableMetrics ++ (if (noDisk) Set("stateDiskBytes") else Set.empty)
    Contract.Metrics.filter(m => m.appliesTo(family) && !leftOut(m.name))
  }

  override def customStatefulOperatorMetrics: Seq[StatefulOperatorCustomMetric] =
    shown.filter(_.custom).map(ContractMetric)

  /** SQL metrics the node shares with another (by their SQL names): made with that one. */
  protected def sharedMetrics: Map[String, SQLMetric] = Map.empty

  override lazy val metrics: Map[String, SQLMetric] = shown.map { m =>
    m.sqlName -> sharedMetrics.getOrElse(m.sqlName, ArrowStateWriter.sqlMetric(m, sparkContext))
  }.toMap

  /** Spark's progress of a state operator; its custom metrics are the ones the node shows,
   * under their contract names (the provider's, unused, are left out). */
  override def getProgress(): StateOperatorProgress = {
    def value(name: String): Long = metrics.get(name).map(_.value).getOrElse(0L)
    val custom = shown.filter(_.custom)
      .map(m => m.name -> java.lang.Long.valueOf(value(m.sqlName))).toMap
    new StateOperatorProgress(
      operatorName = shortName,
      numRowsTotal = value("numTotalStateRows"),
      numRowsUpdated = value("numUpdatedStateRows"),
      allUpdatesTimeMs = value("allUpdatesTimeMs"),
      numRowsRemoved = value("numRemovedStateRows"),
      allRemovalsTimeMs = value("allRemovalsTimeMs"),
      commitTimeMs = value("commitTimeMs"),
      memoryUsedBytes = value("stateMemory"),
      numRowsDroppedByWatermark = value("numRowsDroppedByWatermark"),
      // as Spark's: the query's progress fills it in
      numShufflePartitions = stateInfo.map(_.numPartitions.toLong).getOrElse(-1L),
      numStateStoreInstances = value("numStateStoreInstances"),
      customMetrics = new java.util.HashMap[String, java.lang.Long](custom.asJava))
  }
}

object ArrowStateWriter {
  /** The SQL metric of a contract metric, labelled as Spark labels its own figures. */
  def sqlMetric(m: Contract.Metric, sc: SparkContext): SQLMetric = {
    val metric = if (m.custom) m else m.copy(description = SparkLabels
      .getOrElse(m.name, throw new IllegalStateException(
        s"arrowstate: contract.json's metric ${m.name} is not one of StateStoreWriter's")))
    ContractMetric(metric).createSQLMetric(sc)
  }

  /** StateStoreWriter's labels of its own figures (Spark's statefulOperators.scala). */
  val SparkLabels: Map[String, String] = Map(
    "numOutputRows" -> "number of output rows",
    "numRowsDroppedByWatermark" -> "number of rows which are dropped by watermark",
    "numTotalStateRows" -> "number of total state rows",
    "numUpdatedStateRows" -> "number of updated state rows",
    "allUpdatesTimeMs" -> "time to update",
    "numRemovedStateRows" -> "number of removed state rows",
    "allRemovalsTimeMs" -> "time to remove",
    "commitTimeMs" -> "time to commit changes",
    "stateMemory" -> "memory used by state",
    "numStateStoreInstances" -> "number of state store instances")

  val LateRows: Set[String] = Set("numRowsDroppedByWatermark")
  val Removals: Set[String] = Set("numRemovedStateRows", "allRemovalsTimeMs")
}
