package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.sql.execution.SparkPlan

import org.apache.spark.sql.arrowstate.contract.Contract
import org.apache.spark.sql.arrowstate.exec.TriggerMode
import org.apache.spark.sql.arrowstate.families.{AggregateFamily, ArrowStateFamily, DeduplicateFamily, FlatMapGroupsWithStateFamily, Runs, SessionWindowFamily, StaysSpark, TransformWithStateFamily}

/** The families planning asks, and what their declarations of trigger modes add up to. */
object FamilyRegistry {
  /** The families, in the order they are asked (the first that matches a node decides it). */
  val families: Seq[ArrowStateFamily] =
    Seq(DeduplicateFamily, AggregateFamily, SessionWindowFamily, FlatMapGroupsWithStateFamily,
      TransformWithStateFamily)

  /** The families that run in `mode`. */
  def runningIn(mode: TriggerMode): Seq[ArrowStateFamily] =
    families.filter(_.modes(mode).isInstanceOf[Runs])

  /** Every node the families make in `mode`, as their declarations name them. */
  def nodesIn(mode: TriggerMode): Seq[Class[_ <: SparkPlan]] = families.flatMap { f =>
    f.modes(mode) match {
      case Runs(nodes, _) => nodes
      case _: StaysSpark => Nil
    }
  }.distinct

  /** The nodes EXPLAIN shows for the families that run in `mode` (contract.json's `node`). */
  def explainedIn(mode: TriggerMode): Seq[String] =
    runningIn(mode).map(f => Contract.family(f.name).node)
}
