package org.apache.spark.sql.arrowstate

import java.io._
import java.nio.channels.Channels
import java.nio.charset.StandardCharsets.UTF_8

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.JsonMethods

import org.apache.spark.{SparkEnv, SparkThrowable, SparkThrowableHelper, TaskContext}
import org.apache.spark.api.python.{PythonWorker, PythonWorkerHandle}
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.execution.metric.SQLMetric

/**
 * Sends a partition's rows to the worker as they come, in batches of `batchSize`, with one
 * batch in flight so the worker works on it while the next is encoded. Rows are copied into
 * Arrow as they pass. Yields, in order: each input row as it passes when `passInput`; and
 * what `answer` makes of each batch's rows (kept, as copies, only when `keepInput`) and the
 * worker's answer to that batch.
 */
class PostedRows(
    rows: Iterator[InternalRow],
    exchange: StateExchange,
    encoder: ArrowBatchEncoder,
    project: InternalRow => InternalRow,
    batchSize: Int,
    passInput: Boolean,
    keepInput: Boolean,
    answer: (Seq[InternalRow], Option[Array[Byte]]) => Iterator[InternalRow])
  extends Iterator[InternalRow] {

  private val ready = mutable.Queue[Iterator[InternalRow]]()
  private var current: Iterator[InternalRow] = Iterator.empty
  private var passed: InternalRow = null
  private var batch = mutable.ArrayBuffer[InternalRow]()
  private var pending = 0

  private def flush(): Unit = {
    val sent = batch
    exchange.post(encoder.finishBatch())(a => ready.enqueue(answer(sent.toSeq, a)))
    batch = mutable.ArrayBuffer[InternalRow]()
    pending = 0
    exchange.settle(inFlight = 1)
  }

  override def hasNext: Boolean = {
    while (passed == null && !current.hasNext) {
      if (ready.nonEmpty) {
        current = ready.dequeue()
      } else if (rows.hasNext) {
        val row = rows.next()
        encoder.append(project(row))
        if (keepInput) batch += row.copy()
        pending += 1
        if (passInput) passed = row
        if (pending >= batchSize) flush()
      } else if (pending > 0) {
        flush()
      } else if (exchange.outstanding > 0) {
        exchange.settle()
      } else {
        return false
      }
    }
    true
  }

  override def next(): InternalRow = {
    if (!hasNext) throw new NoSuchElementException
    if (passed != null) {
      val row = passed
      passed = null
      row
    } else {
      current.next()
    }
  }
}

/**
 * A failure in the Python state worker, raised with the condition it carried across (Spark's
 * own where Spark has one, else arrowstate's, declared in contract.json), its message
 * parameters, and its Python traceback in the message.
 */
class ArrowStatePythonException(
    condition: String,
    parameters: Map[String, String],
    message: String,
    val pythonTraceback: String)
  extends RuntimeException(
    s"[$condition] $message\n\nPython traceback of the arrowstate state worker:\n" +
      pythonTraceback) with SparkThrowable {

  override def getCondition: String = condition
  override def getMessageParameters: java.util.Map[String, String] = parameters.asJava
  override def getSqlState: String = Contract.ErrorSqlStates.getOrElse(condition,
    scala.util.Try(SparkThrowableHelper.getSqlState(condition)).toOption.orNull)
}

object ArrowStatePythonException {
  private implicit val formats: Formats = DefaultFormats

  /** From an ERROR frame's payload (JSON: condition, parameters, message, traceback). */
  def fromFrame(payload: Array[Byte]): ArrowStatePythonException = {
    val error = JsonMethods.parse(new String(payload, UTF_8))
    new ArrowStatePythonException((error \ "condition").extract[String],
      (error \ "parameters").extract[Map[String, String]], (error \ "message").extract[String],
      (error \ "traceback").extract[String])
  }
}

/** One Python process that holds the state of any number of operator partitions. */
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
  val in = new DataInputStream(new BufferedInputStream(Channels.newInputStream(channel), 1 << 16))
  val out = new DataOutputStream(new BufferedOutputStream(Channels.newOutputStream(channel), 1 << 16))
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

  def writeBytes(b: Array[Byte]): Unit = {
    out.writeInt(b.length)
    out.write(b)
  }

  def readBytes(): Array[Byte] = {
    val n = in.readInt()
    val b = new Array[Byte](n)
    in.readFully(b)
    b
  }

  /** The next frame's tag; an ERROR frame becomes an exception with the Python traceback. */
  def readTag(): Int = {
    val tag = try in.readInt() catch {
      case e: EOFException => throw exitedUnasked(e)
    }
    if (tag == Contract.Frame.Error) throw ArrowStatePythonException.fromFrame(readBytes())
    tag
  }

  /** Answers the worker's request for the state files it decides to read (the store's
   * lifecycle lives in Python); any other frame is a protocol error. */
  def serveFileRequest(tag: Int, files: StateFiles): Unit = {
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

/**
 * What a task tells the pool about the session it runs for. `owner` is set for families that
 * run user code: their workers serve that query run only, so a user's function never shares
 * a process with another query's state.
 */
case class WorkerSettings(
    affinityWaitMs: Long, idleTimeoutMs: Long, maintenanceIntervalMs: Long,
    owner: Option[String] = None, function: Option[FunctionEnvironment] = None)

/** The interpreter and environment Spark would start a user function's worker with. */
case class FunctionEnvironment(pythonExec: String, envVars: Map[String, String])

/**
 * The executor's pool of Python state workers. A partition's state stays loaded in the worker
 * that last ran it; a task borrows that worker exclusively when it is free, else another one
 * (which reloads from the checkpoint). The pool grows to the number of concurrent tasks.
 *
 * Like Spark's Python worker factory, it belongs to one SparkEnv: a new SparkContext in the
 * same JVM gets a new pool (the old env's factory stopped the old workers). A dead worker is
 * never handed out. Every maintenance interval, as Spark's state store maintenance unloads
 * providers, state whose query run stopped or whose partition is now active elsewhere (asked
 * of Spark's StateStoreCoordinator) is dropped from the worker holding it, and workers idle
 * past the idle timeout that hold no state are stopped, so their memory goes back.
 */
object PythonStateWorkers extends Logging {
  private val WorkerModule = "arrowstate.worker"
  private val DaemonModule = "pyspark.daemon"

  private class Pool(val env: SparkEnv) {
    val idle = mutable.LinkedHashSet[PythonStateWorker]()
    val all = mutable.LinkedHashSet[PythonStateWorker]()
    val holderOf = mutable.HashMap[String, PythonStateWorker]()
    val providerOf = mutable.HashMap[String, StateStoreProviderId]()
    /** Function workers started ahead (their imports done), owned by no query run yet. */
    val spares = mutable.HashMap[FunctionEnvironment, List[PythonStateWorker]]()
    val sparesStarting = mutable.HashMap[FunctionEnvironment, Int]()
    var nextId = 0
    var settings = WorkerSettings(10000L, 60000L, 60000L)
    def idleFor(owner: Option[String]): Iterable[PythonStateWorker] = idle.filter(_.owner == owner)
    var maintenance: Option[java.util.concurrent.ScheduledFuture[_]] = None
  }

  private var current: Option[Pool] = None

  private val scheduler = java.util.concurrent.Executors.newSingleThreadScheduledExecutor(
    (r: Runnable) => {
      val t = new Thread(r, "arrowstate-worker-maintenance")
      t.setDaemon(true)
      t
    })

  /** Spare function workers per environment: one query run's concurrent tasks on a
   * small executor. */
  private val MaxSpares = 2
  private val spareStarter = java.util.concurrent.Executors.newSingleThreadExecutor(
    (r: Runnable) => {
      val t = new Thread(r, "arrowstate-spare-worker-starter")
      t.setDaemon(true)
      t
    })

  /** The pool of the running SparkEnv; a new env gets a new one. Callers hold the lock. */
  private def pool: Pool = {
    val env = SparkEnv.get
    current match {
      case Some(p) if p.env eq env => p
      case old =>
        old.foreach { p =>
          p.maintenance.foreach(_.cancel(false))
          logInfo(s"arrowstate: a new SparkEnv; forgetting ${p.all.size} workers of the old one")
        }
        val p = new Pool(env)
        current = Some(p)
        p
    }
  }

  /** The interpreter of workers that run no user function: the one the driver hands its
   * functions (recorded by `arrowstate.configure`), else as Spark's launcher picks it. */
  private def defaultPythonExec(env: SparkEnv): String =
    env.conf.getOption("spark.arrowstate.pythonExec")
      .orElse(env.conf.getOption("spark.pyspark.python"))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .getOrElse("python3")

  /** Where a worker that dies leaves its last words (its pid's file), as pyspark's do. */
  private lazy val FaultLogDir = org.apache.spark.util.Utils.createTempDir(
    namePrefix = "arrowstate-worker-faults")

  private lazy val OwnEnvVars: Map[String, String] = Map(
    "SPARK_BUFFER_SIZE" -> "65536",
    // as Spark's runners mark theirs: pyspark's worker modules refuse to load without it
    // under SPARK_TESTING
    "SPARK_PYTHON_RUNTIME" -> "PYTHON_WORKER",
    // the factory binds it to the worker's handle (`terminationDiagnostics`)
    "PYTHON_FAULTHANDLER_DIR" -> FaultLogDir.getAbsolutePath,
    "ARROWSTATE_WORKER" -> "1")

  /**
   * Returns a live worker for `stateKey` and the state keys that worker must forget first.
   * When the worker holding the state is busy with another task, waits up to
   * `affinityWaitMs` for it: reloading state costs more than waiting for one task, the
   * longest such a wait lasts. Only then another worker takes over.
   */
  def borrow(stateKey: String, provider: StateStoreProviderId, settings: WorkerSettings)
    : (PythonStateWorker, Seq[String]) = {
    val chosen = synchronized {
      val p = pool
      updateSettings(p, settings)
      val deadline = System.currentTimeMillis() + settings.affinityWaitMs
      def holderBusy = p.holderOf.get(stateKey).exists(w => !p.idle.contains(w))
      while (holderBusy && System.currentTimeMillis() < deadline) {
        wait(math.max(1L, deadline - System.currentTimeMillis()))
      }
      discardDead(p)
      val preferred = p.holderOf.get(stateKey)
        .filter(w => p.idle.contains(w) && w.owner == settings.owner)
      val w = preferred.orElse(p.idleFor(settings.owner).headOption)
      w.foreach(p.idle -= _)
      w
    }
    // a user function's worker new to its query run (a spare, else started now): another
    // starts ahead for the next run with this environment, so that a restart does not wait
    // for Python's imports
    val worker = chosen.getOrElse {
      val spare = settings.function.flatMap(f => synchronized(takeSpare(pool, f, settings.owner)))
      settings.function.foreach(startSpare)
      spare.getOrElse(create(settings.owner, settings.function))
    }
    synchronized {
      val p = pool
      p.holderOf.get(stateKey).filter(_ ne worker).foreach(_.staleStateKeys += stateKey)
      p.holderOf(stateKey) = worker
      p.providerOf(stateKey) = provider
      val drops = worker.staleStateKeys.toSeq
      worker.staleStateKeys.clear()
      (worker, drops)
    }
  }

  /** A worker for a request that leaves no state behind in it (reading state for Spark's
   * state readers): any idle worker that runs no user function, else a new one. */
  def borrowAny(settings: WorkerSettings): PythonStateWorker = {
    val chosen = synchronized {
      val p = pool
      updateSettings(p, settings)
      discardDead(p)
      val w = p.idleFor(None).headOption
      w.foreach(p.idle -= _)
      w
    }
    chosen.getOrElse(create(None, None))
  }

  /** A live spare for this environment, now the owner's only. Callers hold the lock. */
  private def takeSpare(p: Pool, function: FunctionEnvironment, owner: Option[String])
    : Option[PythonStateWorker] = {
    val (alive, dead) = p.spares.getOrElse(function, Nil).partition(_.isAlive)
    dead.foreach(forget(p, _))
    p.spares(function) = alive.drop(1)
    alive.headOption.map { w =>
      w.owner = owner
      logInfo(s"arrowstate: Python state worker ${w.id} (started ahead) now serves query run " +
        owner.getOrElse(""))
      w
    }
  }

  /** Starts one spare worker for `function` in the background, up to `MaxSpares` of them. */
  private def startSpare(function: FunctionEnvironment): Unit = {
    val p = synchronized {
      val p = pool
      val have = p.spares.getOrElse(function, Nil).size + p.sparesStarting.getOrElse(function, 0)
      if (have >= MaxSpares) None
      else {
        p.sparesStarting(function) = p.sparesStarting.getOrElse(function, 0) + 1
        Some(p)
      }
    }
    p.foreach { p =>
      spareStarter.execute { () =>
        try {
          if (SparkEnv.get eq p.env) {
            val w = create(None, Some(function), spare = true)
            val kept = synchronized {
              val live = current.exists(_ eq p) && !p.env.isStopped
              if (live) p.spares(function) = p.spares.getOrElse(function, Nil) :+ w
              else p.all -= w
              live
            }
            // its SparkEnv stopped while it started, perhaps after the env's worker factory
            // stopped the workers it knew: it must not outlive the env
            if (!kept) w.kill()
          }
        } catch {
          case e: Exception => logWarning("arrowstate: could not start a spare Python worker", e)
        } finally {
          synchronized {
            p.sparesStarting(function) = p.sparesStarting.getOrElse(function, 1) - 1
          }
        }
      }
    }
  }

  private def discardDead(p: Pool): Unit =
    p.idle.filterNot(_.isAlive).foreach { dead =>
      logWarning(s"arrowstate: Python state worker ${dead.id} died while idle; " +
        "its partitions reload from their checkpoints")
      forget(p, dead)
    }

  def giveBack(worker: PythonStateWorker): Unit = synchronized {
    worker.idleSince = System.currentTimeMillis()
    current.filter(_.all.contains(worker)).foreach(_.idle += worker)
    notifyAll()
  }

  /** Kills a worker whose protocol state is unknown (error, abort); its state reloads later. */
  def destroy(worker: PythonStateWorker): Unit = {
    // a worker of an older SparkEnv's pool was stopped with that env's worker factory
    val env = synchronized {
      current.filter(_.all.contains(worker)).map { p =>
        forget(p, worker)
        notifyAll()
        p.env
      }
    }
    env.foreach { e =>
      try {
        e.destroyPythonWorker(worker.pythonExec, WorkerModule, DaemonModule, worker.envVars,
          worker.handle)
        worker.forgetFaultLog()
      } catch {
        case ex: Exception =>
          logWarning(s"arrowstate: could not stop Python worker ${worker.id}", ex)
      }
    }
  }

  private def forget(p: Pool, worker: PythonStateWorker): Unit = {
    p.spares.mapValuesInPlace((_, ws) => ws.filterNot(_ eq worker))
    p.idle -= worker
    p.all -= worker
    p.holderOf.filterInPlace((_, w) => w ne worker)
  }

  private def create(owner: Option[String], function: Option[FunctionEnvironment],
      spare: Boolean = false): PythonStateWorker = {
    val env = SparkEnv.get
    // a user function's worker starts as Spark would start its own: its interpreter and
    // environment (spark.executorEnv.*, the memory limit); ours as Spark's default. It
    // imports what functions need before its first request.
    val exec = function.map(_.pythonExec).getOrElse(defaultPythonExec(env))
    val envVars = function.map(_.envVars).getOrElse(Map.empty) ++ OwnEnvVars ++
      function.map(_ => "ARROWSTATE_FUNCTION_WORKER" -> "1")
    val (handle, process) = env.createPythonWorker(exec, WorkerModule, DaemonModule, envVars,
      false)
    val worker = synchronized {
      val p = pool
      p.nextId += 1
      val w = new PythonStateWorker(handle, process, p.nextId, owner, exec, envVars)
      p.all += w
      w
    }
    logInfo(s"arrowstate: started Python state worker ${worker.id} ($exec)" +
      owner.map(o => s" for query run $o only").getOrElse("") +
      (if (spare) " ahead, for a query run's function" else ""))
    worker
  }

  private def updateSettings(p: Pool, settings: WorkerSettings): Unit = {
    val rescheduled = p.maintenance.isEmpty ||
      p.settings.maintenanceIntervalMs != settings.maintenanceIntervalMs
    p.settings = settings.copy(owner = None)
    if (rescheduled) {
      p.maintenance.foreach(_.cancel(false))
      val every = math.max(100L, settings.maintenanceIntervalMs)
      p.maintenance = Some(scheduler.scheduleWithFixedDelay(() => maintain(p), every, every,
        java.util.concurrent.TimeUnit.MILLISECONDS))
    }
  }

  /** Drops state that is no longer this executor's to hold, and stops idle empty workers. */
  private def maintain(p: Pool): Unit = try {
    if (!synchronized(current.exists(_ eq p)) || (SparkEnv.get ne p.env)) {
      p.maintenance.foreach(_.cancel(false))   // its SparkEnv is gone
      return
    }
    val coordinator = ExecutorCoordinator(p.env)
    val held = synchronized { p.holderOf.toSeq.map { case (k, w) => (k, w, p.providerOf(k)) } }
    val inactive = held.filterNot { case (_, _, provider) =>
      coordinator.verifyIfInstanceActive(provider, p.env.executorId)
    }
    inactive.groupBy(_._2).foreach { case (worker, entries) =>
      val keys = entries.map(_._1)
      val drop = synchronized {
        keys.foreach { k =>
          if (p.holderOf.get(k).contains(worker)) p.holderOf -= k
          p.providerOf -= k
        }
        if (p.idle.contains(worker)) { p.idle -= worker; true }
        else { worker.staleStateKeys ++= keys; false }
      }
      if (drop) {
        try {
          dropState(worker, keys)
          giveBack(worker)
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: Python state worker ${worker.id} failed to drop state", e)
            destroy(worker)
        }
      }
    }
    val now = System.currentTimeMillis()
    val expired = synchronized {
      val holding = p.holderOf.values.toSet
      val gone = p.idle.filter(w => !holding.contains(w) &&
        now - w.idleSince >= p.settings.idleTimeoutMs).toSeq
      gone.foreach(p.idle -= _)
      val spares = p.spares.values.flatten.filter(now - _.idleSince >= p.settings.idleTimeoutMs)
      spares.foreach(forget(p, _))   // under the lock: no run takes one being stopped
      gone ++ spares
    }
    expired.foreach { w =>
      logInfo(s"arrowstate: stopping Python state worker ${w.id}: idle and holding no state")
      destroy(w)
    }
  } catch {
    case e: Exception => logWarning("arrowstate: worker maintenance failed", e)
  }

  /** Tells an idle worker to forget these partitions' state and free its memory. */
  private def dropState(worker: PythonStateWorker, keys: Seq[String]): Unit = {
    worker.out.writeInt(Contract.Frame.Drop)
    worker.out.writeInt(keys.size)
    keys.foreach { k =>
      val b = k.getBytes(UTF_8)
      worker.out.writeInt(b.length)
      worker.out.write(b)
    }
    worker.out.flush()
    require(worker.readTag() == Contract.Frame.Drop, "arrowstate: worker did not drop state")
    val resident = worker.in.readLong()   // read here: a log message is only built if logged
    logInfo(s"arrowstate: Python state worker ${worker.id} dropped ${keys.size} partitions' " +
      s"state; it now holds $resident bytes resident")
  }
}

/**
 * One task's conversation with its worker about one operator partition:
 * begin (load the state version), exchange Arrow batches, end input, commit.
 * Any failure before commit destroys the worker, so no half-applied state survives.
 */
class StateExchange(
    stateKey: String, files: StateFiles, provider: StateStoreProviderId,
    settings: WorkerSettings) extends Logging {

  private val (worker, drops) = PythonStateWorkers.borrow(stateKey, provider, settings)
  private val in = worker.in
  private val out = worker.out
  private var finished = false
  private var pythonNanos = 0L
  private var bytesToPython = 0L
  private var bytesFromPython = 0L

  Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit] { _ =>
    if (!finished) PythonStateWorkers.destroy(worker)
  })

  def staleKeysToDrop: Seq[String] = drops

  /** Rows of Spark's own state store converted on this load (see StateConversion). */
  var adoptedRows: Long = 0L

  private def timed[T](body: => T): T = {
    val t0 = System.nanoTime()
    try body finally pythonNanos += System.nanoTime() - t0
  }

  private def writeBytes(b: Array[Byte]): Unit = worker.writeBytes(b)
  private def readBytes(): Array[Byte] = worker.readBytes()
  private def readTag(): Int = worker.readTag()

  /** Sends the header and the input schema; serves the state files the worker asks for
   * (it decides which: the store's lifecycle lives in Python) until it is ready. */
  def begin(headerJson: String, inputSchemaIpc: Array[Byte]): Unit = timed {
    out.writeInt(Contract.ProtocolVersion)
    writeBytes(headerJson.getBytes(UTF_8))
    writeBytes(inputSchemaIpc)
    out.flush()
    var tag = readTag()
    while (tag != Contract.Frame.Ready) {
      worker.serveFileRequest(tag, files)
      tag = readTag()
    }
  }

  private val awaiting = mutable.Queue[Option[Array[Byte]] => Unit]()

  /**
   * Sends one Arrow batch of input without waiting for the worker's answer; `onAnswer` gets
   * it (if the worker has one) when `settle` reads it. Answers come back in order. Keeping
   * one batch in flight lets the worker process it while this task encodes the next.
   */
  def post(batchIpc: Array[Byte])(onAnswer: Option[Array[Byte]] => Unit): Unit = {
    write(Contract.Frame.Data, batchIpc)
    awaiting.enqueue(onAnswer)
  }

  def outstanding: Int = awaiting.size

  private var ended = false
  def inputEnded: Boolean = ended

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
      throw new IllegalStateException("arrowstate: the worker answered initial state rows")
    }
  }

  /** Asks what the state (the version being updated) holds for a batch of keys. */
  def lookup(keysIpc: Array[Byte]): Option[Array[Byte]] = {
    settle()
    write(Contract.Frame.Lookup, keysIpc)
    timed(readAnswer())
  }

  private def write(tag: Int, batchIpc: Array[Byte]): Unit = timed {
    out.writeInt(tag)
    writeBytes(batchIpc)
    out.flush()
    bytesToPython += batchIpc.length
  }

  private def readAnswer(): Option[Array[Byte]] = readTag() match {
    case Contract.Frame.Data =>
      val b = readBytes()
      bytesFromPython += b.length
      Some(b)
    case Contract.Frame.NoData => None
    case other => throw new IllegalStateException(s"arrowstate: unexpected frame $other")
  }

  /** Ends the input; returns the batches the worker emits after seeing all of it. */
  def endInput(): Iterator[Array[Byte]] = {
    require(!ended, "arrowstate: input already ended")
    ended = true
    settle()
    timed {
      out.writeInt(Contract.Frame.End)
      out.flush()
    }
    new Iterator[Array[Byte]] {
      private var nextBatch: Option[Array[Byte]] = fetch()
      private def fetch(): Option[Array[Byte]] = timed {
        readTag() match {
          case Contract.Frame.End => None
          case Contract.Frame.Data =>
            val b = readBytes()
            bytesFromPython += b.length
            Some(b)
          case other => throw new IllegalStateException(s"arrowstate: unexpected frame $other")
        }
      }
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
   * meanwhile and its pruning to the maintenance thread, tells the worker it is committed
   * and adds the worker's metrics to the operator's SQL metrics.
   */
  def commit(newVersion: Long, metrics: Map[String, SQLMetric], family: String,
      countsInstance: Boolean = true): Unit = {
    val (delta, snapshots, pruneBelow) = timed {
      require(readTag() == Contract.Frame.Commit, "arrowstate: the worker did not commit")
      val d = readBytes()
      val s = Seq.fill(in.readInt())(in.readLong() -> readBytes())
      (d, s, in.readLong())
    }
    val commitStart = System.nanoTime()
    files.write(s"$newVersion${StateFiles.DeltaSuffix}", delta)
    val commitMs = (System.nanoTime() - commitStart) / 1000000
    StateMaintenance.submit(files, snapshots, pruneBelow)
    val metricsJson = timed {
      out.writeInt(Contract.Frame.Committed)
      out.flush()
      require(readTag() == Contract.Frame.Committed,
        "arrowstate: worker did not confirm the commit")
      new String(readBytes(), UTF_8)
    }
    finished = true
    PythonStateWorkers.giveBack(worker)

    val reported = WorkerMetrics.parse(metricsJson, family)
    def add(name: String, v: Long): Unit = metrics.get(name) match {
      case Some(m) => m += v
      case None => throw new IllegalStateException(
        s"arrowstate: the $family operator has no SQL metric $name (contract.json declares it)")
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

object WorkerMetrics {
  /** The worker's flat JSON object of integer metrics; a name the contract does not let
   * Python report for this family fails, instead of being dropped. */
  def parse(json: String, family: String): Map[String, Long] = {
    import org.json4s._
    import org.json4s.jackson.JsonMethods
    val values = JsonMethods.parse(json) match {
      case JObject(fields) => fields.map {
        case (k, JInt(v)) => k -> v.toLong
        case (k, JLong(v)) => k -> v
        case (k, other) => throw new IllegalStateException(
          s"arrowstate: the worker reported metric $k as $other, not a whole number")
      }.toMap
      case other => throw new IllegalStateException(s"arrowstate: bad worker metrics $other")
    }
    val unknown = values.keySet -- Contract.pythonMetrics(family)
    if (unknown.nonEmpty) {
      throw new IllegalStateException(s"arrowstate: the worker reported metrics " +
        s"${unknown.toSeq.sorted.mkString(", ")} that contract.json does not declare for " +
        s"family $family")
    }
    values
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
