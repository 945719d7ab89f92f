package org.apache.spark.sql.arrowstate.unit

import java.io._
import java.nio.charset.StandardCharsets.UTF_8

import org.json4s._
import org.json4s.JsonDSL._

import org.apache.spark.sql.arrowstate.contract.{CheckedJson, Contract, ContractSchema}
import org.apache.spark.sql.arrowstate.errors.{ArrowStateException, ArrowStatePythonException}
import org.apache.spark.sql.arrowstate.store.StateMaintenance
import org.apache.spark.sql.arrowstate.worker.{FrameCodec, StateHeader, WorkerMetrics}

/** FrameCodec writes and reads every frame as contract.json declares it; ContractSchema
 * fails a payload that does not match, naming the field. */
object FramingTests extends UnitTests {
  private def written(body: FrameCodec => Unit): Array[Byte] = {
    val bytes = new ByteArrayOutputStream()
    val codec = new FrameCodec(new DataInputStream(new ByteArrayInputStream(Array.empty)),
      new DataOutputStream(bytes))
    body(codec)
    codec.flush()
    bytes.toByteArray
  }

  /** A codec reading what the worker sent, written as its frames' declared fields. */
  private def reading(write: DataOutputStream => Unit): FrameCodec = {
    val bytes = new ByteArrayOutputStream()
    val out = new DataOutputStream(bytes)
    write(out)
    out.flush()
    new FrameCodec(new DataInputStream(new ByteArrayInputStream(bytes.toByteArray)),
      new DataOutputStream(new ByteArrayOutputStream()))
  }

  private def str(out: DataOutputStream, s: String): Unit = {
    val b = s.getBytes(UTF_8)
    out.writeInt(b.length)
    out.write(b)
  }

  private val header = StateHeader("/ck/state/0/1", 1, 3L, "", "", Seq("/ck/state/0/9"), JNull)
  private val executor: JValue = ("sparkFilesDir" -> "/tmp") ~ ("localDir" -> "/tmp")

  /** What a deduplication's tasks share (the `operatorRun` payload) with these fields. */
  private def run(operator: JValue): JValue =
    ("family" -> "deduplicate") ~ ("queryRunId" -> "run") ~ ("operatorId" -> 0) ~
      ("conf" -> (("minDeltasForSnapshot" -> 10L) ~ ("minVersionsToRetain" -> 100L) ~
        ("maxStateBytes" -> 0L) ~ ("stateMemoryPercent" -> 50L) ~ ("memoryBytes" -> 0L) ~
        ("fileChunkBytes" -> 4194304L) ~ ("fileMemoryBytes" -> 67108864L) ~
        ("compressionCodec" -> "lz4") ~ ("verifyHeldState" -> false))) ~
      ("operator" -> operator)

  private val dedup: JValue = ("keyCount" -> 1) ~ ("eventTimeIndex" -> -1) ~
    ("evictByKey" -> false) ~ ("withinWatermark" -> false) ~
    ("delayMs" -> Option.empty[Long])   // a None: left out, as rendering leaves it out

  private def violation(body: => Any): ArrowStateException = {
    val e = assertThrows[ArrowStateException](body)
    assertEqual(e.getCondition, "ARROWSTATE_CONTRACT_VIOLATION")
    e
  }

  test("HELLO is written as its tag, the protocol version and the shim version") {
    val in = new DataInputStream(new ByteArrayInputStream(written(
      _.write(Contract.Frame.Hello, Contract.ProtocolVersion, "1.2.3"))))
    assertEqual(in.readInt(), Contract.Frame.Hello.tag)
    assertEqual(in.readInt(), Contract.ProtocolVersion)
    val shim = new Array[Byte](in.readInt())
    in.readFully(shim)
    assertEqual(new String(shim, UTF_8), "1.2.3")
    assertEqual(in.available(), 0)
  }

  test("a TASK's own fields cross in binary, its shared ones checked before they are sent") {
    val shared = new CheckedJson("operatorRun", run(dedup))
    val onExecutor = new CheckedJson("executor", executor)
    def task(values: Any*): Array[Byte] = written(_.write(Contract.Frame.Task,
      header.fields ++ values: _*))
    val bytes = task(onExecutor, shared, Array[Byte](1, 2))
    val in = new DataInputStream(new ByteArrayInputStream(bytes))
    def string(): String = {
      val b = new Array[Byte](in.readInt())
      in.readFully(b)
      new String(b, UTF_8)
    }
    assertEqual(in.readInt(), Contract.Frame.Task.tag)
    assertEqual(string(), "/ck/state/0/1")
    assertEqual(in.readInt(), 1)
    assertEqual(in.readLong(), 3L)
    assertEqual(string(), "")   // no checkpoint ids: format v1
    assertEqual(string(), "")
    assertEqual(in.readInt(), 1)
    assertEqual(string(), "/ck/state/0/9")
    assertEqual(string(), "")   // no TaskContext: an empty optionalJson
    assertEqual(string(), "{\"sparkFilesDir\":\"/tmp\",\"localDir\":\"/tmp\"}")
    val text = string()
    assertTrue(text.contains("\"keyCount\":1") && !text.contains("delayMs"), text)
    assertTrue(text.contains("\"queryRunId\":\"run\""), text)
    assertEqual(in.readInt(), 2)
    assertEqual(in.available(), 2)
    // the shared fields go as the bytes rendered once; a JValue is checked and rendered
    assertEqual(task(executor, run(dedup), Array[Byte](1, 2)).toSeq, bytes.toSeq)
    // a TaskContext crosses as its JSON
    val context: JValue = ("stageId" -> 1) ~ ("stageAttemptNumber" -> 0) ~
      ("partitionId" -> 1) ~ ("attemptNumber" -> 0) ~ ("taskAttemptId" -> 7L) ~ ("cpus" -> 1) ~
      ("localProperties" -> JObject())
    val withContext = written(_.write(Contract.Frame.Task,
      header.copy(task = context).fields ++ Seq(onExecutor, shared, Array[Byte]()): _*))
    assertTrue(new String(withContext, UTF_8).contains("\"taskAttemptId\":7"))
  }

  test("a payload that does not match fails naming the field") {
    val missing = dedup.removeField(_._1 == "keyCount")
    assertEqual(violation(ContractSchema.check("operatorRun", run(missing)))
      .getMessageParameters.get("field"), "operator.keyCount")
    val retyped = dedup.transformField { case ("evictByKey", _) => "evictByKey" -> JInt(1) }
    assertEqual(violation(ContractSchema.check("operatorRun", run(retyped)))
      .getMessageParameters.get("field"), "operator.evictByKey")
    val renamed = executor merge (("stateKeyy" -> "x"): JValue)
    assertEqual(violation(ContractSchema.check("executor", renamed))
      .getMessageParameters.get("field"), "stateKeyy")
    val wrongTask: JValue = "cpus" -> 1
    assertEqual(violation(ContractSchema.check("task", wrongTask))
      .getMessageParameters.get("field"), "stageId")
    // and the codec refuses to send them, or to make the shared fields at all
    violation(written(_.write(Contract.Frame.Task, header.copy(task = wrongTask).fields ++
      Seq(executor, run(dedup), Array.emptyByteArray): _*)))
    violation(written(_.write(Contract.Frame.Task,
      header.fields ++ Seq(executor, run(missing), Array.emptyByteArray): _*)))
    violation(new CheckedJson("operatorRun", run(missing)))
  }

  test("a value of the wrong type for a frame field fails naming the field") {
    val e = violation(written(_.write(Contract.Frame.Drop, Seq("a"), 3)))
    assertTrue(e.getMessage.contains("DROP"), e.getMessage)
    val typed = violation(written(_.write(Contract.Frame.Hello, "3", "1.2.3")))
    assertEqual(typed.getMessageParameters.get("field"), "protocolVersion")
    violation(written(_.write(Contract.Frame.Commit, Array.emptyByteArray)))   // Python's
    violation(written(_.reply(Contract.Frame.ReadFile, Array[Byte](1))))   // not Chunks
  }

  /** The chunk lengths of a `chunks` value as written, the empty one included. */
  private def chunkLengths(bytes: Array[Byte]): Seq[Int] = {
    val in = new DataInputStream(new ByteArrayInputStream(bytes))
    val lengths = Iterator.continually(in.readInt()).map { n => in.skipNBytes(n); n }
      .takeWhile(_ != 0).toSeq :+ 0
    assertEqual(in.available(), 0)
    lengths
  }

  test("a file is written as chunks of at most the bound, ended by an empty one") {
    for ((size, lengths) <- Seq(0 -> Seq(0), 10 -> Seq(4, 4, 2, 0), 12 -> Seq(4, 4, 4, 0),
        3 -> Seq(3, 0))) {
      val file = Array.tabulate[Byte](size)(i => (i * 7).toByte)
      val reply = written(_.reply(Contract.Frame.ReadFile,
        FrameCodec.Chunks(new ByteArrayInputStream(file), 4)))
      // tagged with the request's tag (the worker tells it from input sent before it)
      assertEqual(new DataInputStream(new ByteArrayInputStream(reply)).readInt(),
        Contract.Frame.ReadFile.tag)
      val bytes = reply.drop(4)
      assertEqual(chunkLengths(bytes), lengths, s"a file of $size bytes")
      val back = new ByteArrayOutputStream()
      val in = new DataInputStream(new ByteArrayInputStream(bytes))
      Iterator.continually(in.readInt()).takeWhile(_ != 0).foreach { n =>
        back.write(in.readNBytes(n))
      }
      assertEqual(back.toByteArray.toSeq, file.toSeq)
    }
  }

  /** A `chunks` value as the worker writes it. */
  private def chunks(out: DataOutputStream, file: Array[Byte], bound: Int): Unit = {
    file.grouped(bound).foreach { piece => out.writeInt(piece.length); out.write(piece) }
    out.writeInt(0)
  }

  test("COMMIT is read as (name, local file, content) items, the prune-below version and its snapshot, the run files to delete and to keep, the schema file, then the delta's name and bytes streamed") {
    for (size <- Seq(0, 2, 9, 12)) {   // empty, one chunk, a short last one, an exact multiple
      val delta = Array.tabulate[Byte](size)(_.toByte)
      val codec = reading { out =>
        out.writeInt(Contract.Frame.Commit.tag)
        out.writeInt(2)
        str(out, "ab.arrowstate.run"); str(out, "/tmp/ab.arrowstate.run"); out.writeInt(0)
        str(out, "5.arrowstate.snapshot"); str(out, ""); out.writeInt(2)   // a small one's bytes
        out.write(Array[Byte](5, 6))
        out.writeLong(4L); str(out, "4.arrowstate.snapshot")
        out.writeInt(1); str(out, "cd.arrowstate.run")
        out.writeInt(1); str(out, "ef.arrowstate.run")
        str(out, "ab.arrowstate.schema"); out.writeInt(2); out.write(Array[Byte](7, 8))
        str(out, "6.arrowstate.delta")
        chunks(out, delta, 3)
        out.writeInt(Contract.Frame.Ready.tag)
      }
      val (frame, Seq(snaps: Seq[StateMaintenance.NamedFile] @unchecked, prune: Long,
        pruneSnapshot: String, deletes: Seq[String] @unchecked, keep: Seq[String] @unchecked,
        schemaFile: String, schemaBytes: Array[Byte], deltaName: String,
        stream: InputStream)) = codec.read(Contract.Frame.Commit)
      assertEqual(frame, Contract.Frame.Commit)
      assertEqual(snaps.map(f => (f.name, f.localPath, f.content.toSeq)),
        Seq(("ab.arrowstate.run", "/tmp/ab.arrowstate.run", Seq.empty[Byte]),
          ("5.arrowstate.snapshot", "", Seq[Byte](5, 6))))
      assertEqual(prune, 4L)
      assertEqual(pruneSnapshot, "4.arrowstate.snapshot")
      assertEqual(deletes, Seq("cd.arrowstate.run"))
      assertEqual(keep, Seq("ef.arrowstate.run"))
      assertEqual(schemaFile, "ab.arrowstate.schema")
      assertEqual(deltaName, "6.arrowstate.delta")
      assertEqual(schemaBytes.toSeq, Seq[Byte](7, 8))
      val copy = new ByteArrayOutputStream()
      stream.transferTo(copy)
      assertEqual(copy.toByteArray.toSeq, delta.toSeq, s"a delta of $size bytes")
      assertEqual(stream.read(), -1)
      assertEqual(codec.read(Contract.Frame.Ready)._1, Contract.Frame.Ready)
    }
  }

  test("a streamed file cut short is an EOF naming the field; one left unread fails the next frame") {
    val file = Array.tabulate[Byte](10)(_.toByte)
    for (cut <- Seq(2, 4, 7, 10)) {   // in a length, in a chunk, before the empty chunk
      val codec = reading { out =>
        out.writeInt(Contract.Frame.ImportState.tag)
        val whole = new ByteArrayOutputStream()
        chunks(new DataOutputStream(whole), file, 4)
        out.write(whole.toByteArray.take(cut))
      }
      val stream = codec.read(Contract.Frame.ImportState)._2.head.asInstanceOf[InputStream]
      val e = assertThrows[EOFException](stream.transferTo(new ByteArrayOutputStream()))
      assertTrue(e.getMessage.contains("IMPORT_STATE.snapshot ended before its last chunk"),
        e.getMessage)
    }
    val unread = reading { out =>
      out.writeInt(Contract.Frame.ImportState.tag)
      chunks(out, file, 4)
      out.writeInt(Contract.Frame.End.tag)
    }
    val stream = unread.read(Contract.Frame.ImportState)._2.head.asInstanceOf[InputStream]
    assertEqual(stream.read(), 0)
    assertEqual(violation(unread.read(Contract.Frame.End)).getMessageParameters.get("field"),
      "snapshot")
    val negative = reading { out =>
      out.writeInt(Contract.Frame.ImportState.tag)
      out.writeInt(-1)
    }
    val bad = negative.read(Contract.Frame.ImportState)._2.head.asInstanceOf[InputStream]
    assertTrue(violation(bad.read()).getMessage.contains("a chunk of length -1"))
  }

  test("a frame out of turn fails naming both; an ERROR frame raises the worker's error") {
    val early = reading(_.writeInt(Contract.Frame.Ready.tag))
    assertTrue(violation(early.read(Contract.Frame.Commit)).getMessage
      .contains("expected COMMIT from Python, got READY"))
    val error = reading { out =>
      out.writeInt(Contract.Frame.Error.tag)
      str(out, """{"condition": "ARROWSTATE_STATE_CAP_EXCEEDED", "parameters": {"cap": "1"},
        "message": "too big", "traceback": "Traceback ..."}""")
    }
    val e = assertThrows[ArrowStatePythonException](error.read(Contract.Frame.Commit))
    assertEqual(e.getCondition, "ARROWSTATE_STATE_CAP_EXCEEDED")
    assertEqual(e.getSqlState, "53200")
    assertEqual(e.pythonTraceback, "Traceback ...")
  }

  test("metrics cross as (place, value) pairs by the declared order; a place out of range fails") {
    val places = Contract.MetricPlaces
    val codec = reading { out =>
      out.writeInt(Contract.Frame.Committed.tag)
      out.writeInt(2)
      out.writeInt(places("numTotalStateRows")); out.writeLong(5L)
      out.writeInt(places("stateMemory")); out.writeLong(1L << 40)
    }
    assertEqual(codec.read(Contract.Frame.Committed)._2.head,
      Map("numTotalStateRows" -> 5L, "stateMemory" -> (1L << 40)))
    val bad = reading { out =>
      out.writeInt(Contract.Frame.Committed.tag)
      out.writeInt(1)
      out.writeInt(Contract.Metrics.size); out.writeLong(1L)
    }
    assertEqual(violation(bad.read(Contract.Frame.Committed)).getMessageParameters
      .get("field"), "metrics")
  }

  test("a metric the contract does not declare for the family fails") {
    val check = WorkerMetrics.check _
    assertEqual(check(Map("numDroppedDuplicateRows" -> 2L), "deduplicate"),
      Map("numDroppedDuplicateRows" -> 2L))
    assertEqual(violation(check(Map("rowsSeen" -> 1L), "deduplicate"))
      .getMessageParameters.get("field"), "rowsSeen")
    assertEqual(violation(check(Map("numDroppedDuplicateRows" -> 1L), "aggregate"))
      .getMessageParameters.get("field"), "numDroppedDuplicateRows")
  }
}
