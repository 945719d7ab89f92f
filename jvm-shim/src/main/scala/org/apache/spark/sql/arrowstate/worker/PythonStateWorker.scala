package org.apache.spark.sql.arrowstate.worker

import java.io._
import java.nio.channels.Channels

import scala.collection.mutable

import org.json4s.JValue

import org.apache.spark.api.python.{PythonWorker, PythonWorkerHandle}
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, CheckedJson, Contract}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.{StateFiles, StateMaintenance}

/**
 * One Python process that holds the state of any number of operator partitions: its
 * connection, and the conversation's requests and answers as typed calls (the frames
 * themselves are FrameCodec's, from contract.json).
 */
class PythonStateWorker(
    val handle: PythonWorker, process: Option[PythonWorkerHandle], val id: Int,
    val owner: Option[String], val pythonExec: String,
    val envVars: Map[String, String], val daemonModule: String) extends PooledWorker {
  private val channel = handle.channel
  if (!channel.isBlocking) {
    // Spark's factory hands out a channel registered with a selector; we use plain streams.
    Option(handle.selectionKey).foreach(_.cancel())
    Option(handle.selector).foreach(_.selectNow())
    channel.configureBlocking(true)
  }
  // small frames go at once on TCP; a Unix domain socket (spark.python.unix.domain.socket
  // .enabled) has no such option, and its channel has no Socket view at all
  if (channel.getLocalAddress.isInstanceOf[java.net.InetSocketAddress]) {
    channel.socket().setTcpNoDelay(true)
  }
  private val in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(channel), 1 << 16))
  private val out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(channel), 1 << 16))
  /** State keys whose copy in this process went stale because another worker took them over. */
  val staleStateKeys: mutable.Set[String] = mutable.Set.empty
  /** When it was last given back (for the idle timeout). */
  @volatile var idleSince: Long = System.currentTimeMillis()

  def isAlive: Boolean = channel.isOpen && process.forall(_.isAlive)

  /** Ends the process without its factory (closing the socket ends its serve loop too). */
  def kill(): Unit = {
    try channel.close() catch { case _: Exception => }
    process.foreach(_.destroy())
    forgetFaultLog()
  }

  /** Removes what a stopped worker left in the fault log directory. */
  def forgetFaultLog(): Unit =
    try process.foreach(_.terminationDiagnostics()) catch { case _: Exception => }

  /** The worker closed the connection unasked: its exit status and last words, when the
   * process left them (a Python error or a crash's traceback). */
  private def exitedUnasked(cause: Throwable): ArrowStateException = {
    val waited = process.forall { p =>
      val deadline = System.currentTimeMillis() + 2000
      while (p.isAlive() && System.currentTimeMillis() < deadline) Thread.sleep(20)
      !p.isAlive()
    }
    val lastWords = process.flatMap(_.terminationDiagnostics()).map(_.trim).filter(_.nonEmpty)
    new ArrowStateException(ArrowStateException.WorkerExited, Map("worker" -> id.toString,
      "pythonExec" -> pythonExec, "lastOutput" -> lastWords.getOrElse("")),
      s"arrowstate: Python state worker $id ($pythonExec) exited unexpectedly" +
        (if (waited) "" else " (still running after its connection closed)") +
        lastWords.map(w => s"; its last output:\n$w").getOrElse(
          " without a message (see the executor log for its output)"), cause)
  }

  private val codec = new FrameCodec(in, out)
  // HELLO opens the connection; its answer is read before the first answer to anything else
  // (so the first request costs no extra round trip)
  codec.write(Contract.Frame.Hello, Contract.ProtocolVersion, ArrowStateVersion.version)
  private var helloAnswered = false

  /** The next frame from the worker, one of `expected` (ERROR raised as its exception; the
   * connection closed unasked raised with the worker's last words). */
  private def read(expected: Contract.FrameSpec*): (Contract.FrameSpec, IndexedSeq[Any]) = {
    def next(frames: Contract.FrameSpec*) =
      try codec.read(frames: _*) catch { case e: EOFException => throw exitedUnasked(e) }
    if (!helloAnswered) {
      val (_, Seq(version: Int, packageVersion: String)) = next(Contract.Frame.Hello)
      if (version != Contract.ProtocolVersion || packageVersion != ArrowStateVersion.version) {
        throw new ArrowStateException(ArrowStateException.ProtocolMismatch,
          Map("jvmVersion" -> Contract.ProtocolVersion.toString,
            "workerVersion" -> version.toString, "shimVersion" -> ArrowStateVersion.version,
            "packageVersion" -> packageVersion),
          s"the JVM shim speaks protocol ${Contract.ProtocolVersion} (shim " +
            s"${ArrowStateVersion.version}) but the Python state worker ($pythonExec) speaks " +
            s"$version (package $packageVersion); install one build of both (`python -m " +
            "arrowstate build` rebuilds the jar)")
      }
      helloAnswered = true
    }
    next(expected: _*)
  }

  /** Reads a streamed file the worker sends (a `chunks` field): its connection closing
   * mid-file is the worker's exit, with its last words. */
  private def streamed[T](body: => T): T =
    try body catch { case e: EOFException => throw exitedUnasked(e) }

  // -- a task (python/arrowstate/worker.py's docstring: TASK ... COMMITTED) --

  /** TASK: the task's own fields, what the executor's and the operator's tasks share
   * (checked once) and the schema of the rows sent; flushed, or left to go with the task's
   * first frame. */
  def beginTask(header: StateHeader, executor: CheckedJson, run: CheckedJson,
      inputSchemaIpc: Array[Byte], flush: Boolean): Unit = {
    codec.write(Contract.Frame.Task, header.fields ++ Seq(executor, run, inputSchemaIpc): _*)
    if (flush) codec.flush()
  }

  def flush(): Unit = codec.flush()

  /** Serves the state files the worker reads until it sends `until` (None) or a DATA
   * batch (that batch). */
  def serveFilesUntil(until: Contract.FrameSpec, files: StateFiles): Option[Array[Byte]] = {
    import Contract.Frame._
    var frame = read(until, Data, ListFiles, ReadFile, FileTail)
    while (frame._1 != until && frame._1 != Data) {
      serveFileRequest(frame._1, frame._2, files)
      frame = read(until, Data, ListFiles, ReadFile, FileTail)
    }
    if (frame._1 == Data) Some(frame._2.head.asInstanceOf[Array[Byte]]) else None
  }

  /** A frame of one Arrow batch (DATA, LOOKUP, INITIAL_STATE); flushed or not. */
  def sendBatch(frame: Contract.FrameSpec, batchIpc: Array[Byte], flush: Boolean = true): Unit = {
    codec.write(frame, batchIpc)
    if (flush) codec.flush()
  }

  /** A frame with no body (END). */
  def send(frame: Contract.FrameSpec): Unit = {
    codec.write(frame)
    codec.flush()
  }

  /** The next answer: DATA's batch, or None for `none` (NO_DATA, or END after the input). */
  def readBatch(none: Contract.FrameSpec): Option[Array[Byte]] =
    read(Contract.Frame.Data, none) match {
      case (Contract.Frame.Data, Seq(batch: Array[Byte])) => Some(batch)
      case _ => None
    }

  /** COMMIT: the files of snapshots the worker finished meanwhile (name, the local file it
   * wrote, or a small one's content), the version below which files may be pruned and the
   * run files to delete after; the columns file the delta needs, if the partition lacks it;
   * then the new version's delta, named by the worker. A delta of at most `holdBytes` is
   * read whole here (`Commit.held`), so the worker is free before it is written; a larger
   * one is read as it is written (`Commit.delta`, to its end), and the worker's COMMITTED
   * only after. Before COMMIT, the worker may list the partition's files (a snapshot that
   * names earlier run files checks they are there). */
  def readCommit(files: StateFiles, holdBytes: Int): PythonStateWorker.Commit = {
    import Contract.Frame._
    var frame = read(Commit, ListFiles)
    while (frame._1 != Commit) {
      serveFileRequest(frame._1, frame._2, files)
      frame = read(Commit, ListFiles)
    }
    val Seq(snapshots: Seq[StateMaintenance.NamedFile] @unchecked, pruneBelow: Long,
      pruneSnapshot: String, deletes: Seq[String] @unchecked, keepRuns: Seq[String] @unchecked,
      schemaFile: String, schemaBytes: Array[Byte], deltaName: String,
      delta: InputStream) = frame._2
    // one byte past the bound tells a delta that ends within it from one that goes on
    val head = streamed(delta.readNBytes(holdBytes + 1))
    val held = head.length <= holdBytes
    val rest = if (held) new ByteArrayInputStream(head) else new SequenceInputStream(
      new ByteArrayInputStream(head), new FilterInputStream(delta) {
        override def read(): Int = streamed(super.read())
        override def read(b: Array[Byte], off: Int, len: Int): Int = streamed(super.read(b, off, len))
      })
    PythonStateWorker.Commit(
      Option(schemaFile).filter(_.nonEmpty).map(_ -> schemaBytes), deltaName, rest, held,
      StateMaintenance.Job(snapshots, pruneBelow, pruneSnapshot, deletes, keepRuns.toSet))
  }

  /** The worker's COMMITTED after its COMMIT: the task's metrics. It sends them without
   * waiting for the delta's write (a task whose write fails destroys the worker). */
  def readMetrics(): Map[String, Long] =
    read(Contract.Frame.Committed)._2.head.asInstanceOf[Map[String, Long]]

  // -- requests outside tasks --

  /** DROP: the worker forgets these partitions' state; its resident bytes after. */
  def drop(keys: Seq[String]): Long = {
    codec.write(Contract.Frame.Drop, keys)
    codec.flush()
    read(Contract.Frame.Drop)._2.head.asInstanceOf[Long]
  }

  /** READ_STATE: the request; batches follow as DATA until END (readBatch). */
  def requestState(request: JValue): Unit = {
    codec.write(Contract.Frame.ReadState, request)
    codec.flush()
  }

  /** PRE_INIT: a transformWithState processor's init() for Spark's planning on the driver;
   * returns when init() has (its failure raised as the worker's error). */
  def preInit(request: JValue): Unit = {
    codec.write(Contract.Frame.PreInit, request)
    codec.flush()
    read(Contract.Frame.PreInit)
  }

  /** IMPORT_STATE: the request and the schema of the rows that follow as DATA. */
  def beginImport(request: JValue, schemaIpc: Array[Byte]): Unit =
    codec.write(Contract.Frame.ImportState, request, schemaIpc)

  /** After the imported rows' END: the snapshot the worker made of them, as it comes, to
   * `write` (which reads it to its end). */
  def readImportedSnapshot(write: InputStream => Unit): Unit = {
    send(Contract.Frame.End)
    val (_, Seq(snapshot: InputStream)) = read(Contract.Frame.ImportState)
    streamed(write(snapshot))
  }

  /** Answers the worker's request for the state files it decides to read (the store's
   * lifecycle lives in Python). */
  private def serveFileRequest(frame: Contract.FrameSpec, body: IndexedSeq[Any],
      files: StateFiles): Unit = {
    (frame, body) match {
      case (Contract.Frame.ListFiles, _) => codec.reply(frame, files.names())
      case (Contract.Frame.ReadFile, Seq(name: String)) =>
        // streamed from the filesystem: a file of any size, never whole in memory
        val in = files.open(name)
        try codec.reply(frame, FrameCodec.Chunks(in, ArrowStateConf.fileChunkBytes(SQLConf.get)))
        finally in.close()
      case (Contract.Frame.FileTail, Seq(name: String, size: Int)) =>
        codec.reply(frame, files.tail(name, size))
      case _ => throw ArrowStateException.contract(frame.name, "", "not a file request")
    }
    codec.flush()
  }
}

object PythonStateWorker {
  /** What a worker's COMMIT has the task write: the columns file (name, bytes) the delta
   * needs, if the partition lacks it, then the delta; whether the delta is `held` whole in
   * memory (else `delta` reads the rest of it from the worker's connection); and the
   * maintenance handed on after the write. */
  final case class Commit(columnsFile: Option[(String, Array[Byte])], deltaName: String,
      delta: InputStream, held: Boolean, maintenance: StateMaintenance.Job)
}
