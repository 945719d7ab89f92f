package org.apache.spark.sql.arrowstate.tools

import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation
import org.apache.spark.sql.execution.datasources.v2.state.{StateSourceOptions, StateTable}
import org.apache.spark.sql.execution.streaming.state.StateStoreConf

import org.apache.spark.sql.arrowstate.store.StateFiles

/**
 * Spark's `statestore` reader takes the state store provider class from the checkpoint's
 * offset log. A query run with arrowstate records the session's provider there (Spark's
 * own, by default), whose files arrowstate does not write; so when the operator's state
 * directory holds arrowstate files, this rule points the reader's store conf at
 * ArrowStateStoreProvider, which reads arrowstate partitions and hands any other partition
 * to the recorded provider. StateTable keeps its conf in a private field: it is set
 * reflectively, once, before the scan is built.
 */
case class StateReaderRule(session: SparkSession) extends Rule[LogicalPlan] with Logging {
  private def field(cls: Class[_], name: String) = {
    val f = cls.getDeclaredField(name)
    f.setAccessible(true)
    f
  }

  override def apply(plan: LogicalPlan): LogicalPlan = {
    plan.foreach {
      case DataSourceV2Relation(table: StateTable, _, _, _, _, _) => pointAtArrowState(table)
      case _ =>
    }
    plan
  }

  private def pointAtArrowState(table: StateTable): Unit = {
    val options = field(classOf[StateTable], "sourceOptions").get(table)
      .asInstanceOf[StateSourceOptions]
    val conf = field(classOf[StateTable], "stateConf").get(table).asInstanceOf[StateStoreConf]
    if (conf.providerClass == ArrowStateStoreProvider.ClassName) return
    val operatorDir = new Path(new Path(options.resolvedCpLocation, "state"),
      options.operatorId.toString)
    if (StateFiles.operatorHoldsArrowState(operatorDir, session.sessionState.newHadoopConf())) {
      logInfo(s"arrowstate: reading the arrowstate state of $operatorDir through " +
        s"ArrowStateStoreProvider (the checkpoint records ${conf.providerClass})")
      field(classOf[StateStoreConf], "providerClass").set(conf, ArrowStateStoreProvider.ClassName)
    }
  }
}
