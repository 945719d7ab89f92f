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

  /** Copies the snapshots (local files the worker wrote, deleted once copied or failed)
   * into the checkpoint, then prunes. */
  def submit(files: StateFiles, snapshots: Seq[(Long, String)], pruneBelow: Long): Unit =
    if (snapshots.nonEmpty || pruneBelow > 0) {
      executor.execute(() => {
        try {
          snapshots.foreach { case (v, local) =>
            files.copyLocal(s"$v${StateFiles.SnapshotSuffix}", local)
          }
          if (pruneBelow > 0) files.pruneBelow(pruneBelow)
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: state maintenance of ${files.dir} failed; its deltas " +
              "stay, so nothing is lost", e)
        } finally {
          snapshots.foreach { case (_, local) => new java.io.File(local).delete() }
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
