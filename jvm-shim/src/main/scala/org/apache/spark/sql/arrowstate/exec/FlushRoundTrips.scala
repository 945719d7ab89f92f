package org.apache.spark.sql.arrowstate.exec

/**
 * The round trips of this JVM's real-time flushes: from a flush's batch posted to the
 * worker to its answer read (RealTimeRows), in nanoseconds, the last `Capacity` of them.
 * What a flush waits for the worker, apart from the rows' own gathering and the shuffle:
 * `scripts/bench.py --real-time` prints their p50 and p99 per case (docs/performance.md).
 * One synchronized append per flush; read by `drain` (through py4j in local mode).
 */
object FlushRoundTrips {
  val Capacity: Int = 1 << 16
  private val samples = new Array[Long](Capacity)
  private var count = 0L

  def record(nanos: Long): Unit = synchronized {
    samples((count % Capacity).toInt) = nanos
    count += 1
  }

  /** The round trips recorded since the last drain (the newest `Capacity`), oldest first;
   * forgets them. */
  def drain(): Array[Long] = synchronized {
    val n = math.min(count, Capacity.toLong).toInt
    val start = if (count > Capacity) (count % Capacity).toInt else 0
    val out = Array.tabulate(n)(i => samples((start + i) % Capacity))
    count = 0
    out
  }
}
