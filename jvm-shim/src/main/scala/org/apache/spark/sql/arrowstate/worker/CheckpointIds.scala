package org.apache.spark.sql.arrowstate.worker

import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

/**
 * A task's state checkpoint ids under Spark's checkpoint format v2
 * (spark.sql.streaming.stateStore.checkpointFormatVersion=2, which real-time mode sets): the
 * id the new version's delta carries (its unique id) and the id of the version loaded, as the
 * commit log recorded it. Spark writes them to the commit log and hands the base back to the
 * next batch, so a partition loads the version its last committed batch wrote, not one a
 * failed or zombie attempt left behind. `checkedBase` is the base the worker checks the loaded
 * state against: none when this task adopted Spark's own state (whose id is Spark's).
 */
case class CheckpointIds(next: Option[String], base: Option[String], checkedBase: Option[String])

object CheckpointIds {
  val None: CheckpointIds = CheckpointIds(scala.None, scala.None, scala.None)

  def forTask(info: StatefulOperatorStateInfo, partitionId: Int, enabled: Boolean,
      adopted: Boolean): CheckpointIds =
    if (!enabled) None else {
      val base = info.getStateStoreCkptId(partitionId).flatMap(ids => Option(ids).flatMap(_.headOption))
      CheckpointIds(Some(java.util.UUID.randomUUID().toString), base,
        if (adopted) scala.None else base)
    }
}
