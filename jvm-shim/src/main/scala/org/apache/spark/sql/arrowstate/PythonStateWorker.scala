package org.apache.spark.sql.arrowstate

import java.io._
import java.nio.channels.Channels
import java.nio.charset.StandardCharsets.UTF_8

import scala.collection.mutable

import org.apache.spark.api.python.{PythonWorker, PythonWorkerHandle}

/**
 * One Python process that holds the state of any number of operator partitions, and the
 * JVM side's one codec of the conversation with it: every frame (tags in contract.json;
 * integers big-endian, byte strings length-prefixed, Arrow batches as IPC streams) is
 * written and read here; python/arrowstate/protocol.py is its Python twin.
 */
class PythonStateWorker(
    val handle: PythonWorker, process: Option[PythonWorkerHandle], val id: Int,
    @volatile var owner: Option[String], val pythonExec: String,
    val envVars: Map[String, String]) {
  private val channel = handle.channel
  if (!channel.isBlocking) {
    // Spark's factory hands out a channel registered with a selector; we use plain streams.
    Option(handle.selectionKey).foreach(_.cancel())
    Option(handle.selector).foreach(_.selectNow())
    channel.configureBlocking(true)
  }
  channel.socket().setTcpNoDelay(true)
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
  private def exitedUnasked(cause: Throwable): IOException = {
    val waited = process.forall { p =>
      val deadline = System.currentTimeMillis() + 2000
      while (p.isAlive() && System.currentTimeMillis() < deadline) Thread.sleep(20)
      !p.isAlive()
    }
    val lastWords = process.flatMap(_.terminationDiagnostics()).map(_.trim).filter(_.nonEmpty)
    new IOException(
      s"arrowstate: Python state worker $id ($pythonExec) exited unexpectedly" +
        (if (waited) "" else " (still running after its connection closed)") +
        lastWords.map(w => s"; its last output:\n$w").getOrElse(
          " without a message (see the executor log for its output)"), cause)
  }

  private def writeBytes(b: Array[Byte]): Unit = {
    out.writeInt(b.length)
    out.write(b)
  }

  private def readBytes(): Array[Byte] = {
    val n = in.readInt()
    val b = new Array[Byte](n)
    in.readFully(b)
    b
  }

  /** The next frame's tag; an ERROR frame becomes an exception with the Python traceback. */
  private def readTag(): Int = {
    val tag = try in.readInt() catch {
      case e: EOFException => throw exitedUnasked(e)
    }
    if (tag == Contract.Frame.Error) throw ArrowStatePythonException.fromFrame(readBytes())
    tag
  }

  private def expect(tag: Int, what: String): Unit = {
    val got = readTag()
    if (got != tag) {
      throw new IllegalStateException(s"arrowstate: expected $what from Python, got frame $got")
    }
  }

  // -- a task (contract.json's worker docstring: header ... COMMITTED) --

  /** Opens a task: the protocol version, the header and the schema of the rows sent. */
  def beginTask(headerJson: Array[Byte], inputSchemaIpc: Array[Byte]): Unit = {
    out.writeInt(Contract.ProtocolVersion)
    writeBytes(headerJson)
    writeBytes(inputSchemaIpc)
    out.flush()
  }

  /** Serves the state files the worker reads until it sends `until` (None) or a DATA
   * batch (that batch). */
  def serveFilesUntil(until: Int, files: StateFiles): Option[Array[Byte]] = {
    var tag = readTag()
    while (tag != until && tag != Contract.Frame.Data) {
      serveFileRequest(tag, files)
      tag = readTag()
    }
    if (tag == Contract.Frame.Data) Some(readBytes()) else None
  }

  /** A frame of `tag` and one Arrow batch (DATA, LOOKUP, INITIAL_STATE); flushed or not. */
  def sendBatch(tag: Int, batchIpc: Array[Byte], flush: Boolean = true): Unit = {
    out.writeInt(tag)
    writeBytes(batchIpc)
    if (flush) out.flush()
  }

  /** A frame of its tag alone (END, COMMITTED). */
  def send(tag: Int): Unit = {
    out.writeInt(tag)
    out.flush()
  }

  /** The next answer: DATA's batch, or None for `none` (NO_DATA, or END after the input). */
  def readBatch(none: Int): Option[Array[Byte]] = readTag() match {
    case Contract.Frame.Data => Some(readBytes())
    case `none` => None
    case other => throw new IllegalStateException(s"arrowstate: unexpected frame $other")
  }

  /** COMMIT: the new version's delta, the snapshots the worker finished meanwhile
   * (version, bytes) and the version below which files may be pruned. */
  def readCommit(): (Array[Byte], Seq[(Long, Array[Byte])], Long) = {
    expect(Contract.Frame.Commit, "the commit")
    val delta = readBytes()
    val snapshots = Seq.fill(in.readInt())(in.readLong() -> readBytes())
    (delta, snapshots, in.readLong())
  }

  /** COMMITTED (the delta is written) and the worker's COMMITTED: its metrics as JSON. */
  def confirmCommitted(): String = {
    send(Contract.Frame.Committed)
    expect(Contract.Frame.Committed, "the commit's confirmation")
    new String(readBytes(), UTF_8)
  }

  // -- requests outside tasks --

  /** DROP: the worker forgets these partitions' state; its resident bytes after. */
  def drop(keys: Seq[String]): Long = {
    out.writeInt(Contract.Frame.Drop)
    out.writeInt(keys.size)
    keys.foreach(k => writeBytes(k.getBytes(UTF_8)))
    out.flush()
    expect(Contract.Frame.Drop, "the drop's confirmation")
    in.readLong()
  }

  /** READ_STATE: the request (JSON); batches follow as DATA until END (readBatch). */
  def requestState(requestJson: Array[Byte]): Unit = {
    out.writeInt(Contract.Frame.ReadState)
    writeBytes(requestJson)
    out.flush()
  }

  /** IMPORT_STATE: the request (JSON) and the schema of the rows that follow as DATA. */
  def beginImport(requestJson: Array[Byte], schemaIpc: Array[Byte]): Unit = {
    out.writeInt(Contract.Frame.ImportState)
    writeBytes(requestJson)
    writeBytes(schemaIpc)
  }

  /** After the imported rows' END: the snapshot the worker made of them. */
  def readImportedSnapshot(): Array[Byte] = {
    send(Contract.Frame.End)
    val snapshot = readBatch(none = Contract.Frame.End).getOrElse(
      throw new IllegalStateException("arrowstate: no snapshot from Python"))
    expect(Contract.Frame.End, "END after the snapshot")
    snapshot
  }

  /** Answers the worker's request for the state files it decides to read (the store's
   * lifecycle lives in Python); any other frame is a protocol error. */
  private def serveFileRequest(tag: Int, files: StateFiles): Unit = {
    tag match {
      case Contract.Frame.ListFiles =>
        val names = files.names()
        out.writeInt(names.size)
        names.foreach(n => writeBytes(n.getBytes(UTF_8)))
      case Contract.Frame.ReadFile =>
        writeBytes(files.read(new String(readBytes(), UTF_8)))
      case Contract.Frame.FileTail =>
        val name = new String(readBytes(), UTF_8)
        writeBytes(files.tail(name, in.readInt()))
      case other =>
        throw new IllegalStateException(s"arrowstate: unexpected frame $other from Python")
    }
    out.flush()
  }
}
