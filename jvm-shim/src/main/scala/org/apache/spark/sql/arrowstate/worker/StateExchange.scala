package org.apache.spark.sql.arrowstate.worker

import scala.collection.mutable

import org.apache.spark.SparkException
import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, CheckedJson, Contract}
import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.{CheckpointIds, StateFiles, StateMaintenance}

/**
 * One task's conversation with its worker about one operator partition:
 * begin (the worker loads the state version), exchange Arrow batches, end input, commit.
 * Any failure before commit destroys the worker, so no half-applied state survives.
 */
class StateExchange(
    stateKey: String, files: StateFiles, provider: StateStoreProviderId,
    settings: WorkerSettings) extends Logging {

  private val PythonStateWorkers.Lent(worker, drops, holdsState) =
    PythonStateWorkers.borrow(stateKey, provider, settings)
  private var finished = false
  private var pythonNanos = 0L
  private var bytesToPython = 0L
  private var bytesFromPython = 0L

  Option(TaskContext.get()).foreach { context =>
    context.addTaskCompletionListener[Unit] { _ =>
      if (!finished) PythonStateWorkers.destroy(worker)
    }
    // a task that fails after its commit (its delta's write included, when the worker went
    // back before it) is run again, maybe elsewhere, and its delta may be rewritten: the
    // state this executor keeps of it is not to be reused
    context.addTaskFailureListener { (_, _) =>
      if (finished) PythonStateWorkers.distrust(stateKey)
    }
  }

  def staleKeysToDrop: Seq[String] = drops

  /** Rows of Spark's own state store converted on this load (see StateConversion). */
  var adoptedRows: Long = 0L

  /** The task's checkpoint ids (checkpoint format v2), set before `begin`. */
  var checkpointIds: CheckpointIds = CheckpointIds.None

  private def timed[T](body: => T): T = {
    val t0 = System.nanoTime()
    try body finally pythonNanos += System.nanoTime() - t0
  }

  private var readySeen = true

  /** Sends the header and the input schema. The task's frames follow without waiting for the
   * worker's READY (its requests' replies are tagged: python/arrowstate/protocol.py), which
   * is read before the first answer. A worker that must load the state gets TASK at once, so
   * the load overlaps the task's first input; one that holds it gets TASK with the first
   * frame, one send and one wake-up fewer. */
  def begin(header: StateHeader, executor: CheckedJson, run: CheckedJson,
      inputSchemaIpc: Array[Byte]): Unit = timed {
    worker.beginTask(header, executor, run, inputSchemaIpc, flush = !holdsState)
    readySeen = false
  }

  /** Serves the state files the worker asks for (it decides which: the store's lifecycle
   * lives in Python) until it is ready. */
  def awaitReady(): Unit = timed(ready())

  private def ready(): Unit = if (!readySeen) {
    worker.flush()
    if (worker.serveFilesUntil(Contract.Frame.Ready, files).isDefined) {
      throw ArrowStateException.contract("DATA", "", "a batch before READY")
    }
    readySeen = true
  }

  private val awaiting = mutable.Queue[Option[Array[Byte]] => Unit]()

  /**
   * Sends one Arrow batch of input without waiting for the worker's answer; `onAnswer` gets
   * it (if the worker has one) when `settle` reads it. Answers come back in order. Keeping
   * one batch in flight lets the worker process it while this task encodes the next. The
   * `last` batch goes with END, in one send.
   */
  def post(batchIpc: Array[Byte], last: Boolean = false)(
      onAnswer: Option[Array[Byte]] => Unit): Unit = {
    write(Contract.Frame.Data, batchIpc, flush = !last)
    awaiting.enqueue(onAnswer)
    if (last) sendEnd()
  }

  def outstanding: Int = awaiting.size

  private var ended = false
  private var endSent = false
  def inputEnded: Boolean = ended

  /** END: no more input (its answers are read by `endInput`). */
  def sendEnd(): Unit = if (!endSent) {
    timed(worker.send(Contract.Frame.End))
    endSent = true
  }

  /** Reads answers until at most `inFlight` batches are still unanswered. */
  def settle(inFlight: Int = 0): Unit =
    while (awaiting.size > inFlight) {
      val onAnswer = awaiting.dequeue()
      onAnswer(timed(readAnswer()))
    }

  /** Sends a batch of initial-state rows (before any input); the worker answers none. */
  def initialState(batchIpc: Array[Byte]): Unit = {
    settle()
    write(Contract.Frame.InitialState, batchIpc)
    timed(readAnswer()).foreach { _ =>
      throw ArrowStateException.contract("INITIAL_STATE", "", "answered with DATA")
    }
  }

  /** Asks what the state (the version being updated) holds for a batch of keys. */
  def lookup(keysIpc: Array[Byte]): Option[Array[Byte]] = {
    settle()
    write(Contract.Frame.Lookup, keysIpc)
    timed(readAnswer())
  }

  private def write(frame: Contract.FrameSpec, batchIpc: Array[Byte],
      flush: Boolean = true): Unit = timed {
    if (endSent) throw SparkException.internalError(s"arrowstate: ${frame.name} after END")
    worker.sendBatch(frame, batchIpc, flush)
    bytesToPython += batchIpc.length
  }

  /** A batch the worker sent (None: `none`), counted; its READY (and the file requests
   * before it) read first. */
  private def received(none: Contract.FrameSpec): Option[Array[Byte]] = {
    ready()
    val answer = worker.readBatch(none)
    answer.foreach(b => bytesFromPython += b.length)
    answer
  }

  private def readAnswer(): Option[Array[Byte]] = received(none = Contract.Frame.NoData)

  /** Ends the input; returns the batches the worker emits after seeing all of it. */
  def endInput(): Iterator[Array[Byte]] = {
    if (ended) throw SparkException.internalError("arrowstate: input already ended")
    ended = true
    // END goes before the last answers are read: the worker sends them with its last
    // batches, COMMIT and metrics in one go (it flushes only when it waits for us)
    sendEnd()
    settle()
    new Iterator[Array[Byte]] {
      private var nextBatch: Option[Array[Byte]] = fetch()
      private def fetch(): Option[Array[Byte]] = timed(received(none = Contract.Frame.End))
      override def hasNext: Boolean = nextBatch.isDefined
      override def next(): Array[Byte] = {
        val b = nextBatch.get
        nextBatch = fetch()
        b
      }
    }
  }

  /**
   * Writes the new version's delta atomically, hands the snapshots the worker finished
   * meanwhile and its pruning to the maintenance thread, and adds the worker's metrics to
   * the operator's SQL metrics. A delta of at most one chunk
   * (spark.arrowstate.worker.fileChunkBytes) is in memory whole before its write, so the
   * worker goes back to the pool first: the task writing to the checkpoint (a namenode's
   * round trips, an object store's PUT) no longer holds up the next task of the
   * partitions that worker holds. A write that fails then has the worker drop this
   * partition's state (the task's failure listener), where a worker still in the
   * conversation is destroyed.
   */
  def commit(newVersion: Long, metrics: Map[String, SQLMetric], family: String,
      countsInstance: Boolean = true): Unit = {
    val done = timed(worker.readCommit(files, ArrowStateConf.fileChunkBytes(SQLConf.get)))
    if (!StateFiles.versionOf(done.deltaName).contains(newVersion)) {
      throw ArrowStateException.contract("COMMIT", "deltaName",
        s"${done.deltaName} is not a delta of version $newVersion")
    }
    // the write's time is the commit's (a delta read as it is written included), the wait
    // for the worker before it the worker's
    var commitNanos = 0L
    def write(): Unit = {
      val start = System.nanoTime()
      done.columnsFile.foreach { case (name, content) =>
        files.write(name, new java.io.ByteArrayInputStream(content))
      }
      files.write(done.deltaName, done.delta)
      commitNanos = System.nanoTime() - start
      StateMaintenance.submit(files, done.maintenance)
    }
    if (!done.held) write()
    val reportedMetrics = timed(worker.readMetrics())
    finished = true
    PythonStateWorkers.giveBack(worker)
    if (done.held) write()
    val commitMs = commitNanos / 1000000

    val reported = WorkerMetrics.check(reportedMetrics, family)
    // a figure goes to its SQL metric (Spark's name for one Spark's Python operators show);
    // an operator leaves out what cannot be other than zero for it (ArrowStateWriter)
    def add(name: String, v: Long): Unit = {
      val sqlName = Contract.MetricsByName.get(name).map(_.sqlName).getOrElse(name)
      metrics.get(sqlName) match {
        case Some(m) => m += v
        case None if v == 0 =>
        // not worth failing the task over, but not dropped unseen either
        case None => logWarning(s"arrowstate: the $family operator's task reports $v for " +
          s"metric $name, which the operator left out of its SQL metrics as one that cannot " +
          "be other than zero for it")
      }
    }
    reported.foreach { case (k, v) => add(k, v) }
    add("commitTimeMs", commitMs)
    if (countsInstance) add("numStateStoreInstances", 1)
    add("pythonWorkerTimeMs", pythonNanos / 1000000)
    add("arrowBytesToPython", bytesToPython)
    add("arrowBytesFromPython", bytesFromPython)
    add("stateRowsAdopted", adoptedRows)
  }
}

object StateExchange {
  private val open = new java.util.concurrent.ConcurrentHashMap[(Long, String), StateExchange]()

  /**
   * The task's exchange for one state partition, begun on first use. Both operators of a
   * streaming aggregation (restore and save, in the same task) share it: one worker, one
   * state version, one commit.
   */
  def forTask(
      stateKey: String, files: => StateFiles, provider: StateStoreProviderId,
      settings: WorkerSettings)(begin: StateExchange => Unit): StateExchange = {
    val context = TaskContext.get()
    val id = (context.taskAttemptId(), stateKey)
    open.computeIfAbsent(id, { _ =>
      val exchange = new StateExchange(stateKey, files, provider, settings)
      context.addTaskCompletionListener[Unit](_ => open.remove(id))
      begin(exchange)
      exchange
    })
  }
}
