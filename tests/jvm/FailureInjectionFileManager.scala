package org.apache.spark.sql.arrowstate.testing

import java.io.IOException
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Paths, StandardOpenOption}

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataInputStream, Path, PathFilter}

import org.apache.spark.TaskContext
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager

/**
 * A checkpoint file manager (`spark.sql.streaming.checkpointFileManagerClass`) that fails
 * chosen calls, in the spirit of Spark's FailureInjectionFileSystem. Rules are armed from
 * the test through py4j (driver and executors share the JVM in local mode):
 * `FailureInjection.arm(op, pathRegex, times)`, op one of createAtomic, write, close (the
 * rename that publishes the file), afterClose (published, then the call fails), delayClose
 * (the close fails and the file is published later, by `releaseDelayed`: a late attempt's
 * file), open, list, delete; and lentAtClose, which fails nothing (`recordLent`). On a
 * cluster, whose executors are other JVMs, the Hadoop configuration carries
 * the one rule used there: `arrowstate.test.slowFirstAttempt` = `<path regex>=<ms>` makes
 * the first attempt of a task wait (uninterruptibly) before it creates a matching file, and
 * `arrowstate.test.attemptLog` names a local file where each such creation is logged.
 */
class FailureInjectionFileManager(path: Path, hadoopConf: Configuration)
  extends CheckpointFileManager {

  private val inner = new FileContextBasedCheckpointFileManager(path, hadoopConf)
  private val slowFirstAttempt = Option(hadoopConf.get("arrowstate.test.slowFirstAttempt"))
  private val attemptLog = Option(hadoopConf.get("arrowstate.test.attemptLog"))

  override def createAtomic(path: Path, overwriteIfPossible: Boolean)
    : CancellableFSDataOutputStream = {
    FailureInjection.check("createAtomic", path)
    slowFirstAttempt.foreach { rule =>
      val cut = rule.lastIndexOf('=')
      if (path.toString.matches(rule.take(cut))) {
        val attempt = Option(TaskContext.get()).map(_.attemptNumber()).getOrElse(-1)
        attemptLog.foreach { log =>
          Files.write(Paths.get(log), s"$attempt $path\n".getBytes(UTF_8),
            StandardOpenOption.CREATE, StandardOpenOption.APPEND)
        }
        if (attempt == 0) FailureInjection.sleepThroughInterrupts(rule.drop(cut + 1).toLong)
      }
    }
    new InjectingStream(inner.createAtomic(path, overwriteIfPossible), path)
  }

  override def open(path: Path): FSDataInputStream = {
    FailureInjection.check("open", path)
    inner.open(path)
  }

  override def list(path: Path, filter: PathFilter): Array[org.apache.hadoop.fs.FileStatus] = {
    FailureInjection.check("list", path)
    inner.list(path, filter)
  }

  override def mkdirs(path: Path): Unit = inner.mkdirs(path)
  override def exists(path: Path): Boolean = inner.exists(path)

  override def delete(path: Path): Unit = {
    FailureInjection.check("delete", path)
    inner.delete(path)
  }

  override def isLocal: Boolean = inner.isLocal
  override def createCheckpointDirectory(): Path = inner.createCheckpointDirectory()
}

class InjectingStream(underlying: CancellableFSDataOutputStream, path: Path)
  extends CancellableFSDataOutputStream(underlying) {

  override def write(b: Array[Byte], off: Int, len: Int): Unit = {
    FailureInjection.check("write", path)
    super.write(b, off, len)
  }

  @volatile private var delayed = false

  override def close(): Unit = if (!delayed) {
    FailureInjection.check("close", path)
    if (FailureInjection.delays(this, path)) {
      delayed = true
      throw new IOException(s"injected failure: close of $path delayed (the file is " +
        "published later, by FailureInjection.releaseDelayed)")
    }
    FailureInjection.recordLent(path)
    underlying.close()
    FailureInjection.check("afterClose", path)
  }

  // a delayed stream is a late attempt's: nothing its writer does stops it from landing
  override def cancel(): Unit = if (!delayed) underlying.cancel()

  /** Publishes the file of a delayed close, as the late attempt would. */
  private[testing] def release(): Unit = underlying.close()
}

object FailureInjection {
  private case class Rule(op: String, pattern: String, var remaining: Int)
  private val rules = mutable.ArrayBuffer[Rule]()
  private val hits = mutable.Map[String, Int]().withDefaultValue(0)

  def arm(op: String, pattern: String, times: Int): Unit = synchronized {
    rules += Rule(op, pattern, times)
  }

  def disarm(): Unit = synchronized { rules.clear() }

  /** How many calls failed so far for this op (all ops: "*"). */
  def failures(op: String): Int = synchronized {
    if (op == "*") hits.values.sum else hits(op)
  }

  def reset(): Unit = synchronized {
    rules.clear(); hits.clear(); delayedStreams.clear(); lent.clear()
  }

  private val lent = mutable.ArrayBuffer[Int]()

  /** A `lentAtClose` rule (no failure): records how many state workers are lent to tasks
   * as a matching file is published (`lentAtCloses`). */
  private[testing] def recordLent(path: Path): Unit = {
    take("lentAtClose", path).foreach { _ =>
      // the shim's classes are the task's class loader's (spark.jars), not this jar's
      val workers = Class.forName("org.apache.spark.sql.arrowstate.worker.PythonStateWorkers$",
        true, Thread.currentThread().getContextClassLoader)
      val n = workers.getMethod("lent").invoke(workers.getField("MODULE$").get(null))
        .asInstanceOf[Int]
      synchronized(lent += n)
    }
  }

  def lentAtCloses(): Array[Int] = synchronized(lent.toArray)

  /** Sleeps `ms` even if the task is killed meanwhile, and swallows the kill's interrupt,
   * so that a killed attempt still writes its file after the commit, as a zombie whose
   * connection came back does (with the interrupt set, the upload that follows fails). */
  def sleepThroughInterrupts(ms: Long): Unit = {
    val until = System.currentTimeMillis() + ms
    while (System.currentTimeMillis() < until) {
      try Thread.sleep(math.max(1L, until - System.currentTimeMillis())) catch {
        case _: InterruptedException =>
      }
    }
  }

  private val delayedStreams = mutable.ArrayBuffer[InjectingStream]()

  /** Whether a `delayClose` rule holds this stream's close back (Spark's failure-injection
   * suite's createAtomicDelayCloseRegex): the writer sees its close fail, and the file
   * appears only when the test releases it, as a late attempt's file does. */
  private[testing] def delays(stream: InjectingStream, path: Path): Boolean = synchronized {
    val rule = take("delayClose", path)
    rule.foreach { _ =>
      hits("delayClose") += 1
      delayedStreams += stream
    }
    rule.isDefined
  }

  /** Publishes every file whose close was delayed, in the order they were held; how many. */
  def releaseDelayed(): Int = {
    val streams = synchronized { val s = delayedStreams.toList; delayedStreams.clear(); s }
    streams.foreach(_.release())
    streams.size
  }

  def check(op: String, path: Path): Unit = {
    val fail = synchronized(take(op, path).map { r => hits(op) += 1; r })
    fail.foreach(r => throw new IOException(s"injected failure: $op of $path (${r.pattern})"))
  }

  /** The first armed rule of `op` that matches `path`, one of its times used. */
  private def take(op: String, path: Path): Option[Rule] = synchronized {
    rules.find(r => r.op == op && r.remaining > 0 && path.toString.matches(r.pattern))
      .map { r => r.remaining -= 1; r }
  }
}
