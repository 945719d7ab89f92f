package org.apache.spark.sql.arrowstate.testing

import java.io.IOException

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataInputStream, Path, PathFilter}

import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager

/**
 * A checkpoint file manager (`spark.sql.streaming.checkpointFileManagerClass`) that fails
 * chosen calls, in the spirit of Spark's FailureInjectionFileSystem. Rules are armed from
 * the test through py4j (driver and executors share the JVM in local mode):
 * `FailureInjection.arm(op, pathRegex, times)`, op one of createAtomic, write, close (the
 * rename that publishes the file), afterClose (published, then the call fails), open, list,
 * delete.
 */
class FailureInjectionFileManager(path: Path, hadoopConf: Configuration)
  extends CheckpointFileManager {

  private val inner = new FileContextBasedCheckpointFileManager(path, hadoopConf)

  override def createAtomic(path: Path, overwriteIfPossible: Boolean)
    : CancellableFSDataOutputStream = {
    FailureInjection.check("createAtomic", path)
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

  override def close(): Unit = {
    FailureInjection.check("close", path)
    underlying.close()
    FailureInjection.check("afterClose", path)
  }

  override def cancel(): Unit = underlying.cancel()
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

  def reset(): Unit = synchronized { rules.clear(); hits.clear() }

  def check(op: String, path: Path): Unit = {
    val fail = synchronized {
      rules.find(r => r.op == op && r.remaining > 0 && path.toString.matches(r.pattern))
        .map { r => r.remaining -= 1; hits(op) += 1; r }
    }
    fail.foreach(r => throw new IOException(s"injected failure: $op of $path (${r.pattern})"))
  }
}
