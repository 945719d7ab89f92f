package org.apache.spark.sql.arrowstate.worker

import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId

/**
 * The partitions (of a query run: Spark's provider ids) whose state this executor has
 * committed. For the rest of that run no engine of Spark's writes their files, so a task
 * skips the directory listing that asks whether Spark's own store wrote them (one listing
 * per task and micro-batch: on an object store, a request each). Entries go when the
 * worker pool drops the partition's state (PythonStateWorkers' maintenance).
 */
object CommittedPartitions {
  private val committed = java.util.concurrent.ConcurrentHashMap.newKeySet[StateStoreProviderId]()

  def contains(id: StateStoreProviderId): Boolean = committed.contains(id)
  def add(id: StateStoreProviderId): Unit = committed.add(id)
  def remove(id: StateStoreProviderId): Unit = committed.remove(id)
}
