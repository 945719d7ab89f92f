package org.apache.spark.sql.arrowstate.exec

import scala.reflect.ClassTag

import org.apache.spark.{Partition, SparkEnv, TaskContext}
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{StateStoreCoordinatorRef, StateStoreId, StateStoreProviderId}

import org.apache.spark.sql.arrowstate.worker.ExecutorCoordinator

/**
 * Runs an arrowstate operator per partition, like Spark's StateStoreRDD: it asks Spark's
 * StateStoreCoordinator to schedule each partition where its state was last loaded (here:
 * the executor whose Python worker holds it), and reports each task's load and commit to it.
 */
class ArrowStateRDD[T: ClassTag, U: ClassTag](
    prev: RDD[T],
    info: StatefulOperatorStateInfo,
    @transient private val coordinator: Option[StateStoreCoordinatorRef],
    reportCommits: Boolean,
    run: (Int, Iterator[T], StateCommitReporter) => Iterator[U])
  extends RDD[U](prev) {

  override protected def getPartitions: Array[Partition] = prev.partitions

  private def providerId(partitionId: Int): StateStoreProviderId =
    ArrowStateRDD.providerId(info, partitionId)

  override def getPreferredLocations(partition: Partition): Seq[String] =
    coordinator.flatMap(_.getLocation(providerId(partition.index))).toSeq

  override def compute(partition: Partition, context: TaskContext): Iterator[U] = {
    val id = providerId(partition.index)
    val env = SparkEnv.get
    val executorCoordinator = ExecutorCoordinator(env)
    executorCoordinator.reportActiveInstance(
      id, env.blockManager.blockManagerId.host, env.executorId, Nil)
    val reporter = new StateCommitReporter {
      override def committed(newVersion: Long): Unit = if (reportCommits) {
        executorCoordinator.reportStateStoreCommit(id, newVersion,
          StateStoreId.DEFAULT_STORE_NAME)
      }
    }
    run(partition.index, prev.iterator(partition, context), reporter)
  }
}

object ArrowStateRDD {
  /** The id Spark's coordinator knows a partition's state by: it includes the query run. */
  def providerId(info: StatefulOperatorStateInfo, partitionId: Int): StateStoreProviderId =
    StateStoreProviderId(
      StateStoreId(info.checkpointLocation, info.operatorId, partitionId,
        StateStoreId.DEFAULT_STORE_NAME),
      info.queryRunId)
}

/** Tells Spark's commit validation that a partition's state version was committed. */
trait StateCommitReporter extends Serializable {
  def committed(newVersion: Long): Unit
}
