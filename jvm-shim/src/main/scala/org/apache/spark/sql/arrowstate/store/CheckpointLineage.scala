package org.apache.spark.sql.arrowstate.store

import java.nio.charset.StandardCharsets

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.json4s.{JArray, JString}
import org.json4s.jackson.JsonMethods

import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

/**
 * Checkpoint format v2's lineage, the JVM's part
 * (spark.sql.streaming.stateStore.checkpointFormatVersion=2, which real-time mode sets): a
 * task's checkpoint ids, the id of the version it commits (its files carry it in their
 * names, `<version>_<id>.arrowstate.*`, and `StateFiles` never writes over such a name) and
 * the id of the version it loads, as the commit log recorded it. Spark writes them to the
 * commit log and hands the base back to the next batch, so a partition loads the lineage
 * its last committed batch wrote, never files a failed, speculative or zombie attempt left
 * beside it (the Python store follows the lineage: its `store.lineage`). `checkedBase` is
 * the base the worker loads by: none when this task adopted Spark's own state (whose id is
 * Spark's).
 */
case class CheckpointIds(next: Option[String], base: Option[String], checkedBase: Option[String])

object CheckpointIds {
  val None: CheckpointIds = CheckpointIds(scala.None, scala.None, scala.None)

  def forTask(info: StatefulOperatorStateInfo, partitionId: Int, enabled: Boolean,
      adopted: Boolean): CheckpointIds =
    if (!enabled) None else {
      val base = committedBase(info, partitionId)
      CheckpointIds(Some(java.util.UUID.randomUUID().toString), base,
        if (adopted) scala.None else base)
    }

  /** The id the commit log names for the version a task of this partition loads (format
   * v2; none under v1). */
  def committedBase(info: StatefulOperatorStateInfo, partitionId: Int): Option[String] =
    info.getStateStoreCkptId(partitionId).flatMap(ids => Option(ids).flatMap(_.headOption))
}

object CheckpointLineage {
  /**
   * The checkpoint id Spark's commit log recorded for `version` of an operator partition
   * (`<checkpoint>/commits/<version - 1>`, whose batch committed that version), for a reader
   * that hands none on (Spark's `statestore` reader of a real-time query's checkpoint):
   * None when the log has no entry or no ids (format v1).
   */
  def committedId(stateRoot: String, operatorId: Long, partitionId: Int, version: Long,
      hadoopConf: Configuration): Option[String] =
    committedIds(stateRoot, operatorId, version, hadoopConf).lift(partitionId).flatten

  /** `committedId` of every partition of the operator, by partition, from one read of the
   * commit log (empty when the log has no entry or no ids). */
  def committedIds(stateRoot: String, operatorId: Long, version: Long,
      hadoopConf: Configuration): Seq[Option[String]] = {
    val entry = new Path(new Path(new Path(stateRoot).getParent, "commits"), (version - 1).toString)
    val fs = entry.getFileSystem(hadoopConf)
    if (version < 1 || !fs.exists(entry)) return Nil
    val in = fs.open(entry)
    val text = try new String(in.readAllBytes(), StandardCharsets.UTF_8) finally in.close()
    text.linesIterator.drop(1).nextOption().toSeq.flatMap { json =>
      JsonMethods.parse(json) \ "stateUniqueIds" \ operatorId.toString match {
        case JArray(partitions) => partitions.map {
          case JArray(JString(id) :: _) => Some(id)
          case _ => None
        }
        case _ => Nil
      }
    }
  }
}
