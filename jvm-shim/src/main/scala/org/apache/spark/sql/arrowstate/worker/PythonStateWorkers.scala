package org.apache.spark.sql.arrowstate.worker

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId

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
 * of Spark's StateStoreCoordinator) is dropped from the worker holding it (a worker that ran
 * a user's function and holds no state after that stops), and workers idle past the idle
 * timeout that hold no state are stopped, so their memory goes back.
 */
object PythonStateWorkers extends Logging {
  private val WorkerModule = "arrowstate.worker"
  // Workers that run no user function start alone (the factory's simple workers: few, and
  // kept for the executor's life). A user function's workers serve one query run each, so a
  // run needs new ones: they are forked, ready in milliseconds, from a daemon per
  // interpreter and environment that has imported what functions need.
  private val NoDaemon = "pyspark.daemon"
  private val FunctionDaemon = "arrowstate.worker_daemon"

  /** One SparkEnv's workers: the bookkeeping (WorkerBook) and what runs it. */
  private class Pool(val env: SparkEnv) extends WorkerBook[PythonStateWorker] {
    var nextId = 0
    var settings = WorkerSettings(10000L, 60000L, 60000L)
    var maintenance: Option[java.util.concurrent.ScheduledFuture[_]] = None
  }

  private var current: Option[Pool] = None

  private val scheduler = java.util.concurrent.Executors.newSingleThreadScheduledExecutor(
    (r: Runnable) => {
      val t = new Thread(r, "arrowstate-worker-maintenance")
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

  /** A worker lent for a partition: the state keys it must forget first, and whether it
   * holds the partition's state already (as the pool knows). */
  final case class Lent(worker: PythonStateWorker, drops: Seq[String], holdsState: Boolean)

  /**
   * Returns a live worker for `stateKey`. When the worker holding the state is busy with
   * another task, waits up to `affinityWaitMs` for it: reloading state costs more than
   * waiting for one task, the longest such a wait lasts. Only then another worker takes over.
   */
  def borrow(stateKey: String, provider: StateStoreProviderId, settings: WorkerSettings)
    : Lent = {
    val chosen = synchronized {
      val p = pool
      updateSettings(p, settings)
      val deadline = System.currentTimeMillis() + settings.affinityWaitMs
      while (p.holderBusy(stateKey) && System.currentTimeMillis() < deadline) {
        wait(math.max(1L, deadline - System.currentTimeMillis()))
      }
      discardDead(p)
      p.lend(stateKey, settings.owner)
    }
    val worker = chosen.getOrElse(create(settings.owner, settings.function))
    synchronized {
      val holds = pool.holds(stateKey, worker)
      Lent(worker, pool.assign(stateKey, provider, worker), holds)
    }
  }

  /** A worker for a request that leaves no state behind in it (reading state for Spark's
   * state readers): any idle worker that runs no user function, else a new one. */
  def borrowAny(settings: WorkerSettings): PythonStateWorker = {
    val chosen = synchronized {
      val p = pool
      updateSettings(p, settings)
      discardDead(p)
      p.lendAny(None)
    }
    chosen.getOrElse(create(None, None))
  }

  /** A new worker of a user function's environment for one request outside any task (a
   * transformWithState processor's init() while the driver plans); the caller destroys it
   * after, so the user's code leaves nothing behind. */
  def startForFunction(function: FunctionEnvironment): PythonStateWorker =
    create(Some("driver"), Some(function))

  private def discardDead(p: Pool): Unit =
    p.discardDead().foreach { dead =>
      logWarning(s"arrowstate: Python state worker ${dead.id} died while idle; " +
        "its partitions reload from their checkpoints")
    }

  /** The state this executor's worker holds of `stateKey` is not to be reused: the worker
   * drops it with its next task. */
  def distrust(stateKey: String): Unit = synchronized(current.foreach(_.distrust(stateKey)))

  /** How many of this executor's workers are lent to tasks now (tests). */
  def lent: Int = synchronized(current.map(p => p.all.size - p.idle.size).getOrElse(0))

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
        p.forget(worker)
        notifyAll()
        p.env
      }
    }
    env.foreach { e =>
      try {
        e.destroyPythonWorker(worker.pythonExec, WorkerModule, worker.daemonModule,
          worker.envVars, worker.handle)
        worker.forgetFaultLog()
      } catch {
        case ex: Exception =>
          logWarning(s"arrowstate: could not stop Python worker ${worker.id}", ex)
      }
    }
  }

  private def create(owner: Option[String], function: Option[FunctionEnvironment])
    : PythonStateWorker = {
    val env = SparkEnv.get
    // a user function's worker starts as Spark would start its own: its interpreter and
    // environment (spark.executorEnv.*, the memory limit), forked from its daemon; ours as
    // Spark's default.
    val exec = function.map(_.pythonExec).getOrElse(defaultPythonExec(env))
    val envVars = function.map(_.envVars).getOrElse(Map.empty) ++ OwnEnvVars ++
      function.map(_ => "ARROWSTATE_FUNCTION_WORKER" -> "1")
    val daemonModule = if (function.isDefined) FunctionDaemon else NoDaemon
    val (handle, process) = env.createPythonWorker(exec, WorkerModule, daemonModule, envVars,
      function.isDefined)
    val worker = synchronized {
      val p = pool
      p.nextId += 1
      val w = new PythonStateWorker(handle, process, p.nextId, owner, exec, envVars,
        daemonModule)
      p.all += w
      w
    }
    logInfo(s"arrowstate: started Python state worker ${worker.id} ($exec)" +
      owner.map(o => s" for query run $o only").getOrElse(""))
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
    inactive.foreach { case (_, _, provider) => CommittedPartitions.remove(provider) }
    inactive.groupBy(_._2).foreach { case (worker, entries) =>
      val keys = entries.map(_._1)
      val drop = synchronized(p.release(worker, keys))
      if (drop) {
        try {
          // a worker that ran a user's function serves that query run only: holding none of
          // its state now, it stops at once rather than after the idle timeout, and without
          // a DROP first (its exit gives all back; a DROP's full garbage collection over
          // its heap took seconds of CPU from the cores the next run uses)
          val empty = synchronized(!p.holderOf.values.exists(_ eq worker))
          if (worker.owner.nonEmpty && empty) {
            logInfo(s"arrowstate: stopping Python state worker ${worker.id}: its query " +
              "run's state left this executor")
            destroy(worker)
          } else {
            dropState(worker, keys)
            giveBack(worker)
          }
        } catch {
          case e: Exception =>
            logWarning(s"arrowstate: Python state worker ${worker.id} failed to drop state", e)
            destroy(worker)
        }
      }
    }
    val now = System.currentTimeMillis()
    // under the lock: no task borrows a worker being stopped
    val expired = synchronized(p.expired(now, p.settings.idleTimeoutMs))
    expired.foreach { w =>
      logInfo(s"arrowstate: stopping Python state worker ${w.id}: idle and holding no state")
      destroy(w)
    }
  } catch {
    case e: Exception => logWarning("arrowstate: worker maintenance failed", e)
  }

  /** Tells an idle worker to forget these partitions' state and free its memory. */
  private def dropState(worker: PythonStateWorker, keys: Seq[String]): Unit = {
    val resident = worker.drop(keys)   // here: a log message is only built if logged
    logInfo(s"arrowstate: Python state worker ${worker.id} dropped ${keys.size} partitions' " +
      s"state; it now holds $resident bytes resident")
  }
}
