package org.apache.spark.sql.arrowstate

import java.io.{DataOutputStream, FileNotFoundException}

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{Path, PathFilter}

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager

/**
 * The files of one operator partition's state: `<version>.arrowstate.delta` and
 * `<version>.arrowstate.snapshot` under `<checkpoint>/state/<operatorId>/<partitionId>/`.
 * The bytes are Arrow IPC written by the Python worker; this class only moves them through
 * Hadoop's filesystem layer (atomic write then rename), so any checkpoint filesystem works.
 */
class StateFiles(val dir: Path, hadoopConf: Configuration) extends Logging {
  import StateFiles._

  private lazy val fm = CheckpointFileManager.create(dir, hadoopConf)

  def deltaPath(version: Long): Path = new Path(dir, s"$version$DeltaSuffix")
  def snapshotPath(version: Long): Path = new Path(dir, s"$version$SnapshotSuffix")

  /** Every (version, isSnapshot) present in the directory. */
  def listVersions(): Seq[(Long, Boolean)] = {
    if (!fm.exists(dir)) return Nil
    fm.list(dir, OurFiles).toSeq.flatMap { st =>
      val name = st.getPath.getName
      if (name.endsWith(DeltaSuffix)) {
        name.stripSuffix(DeltaSuffix).toLongOption.map(_ -> false)
      } else {
        name.stripSuffix(SnapshotSuffix).toLongOption.map(_ -> true)
      }
    }
  }

  /** The files whose contents, applied in order, give `version`: a snapshot and deltas. */
  def chainFor(version: Long): Seq[Path] = {
    if (version <= 0) return Nil
    val present = listVersions()
    val base = present.collect { case (v, true) if v <= version => v }.maxOption.getOrElse(0L)
    val deltas = present.collect { case (v, false) if v > base && v <= version => v }.toSet
    val missing = ((base + 1) to version).filterNot(deltas.contains)
    if (missing.nonEmpty) {
      throw new FileNotFoundException(
        s"arrowstate: cannot load state version $version of $dir: missing " +
          missing.map(deltaPath).mkString(", "))
    }
    (if (base > 0) Seq(snapshotPath(base)) else Nil) ++
      ((base + 1) to version).map(deltaPath)
  }

  def read(path: Path): Array[Byte] = {
    val in = fm.open(path)
    try in.readAllBytes() finally in.close()
  }

  /** Atomic write: readers see the old file or the whole new one; the last complete one wins. */
  def write(path: Path, bytes: Array[Byte]): Unit = {
    if (!createdDirs.contains(dir.toString)) {
      fm.mkdirs(dir)
      createdDirs.add(dir.toString)
    }
    val out = fm.createAtomic(path, true)
    try {
      new DataOutputStream(out).write(bytes)
      out.close()
    } catch {
      case e: Throwable =>
        out.cancel()
        throw e
    }
  }

  /**
   * Deletes files no longer needed to load any of the newest `minVersionsToRetain` versions:
   * everything older than the newest snapshot at or below the oldest retained version.
   */
  def cleanup(latestVersion: Long, minVersionsToRetain: Int): Unit = {
    val oldestRetained = latestVersion - minVersionsToRetain + 1
    if (oldestRetained <= 0) return
    val present = listVersions()
    val base = present.collect { case (v, true) if v <= oldestRetained => v }.maxOption
    base.foreach { b =>
      present.foreach { case (v, isSnapshot) =>
        if (v < b) fm.delete(if (isSnapshot) snapshotPath(v) else deltaPath(v))
      }
    }
  }
}

object StateFiles {
  val DeltaSuffix = ".arrowstate.delta"
  val SnapshotSuffix = ".arrowstate.snapshot"

  /** Directories this JVM already made, so a steady-state commit does no mkdirs call. */
  private val createdDirs = java.util.concurrent.ConcurrentHashMap.newKeySet[String]()

  private object OurFiles extends PathFilter {
    override def accept(p: Path): Boolean = {
      val n = p.getName
      n.endsWith(DeltaSuffix) || n.endsWith(SnapshotSuffix)
    }
  }

  def partitionDir(checkpointLocation: String, operatorId: Long, partitionId: Int): Path =
    new Path(new Path(checkpointLocation, operatorId.toString), partitionId.toString)
}
