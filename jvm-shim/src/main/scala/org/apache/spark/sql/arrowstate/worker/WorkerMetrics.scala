package org.apache.spark.sql.arrowstate.worker

import org.json4s.JValue

import org.apache.spark.sql.arrowstate.contract.Contract
import org.apache.spark.sql.arrowstate.errors.ArrowStateException

/** The metrics a worker reports with its commit, as the operator adds them to its SQL
 * metrics. */
object WorkerMetrics {
  /** The worker's metrics (a `metrics` payload, checked as it crossed); a name the
   * contract does not let Python report for this family fails, instead of being dropped. */
  def parse(json: JValue, family: String): Map[String, Long] = {
    import org.json4s._
    val values = json match {
      case JObject(fields) => fields.collect {
        case (k, JInt(v)) => k -> v.toLong
        case (k, JLong(v)) => k -> v
      }.toMap
      case _ => Map.empty[String, Long]
    }
    val unknown = values.keySet -- Contract.pythonMetrics(family)
    if (unknown.nonEmpty) {
      throw ArrowStateException.contract("metrics", unknown.toSeq.sorted.head,
        s"metrics ${unknown.toSeq.sorted.mkString(", ")} are not declared for family $family")
    }
    values
  }
}
