package org.apache.spark.sql.arrowstate.worker

import org.apache.spark.sql.arrowstate.contract.Contract
import org.apache.spark.sql.arrowstate.errors.ArrowStateException

/** The metrics a worker reports with its commit, as the operator adds them to its SQL
 * metrics. */
object WorkerMetrics {
  /** The worker's metrics (a `metrics` value, by name); a name the contract does not let
   * Python report for this family fails, instead of being dropped. */
  def check(values: Map[String, Long], family: String): Map[String, Long] = {
    val unknown = values.keySet -- Contract.pythonMetrics(family)
    if (unknown.nonEmpty) {
      throw ArrowStateException.contract("metrics", unknown.toSeq.sorted.head,
        s"metrics ${unknown.toSeq.sorted.mkString(", ")} are not declared for family $family")
    }
    values
  }
}
