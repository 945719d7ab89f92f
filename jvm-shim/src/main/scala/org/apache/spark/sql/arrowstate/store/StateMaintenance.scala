package org.apache.spark.sql.arrowstate.store

import java.io.{ByteArrayInputStream, File}
import java.util.concurrent.{Executors, ThreadFactory}

import org.apache.spark.internal.Logging

/**
 * Writes snapshots and prunes old files off the micro-batch's path, as Spark's state store
 * maintenance does: one daemon thread per JVM, in submission order. A failed snapshot write
 * loses nothing (the deltas stay) and stops that job's pruning.
 */
object StateMaintenance extends Logging {
  private lazy val executor = Executors.newSingleThreadExecutor(new ThreadFactory {
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, "arrowstate-state-maintenance")
      t.setDaemon(true)
      t
    }
  })

  /** A file to write under `name`: from the local file `localPath` the worker wrote, or
   * (an empty path) from `content`, a small file whole (the frames' `namedFiles` item). */
  final case class NamedFile(name: String, localPath: String, content: Array[Byte])

  /** A commit's maintenance: the snapshots' files in the order to write them; the version
   * below which files may go, once the snapshot file `pruneSnapshot` exists; the run files
   * to delete then; and the run files that retained versions or snapshots in progress name
   * (`keepRuns`: any other run file older than `pruneSnapshot` is an orphan). */
  case class Job(snapshots: Seq[NamedFile], pruneBelow: Long, pruneSnapshot: String,
      deletes: Seq[String], keepRuns: Set[String])

  /** Writes the snapshots' files into the checkpoint (a local one deleted once copied or
   * failed) in order, stopping at the first that fails (a manifest is written after its
   * run files, or not at all), then prunes, then deletes the run files no snapshot kept
   * names and the orphans (`StateFiles.prune`, from one listing). */
  def submit(files: StateFiles, job: Job): Unit =
    if (job.snapshots.nonEmpty || job.pruneBelow > 0) {
      executor.execute(() => {
        try {
          job.snapshots.foreach {
            case NamedFile(name, "", content) =>
              files.write(name, new ByteArrayInputStream(content))
            case NamedFile(name, local, _) => files.copyLocal(name, local)
          }
          if (job.pruneBelow > 0) {
            files.prune(job.pruneBelow, job.pruneSnapshot, job.deletes, job.keepRuns)
          }
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: state maintenance of ${files.dir} failed; its deltas " +
              "stay, so nothing is lost", e)
        } finally {
          job.snapshots.filter(_.localPath.nonEmpty).foreach(f => new File(f.localPath).delete())
        }
      })
    }

  /** Waits for the jobs submitted so far (tests and shutdown). */
  def awaitIdle(): Unit = {
    val done = new java.util.concurrent.CountDownLatch(1)
    executor.execute(() => done.countDown())
    done.await()
  }
}
