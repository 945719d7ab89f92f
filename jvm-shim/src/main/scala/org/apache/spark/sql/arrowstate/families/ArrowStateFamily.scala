package org.apache.spark.sql.arrowstate.families

import org.apache.spark.sql.execution.SparkPlan

import org.apache.spark.sql.arrowstate.contract.Contract

/**
 * One operator family on the JVM side: which Spark nodes it answers for, the trigger modes it
 * runs in, every reason it cannot run one, and the swap. Its exec and its Python twin
 * (`arrowstate.families`) do the rest; contract.json names it.
 */
trait ArrowStateFamily {
  /** The family's name in contract.json (and in the Python registry). */
  def name: String

  /** The setting that turns the family on. */
  final def switch: String = Contract.family(name).switch

  /** Whether it runs user code: then its workers serve one query run only. */
  final def runsUserCode: Boolean = Contract.family(name).userCode

  def matches(plan: SparkPlan): Boolean

  /** Every reason this node cannot run in arrowstate; empty when it can. */
  def unsupportedReasons(plan: SparkPlan): Seq[String]

  /** The arrowstate plan for the node; called only when there is no reason against it. */
  def replace(plan: SparkPlan): SparkPlan

  /** The trigger modes it runs in, as which nodes, and why not where it does not: its one
   * declaration of them (TriggerModes). */
  def modes: TriggerModes

  /** `parent` taken into the family's node below it, where that node can do its work. */
  def absorb(parent: SparkPlan): Option[SparkPlan] = None
}
