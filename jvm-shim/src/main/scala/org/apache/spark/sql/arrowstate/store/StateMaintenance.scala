package org.apache.spark.sql.arrowstate.store

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

  /** A commit's maintenance: the snapshots' files (name, local file the worker wrote) in
   * the order to write them; the version below which files may go, once the snapshot file
   * `pruneSnapshot` exists; the run files to delete then; and the run files that retained
   * versions or snapshots in progress name (`keepRuns`: any other run file older than
   * `pruneSnapshot` is an orphan). */
  case class Job(snapshots: Seq[(String, String)], pruneBelow: Long, pruneSnapshot: String,
      deletes: Seq[String], keepRuns: Set[String])

  /** Copies the snapshots' files (deleted once copied or failed) into the checkpoint in
   * order, stopping at the first that fails (a manifest is written after its run files, or
   * not at all), then prunes, then deletes the run files no snapshot kept names and the
   * orphans (`StateFiles.prune`, from one listing). */
  def submit(files: StateFiles, job: Job): Unit =
    if (job.snapshots.nonEmpty || job.pruneBelow > 0) {
      executor.execute(() => {
        try {
          job.snapshots.foreach { case (name, local) => files.copyLocal(name, local) }
          if (job.pruneBelow > 0) {
            files.prune(job.pruneBelow, job.pruneSnapshot, job.deletes, job.keepRuns)
          }
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: state maintenance of ${files.dir} failed; its deltas " +
              "stay, so nothing is lost", e)
        } finally {
          job.snapshots.foreach { case (_, local) => new java.io.File(local).delete() }
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
