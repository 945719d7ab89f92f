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

  def submit(files: StateFiles, snapshots: Seq[(Long, Array[Byte])], pruneBelow: Long): Unit =
    if (snapshots.nonEmpty || pruneBelow > 0) {
      executor.execute(() => {
        try {
          snapshots.foreach { case (v, bytes) =>
            files.write(s"$v${StateFiles.SnapshotSuffix}", bytes)
          }
          if (pruneBelow > 0) files.pruneBelow(pruneBelow)
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: state maintenance of ${files.dir} failed; its deltas " +
              "stay, so nothing is lost", e)
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
