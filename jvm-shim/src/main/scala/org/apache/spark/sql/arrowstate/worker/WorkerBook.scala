package org.apache.spark.sql.arrowstate.worker

import scala.collection.mutable

import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId

/** What the pool's bookkeeping needs of a worker (PythonStateWorker; fakes in unit tests). */
trait PooledWorker {
  def id: Int
  def isAlive: Boolean
  /** The query run it serves only (a user function's worker), or None. */
  def owner: Option[String]
  /** State keys whose copy in this worker went stale: another worker took them over. */
  def staleStateKeys: mutable.Set[String]
  /** When it was last given back (for the idle timeout). */
  def idleSince: Long
}

/**
 * The pool's bookkeeping, with no process and no Spark in it: which workers are idle, which
 * holds each partition's state. The decisions
 * live here (unit-tested in tests/jvm/unit/WorkerBookTests.scala); PythonStateWorkers starts,
 * stops and talks to the processes. Callers hold the pool's lock.
 */
class WorkerBook[W <: PooledWorker] {
  val idle = mutable.LinkedHashSet[W]()
  val all = mutable.LinkedHashSet[W]()
  val holderOf = mutable.HashMap[String, W]()
  val providerOf = mutable.HashMap[String, StateStoreProviderId]()

  /** Whether the worker holding `stateKey` is lent out to another task. */
  def holderBusy(stateKey: String): Boolean = holderOf.get(stateKey).exists(w => !idle(w))

  /** Lends an idle worker of `owner` for `stateKey`: the one holding its state if it is idle,
   * else any; None when there is none (the caller starts one). */
  def lend(stateKey: String, owner: Option[String]): Option[W] = {
    val holder = holderOf.get(stateKey).filter(w => idle(w) && w.owner == owner)
    lent(holder.orElse(lendAny(owner)))
  }

  /** Any idle worker of `owner` (a request that leaves no state behind). */
  def lendAny(owner: Option[String]): Option[W] = lent(idle.find(_.owner == owner))

  private def lent(w: Option[W]): Option[W] = {
    w.foreach(idle -= _)
    w
  }

  /** Whether `worker` holds `stateKey`'s state as this book knows it (not gone stale): its
   * next task of that partition most likely needs no file. */
  def holds(stateKey: String, worker: W): Boolean =
    holderOf.get(stateKey).exists(_ eq worker) && !worker.staleStateKeys(stateKey)

  /** `worker` now holds `stateKey`'s state: a previous holder's copy goes stale. Returns the
   * state keys `worker` must forget first (its own stale copies). */
  def assign(stateKey: String, provider: StateStoreProviderId, worker: W): Seq[String] = {
    holderOf.get(stateKey).filter(_ ne worker).foreach(_.staleStateKeys += stateKey)
    holderOf(stateKey) = worker
    providerOf(stateKey) = provider
    val drops = worker.staleStateKeys.toSeq
    worker.staleStateKeys.clear()
    drops
  }

  /** No worker holds `stateKey`'s state any more: its holder drops its copy with its next
   * task, and the partition's next task loads it from the checkpoint. */
  def distrust(stateKey: String): Unit =
    holderOf.remove(stateKey).foreach(_.staleStateKeys += stateKey)

  /** Idle workers whose process died: forgotten, and returned (their partitions reload). */
  def discardDead(): Seq[W] = {
    val dead = idle.filterNot(_.isAlive).toSeq
    dead.foreach(forget)
    dead
  }

  /** These partitions are no longer this executor's: `worker` stops holding them. Returns
   * whether it is idle and now lent to the caller to drop them; a busy one drops them with
   * its next task instead. */
  def release(worker: W, keys: Seq[String]): Boolean = {
    keys.foreach { k =>
      if (holderOf.get(k).contains(worker)) holderOf -= k
      providerOf -= k
    }
    if (idle(worker)) { idle -= worker; true }
    else { worker.staleStateKeys ++= keys; false }
  }

  /** Idle workers holding no state, idle `timeoutMs` or longer at `now`: taken out of the
   * pool, to be stopped. */
  def expired(now: Long, timeoutMs: Long): Seq[W] = {
    val holding = holderOf.values.toSet
    val gone = idle.filter(w => !holding(w) && now - w.idleSince >= timeoutMs).toSeq
    gone.foreach(idle -= _)
    gone
  }

  def forget(worker: W): Unit = {
    idle -= worker
    all -= worker
    holderOf.filterInPlace((_, w) => w ne worker)
  }
}
