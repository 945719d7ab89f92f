package org.apache.spark.sql.arrowstate.unit

import scala.collection.mutable

import org.apache.spark.sql.execution.streaming.state.{StateStoreId, StateStoreProviderId}

import org.apache.spark.sql.arrowstate.worker.{PooledWorker, WorkerBook}

/** The worker pool's decisions: affinity, owners, take-overs, dead and idle workers. */
object WorkerBookTests extends UnitTests {
  private class Fake(val id: Int, val owner: Option[String] = None) extends PooledWorker {
    var isAlive = true
    var idleSince = 0L
    val staleStateKeys: mutable.Set[String] = mutable.Set.empty
    override def toString: String = s"worker $id"
  }

  private val provider = StateStoreProviderId(StateStoreId("/ck/state", 0, 0),
    java.util.UUID.randomUUID())

  private def book(workers: Fake*): WorkerBook[Fake] = {
    val b = new WorkerBook[Fake]
    workers.foreach { w => b.all += w; b.idle += w }
    b
  }

  test("a partition's state goes back to the worker holding it, when that one is idle") {
    val (w1, w2) = (new Fake(1), new Fake(2))
    val b = book(w1, w2)
    b.assign("p0", provider, w2)
    assertEqual(b.lend("p0", None), Some(w2))
    assertTrue(b.holderBusy("p0"), "the holder is lent out")
    assertEqual(b.lend("p0", None), Some(w1), "busy holder: another worker")
    assertEqual(b.lend("p0", None), None, "none idle: the caller starts one")
  }

  test("a user function's worker serves its own query run only") {
    val (ours, runA, runB) = (new Fake(1), new Fake(2, Some("a")), new Fake(3, Some("b")))
    val b = book(ours, runA, runB)
    b.assign("p0", provider, runA)
    assertEqual(b.lend("p0", Some("b")), Some(runB), "run b never gets run a's worker")
    assertEqual(b.lend("p1", Some("a")), Some(runA))
    assertEqual(b.lendAny(Some("c")), None)
    assertEqual(b.lendAny(None), Some(ours))
  }

  test("taking over a partition makes the old holder's copy stale, dropped on its next task") {
    val (w1, w2) = (new Fake(1), new Fake(2))
    val b = book(w1, w2)
    assertEqual(b.assign("p0", provider, w1), Nil)
    assertEqual(b.assign("p0", provider, w2), Nil)
    assertEqual(b.holderOf("p0"), w2)
    assertEqual(w1.staleStateKeys.toSet, Set("p0"))
    assertEqual(b.assign("p1", provider, w1), Seq("p0"), "w1 forgets p0 first")
    assertTrue(w1.staleStateKeys.isEmpty, "and only once")
  }

  test("a worker holds a partition's state from its assignment until another takes it or it is distrusted") {
    val (w1, w2) = (new Fake(1), new Fake(2))
    val b = book(w1, w2)
    assertTrue(!b.holds("p0", w1), "nobody holds a new partition")
    b.assign("p0", provider, w1)
    assertTrue(b.holds("p0", w1))
    assertTrue(!b.holds("p0", w2))
    b.assign("p0", provider, w2)
    assertTrue(!b.holds("p0", w1), "taken over: w1's copy is stale")
    assertTrue(b.holds("p0", w2))
    b.distrust("p0")
    assertTrue(!b.holds("p0", w2), "distrusted: reloaded")
  }

  test("a distrusted partition (its task failed after committing) is dropped, then reloaded") {
    val w1 = new Fake(1)
    val b = book(w1)
    b.assign("p0", provider, w1)
    b.distrust("p0")
    assertTrue(!b.holderOf.contains("p0"), "no worker holds it")
    assertEqual(b.assign("p0", provider, w1), Seq("p0"),
      "its next task, even on the same worker, drops the copy first")
    b.distrust("p9")   // never held here: nothing to do
    assertTrue(w1.staleStateKeys.isEmpty)
  }

  test("a dead idle worker is never lent, and is forgotten with what it held") {
    val (w1, w2) = (new Fake(1), new Fake(2))
    val b = book(w1, w2)
    b.assign("p0", provider, w1)
    w1.isAlive = false
    assertEqual(b.discardDead(), Seq(w1))
    assertTrue(!b.all(w1) && !b.holderOf.contains("p0"), "forgotten")
    assertEqual(b.lend("p0", None), Some(w2))
  }

  test("released partitions: an idle holder is lent to drop them, a busy one drops them later") {
    val (w1, w2) = (new Fake(1), new Fake(2))
    val b = book(w1, w2)
    b.assign("p0", provider, w1)
    b.assign("p1", provider, w2)
    b.lend("p1", None)   // w2 is busy
    assertTrue(b.release(w1, Seq("p0")), "idle: drop now")
    assertTrue(!b.idle(w1) && !b.holderOf.contains("p0"), "lent for the drop")
    assertTrue(!b.release(w2, Seq("p1")), "busy: later")
    assertEqual(w2.staleStateKeys.toSet, Set("p1"))
  }

  test("idle workers holding no state expire; holders and recently used ones do not") {
    val (holder, empty, fresh) = (new Fake(1), new Fake(2), new Fake(3))
    fresh.idleSince = 900L
    val b = book(holder, empty, fresh)
    b.assign("p0", provider, holder)
    assertEqual(b.expired(now = 1000L, timeoutMs = 500L).toSet, Set(empty))
    assertTrue(b.idle(holder) && b.idle(fresh), "holder and fresh stay")
  }

}
