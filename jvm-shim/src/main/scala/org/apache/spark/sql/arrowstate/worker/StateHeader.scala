package org.apache.spark.sql.arrowstate.worker

import java.util.concurrent.ConcurrentHashMap

import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import org.apache.spark.SparkFiles
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

import org.apache.spark.sql.arrowstate.contract.CheckedJson
import org.apache.spark.sql.arrowstate.store.CheckpointIds

/** A task's own fields of TASK (contract.json's `frames.TASK`), in its order, before the
 * executor's and the operator run's shared ones: binary, so nothing in them is JSON to
 * render and check a task. A checkpoint id is empty where there is none. */
case class StateHeader(
    stateKey: String,
    partitionId: Int,
    version: Long,
    checkpointId: String,
    baseCheckpointId: String,
    drop: Seq[String],
    task: JValue) {
  def fields: Seq[Any] =
    Seq(stateKey, partitionId, version, checkpointId, baseCheckpointId, drop, task)
}

object StateHeader {
  def apply(info: StatefulOperatorStateInfo, partitionId: Int, stateKey: String,
      drop: Seq[String], task: JValue, checkpointIds: CheckpointIds): StateHeader =
    StateHeader(stateKey, partitionId, info.storeVersion, checkpointIds.next.getOrElse(""),
      checkpointIds.checkedBase.getOrElse(""), drop, task)

  private val executors = new ConcurrentHashMap[String, CheckedJson]()

  /** What every task of this executor shares (the `executor` payload), checked and
   * rendered once for each local directory setting. */
  def executor(localDirSetting: String): CheckedJson =
    executors.computeIfAbsent(localDirSetting, setting => new CheckedJson("executor",
      ("sparkFilesDir" -> SparkFiles.getRootDirectory()) ~
        ("localDir" -> LocalStateDir.path(setting))))
}
