package org.apache.spark.sql.arrowstate.exec

import org.json4s.JsonAST.{JNull, JString, JValue}
import org.json4s.JsonDSL._

import org.apache.spark.SparkFiles
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

import org.apache.spark.sql.arrowstate.store.CheckpointIds
import org.apache.spark.sql.arrowstate.worker.LocalStateDir

/** A task's header (contract.json's `header` payload; FrameCodec checks it as it is sent).
 * What the operator's tasks share goes apart: StatePartitionOpener.run. */
object StateHeader {
  def apply(family: String, info: StatefulOperatorStateInfo, partitionId: Int, stateKey: String,
      drop: Seq[String], task: JValue, localDir: String, checkpointIds: CheckpointIds): JValue =
    ("family" -> family) ~
      ("stateKey" -> stateKey) ~
      ("queryRunId" -> info.queryRunId.toString) ~
      ("operatorId" -> info.operatorId) ~
      ("partitionId" -> partitionId) ~
      ("version" -> info.storeVersion) ~
      // null, not left out, under format v1: the contract requires both
      ("checkpointId" -> checkpointIds.next.map(JString(_)).getOrElse(JNull)) ~
      ("baseCheckpointId" -> checkpointIds.checkedBase.map(JString(_)).getOrElse(JNull)) ~
      ("drop" -> drop.toList) ~
      ("task" -> task) ~
      ("sparkFilesDir" -> SparkFiles.getRootDirectory()) ~
      ("localDir" -> LocalStateDir.path(localDir))
}

