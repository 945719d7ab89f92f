package org.apache.spark.sql.arrowstate.worker

import java.io.{DataInputStream, DataOutputStream, EOFException, InputStream}
import java.nio.charset.StandardCharsets.UTF_8

import org.json4s.{JNull, JValue}
import org.json4s.jackson.JsonMethods

import org.apache.spark.sql.arrowstate.contract.Contract.FrameSpec
import org.apache.spark.sql.arrowstate.contract.{CheckedJson, Contract, ContractSchema, JsonText}
import org.apache.spark.sql.arrowstate.errors.{ArrowStateException, ArrowStatePythonException}
import org.apache.spark.sql.arrowstate.store.StateMaintenance.NamedFile

/**
 * The JVM side's one codec of the conversation with a Python state worker: every frame is a
 * tag and a body whose fields contract.json declares (`frames`, types in `frameTypes`),
 * written and read here from that declaration. Integers are big-endian, byte strings
 * length-prefixed, Arrow batches self-contained IPC streams, JSON payloads checked against
 * their schemas (ContractSchema) as they cross. python/arrowstate/protocol.py is its twin.
 *
 * Values by type: int Int, long Long, bytes/arrow Array[Byte], string String, strings
 * Seq[String], namedFiles Seq[NamedFile], metrics Map[String, Long], json:* JValue,
 * optionalJson:* a JValue or JNull (none), sharedJson:* a CheckedJson (checked and rendered
 * once where it was made) or a JValue;
 * chunks (a file of any size, streamed) FrameCodec.Chunks to write, and read as an
 * InputStream over the chunks as they come, which the caller reads to its end before the
 * next frame.
 */
class FrameCodec(in: DataInputStream, out: DataOutputStream) {
  import FrameCodec._

  private var chunkBuffer = Array.emptyByteArray
  /** The last `chunks` value read, which must be read to its end before the next frame. */
  private var streaming: Option[ChunkedInput] = None

  /** Frame `frame` as the JVM sends it, unflushed. */
  def write(frame: FrameSpec, values: Any*): Unit = {
    val fields = frame.fromJvm.getOrElse(throw ArrowStateException.contract(
      frame.name, "", "the JVM does not send this frame"))
    out.writeInt(frame.tag)
    writeBody(frame, fields, values)
  }

  /** The reply to the worker's request `frame`, unflushed: tagged with the request's tag, so
   * the worker tells it from the task's input sent before it. */
  def reply(frame: FrameSpec, values: Any*): Unit = {
    val fields = frame.reply.getOrElse(throw ArrowStateException.contract(
      frame.name, "", "this frame has no reply"))
    out.writeInt(frame.tag)
    writeBody(frame, fields, values)
  }

  def flush(): Unit = out.flush()

  private def writeBody(frame: FrameSpec, fields: Seq[(String, String)], values: Seq[Any])
    : Unit = {
    if (fields.size != values.size) {
      throw ArrowStateException.contract(frame.name, "",
        s"${values.size} values for fields ${fields.map(_._1).mkString(", ")}")
    }
    fields.zip(values).foreach { case ((name, kind), value) =>
      writeValue(frame.name, name, kind, value)
    }
  }

  private def writeBytes(b: Array[Byte]): Unit = {
    out.writeInt(b.length)
    out.write(b)
  }

  /** A stream's bytes as chunks of at most `chunkBytes`, then the empty chunk. */
  private def writeChunks(source: InputStream, chunkBytes: Int): Unit = {
    if (chunkBuffer.length != chunkBytes) chunkBuffer = new Array[Byte](chunkBytes)
    var n = source.readNBytes(chunkBuffer, 0, chunkBytes)
    while (n > 0) {
      out.writeInt(n)
      out.write(chunkBuffer, 0, n)
      // a short chunk is the stream's last
      n = if (n < chunkBytes) 0 else source.readNBytes(chunkBuffer, 0, chunkBytes)
    }
    out.writeInt(0)
  }

  private def writeValue(frame: String, field: String, kind: String, value: Any): Unit =
    (kind, value) match {
      case ("chunks", Chunks(source, chunkBytes)) if chunkBytes > 0 =>
        writeChunks(source, chunkBytes)
      case ("int", v: Int) => out.writeInt(v)
      case ("long", v: Long) => out.writeLong(v)
      case ("bytes" | "arrow", v: Array[Byte]) => writeBytes(v)
      case ("string", v: String) => writeBytes(v.getBytes(UTF_8))
      case ("strings", v: Seq[_]) =>
        out.writeInt(v.size)
        v.foreach(s => writeValue(frame, field, "string", s))
      case ("namedFiles", v: Seq[_]) =>
        out.writeInt(v.size)
        v.foreach {
          case NamedFile(name, localPath, content) =>
            writeBytes(name.getBytes(UTF_8)); writeBytes(localPath.getBytes(UTF_8))
            writeBytes(content)
          case other => throw ArrowStateException.contract(frame, field,
            s"a namedFiles item must be a NamedFile, not $other")
        }
      case ("metrics", v: Map[_, _]) =>
        out.writeInt(v.size)
        v.foreach {
          case (name: String, value: Long) if Contract.MetricPlaces.contains(name) =>
            out.writeInt(Contract.MetricPlaces(name)); out.writeLong(value)
          case (name, value) => throw ArrowStateException.contract(frame, s"$field.$name",
            s"$name=$value is not a declared metric's Long value")
        }
      case (optional, JNull) if optional.startsWith("optionalJson:") =>
        writeBytes(Array.emptyByteArray)
      case (json, v: JValue) if json.startsWith("json:") || json.startsWith("sharedJson:") ||
          json.startsWith("optionalJson:") =>
        ContractSchema.check(json.substring(json.indexOf(':') + 1), v)
        writeBytes(JsonText.compact(v).getBytes(UTF_8))
      case (shared, v: CheckedJson) if shared == s"sharedJson:${v.payload}" =>
        writeBytes(v.bytes)
      case _ => throw ArrowStateException.contract(frame, field,
        s"must be $kind, not ${Option(value).map(_.getClass.getName).orNull}")
    }

  private def readBytes(): Array[Byte] = {
    val b = new Array[Byte](in.readInt())
    in.readFully(b)
    b
  }

  private def readValue(frame: String, field: String, kind: String): Any = kind match {
    case "int" => in.readInt()
    case "long" => in.readLong()
    case "bytes" | "arrow" => readBytes()
    case "string" => new String(readBytes(), UTF_8)
    case "strings" => Seq.fill(in.readInt())(new String(readBytes(), UTF_8))
    case "namedFiles" =>
      Seq.fill(in.readInt())(NamedFile(new String(readBytes(), UTF_8),
        new String(readBytes(), UTF_8), readBytes()))
    case "metrics" =>
      Seq.fill(in.readInt()) {
        val place = in.readInt()
        val value = in.readLong()
        val metric = Contract.Metrics.lift(place).getOrElse(throw ArrowStateException.contract(
          frame, field, s"no metric is declared at place $place"))
        metric.name -> value
      }.toMap
    case "chunks" =>
      val stream = new ChunkedInput(frame, field)
      streaming = Some(stream)
      stream
    case json if json.startsWith("json:") || json.startsWith("sharedJson:") ||
        json.startsWith("optionalJson:") =>
      val text = readBytes()
      if (text.isEmpty && json.startsWith("optionalJson:")) JNull else {
        val v = JsonMethods.parse(new String(text, UTF_8))
        ContractSchema.check(json.substring(json.indexOf(':') + 1), v)
        v
      }
    case other => throw ArrowStateException.contract(frame, field, s"unknown type $other")
  }

  private def readBody(frame: FrameSpec, fields: Seq[(String, String)]): IndexedSeq[Any] =
    fields.map { case (name, kind) => readValue(frame.name, name, kind) }.toIndexedSeq

  /** The worker's next frame (its tag read already by `readTag`), one of `expected`, and its
   * body's values; an ERROR frame is raised as the worker's exception. */
  def readFrom(tag: Int, expected: FrameSpec*): (FrameSpec, IndexedSeq[Any]) = {
    val frame = Contract.FramesByTag.getOrElse(tag, throw ArrowStateException.contract(
      s"tag $tag", "", s"expected ${expected.map(_.name).mkString(" or ")} from Python, " +
        s"got an unknown tag $tag"))
    val fields = frame.fromPython.getOrElse(throw ArrowStateException.contract(frame.name, "",
      "the worker does not send this frame"))
    val body = readBody(frame, fields)
    if (frame == Contract.Frame.Error) throw ArrowStatePythonException.fromPayload(
      body.head.asInstanceOf[JValue])
    if (!expected.contains(frame)) {
      throw ArrowStateException.contract(frame.name, "",
        s"expected ${expected.map(_.name).mkString(" or ")} from Python, got ${frame.name}")
    }
    frame -> body
  }

  def readTag(): Int = {
    streaming.filterNot(_.ended).foreach { s =>
      throw ArrowStateException.contract(s.frame, s.field,
        "the next frame was read before this streamed file was read to its end")
    }
    streaming = None
    in.readInt()
  }

  /** A `chunks` field as it comes: the bytes of each chunk in turn, ended by the empty one.
   * Nothing is sized to the whole file (a chunk's bytes go straight to the caller's
   * buffer). A stream that ends before the empty chunk is an EOFException naming the field. */
  final class ChunkedInput private[FrameCodec] (val frame: String, val field: String)
      extends InputStream {
    private var left = 0      // bytes of the current chunk not read yet
    private var done = false  // the empty chunk was read

    def ended: Boolean = done

    private def truncated(e: EOFException): EOFException = {
      val t = new EOFException(s"arrowstate: the streamed $frame.$field ended before its " +
        "last chunk (the worker's connection closed mid-file)")
      t.initCause(e)
      t
    }

    /** Whether bytes are left, reading the next chunk's length when the current one is. */
    private def more(): Boolean = {
      if (!done && left == 0) {
        val n = try in.readInt() catch { case e: EOFException => throw truncated(e) }
        if (n < 0) throw ArrowStateException.contract(frame, field, s"a chunk of length $n")
        if (n == 0) done = true else left = n
      }
      !done
    }

    override def read(): Int =
      if (!more()) -1
      else {
        val b = in.read()
        if (b < 0) throw truncated(new EOFException())
        left -= 1
        b
      }

    override def read(b: Array[Byte], off: Int, len: Int): Int =
      if (len == 0) 0
      else if (!more()) -1
      else {
        val n = in.read(b, off, math.min(len, left))
        if (n < 0) throw truncated(new EOFException())
        left -= n
        n
      }
  }

  /** The next frame, one of `expected`. */
  def read(expected: FrameSpec*): (FrameSpec, IndexedSeq[Any]) = readFrom(readTag(), expected: _*)
}

object FrameCodec {
  /** A `chunks` value to write: `source` read to its end (not closed), in chunks of at most
   * `chunkBytes` (spark.arrowstate.worker.fileChunkBytes). */
  final case class Chunks(source: InputStream, chunkBytes: Int)
}
