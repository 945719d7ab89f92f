package org.apache.spark.sql.arrowstate.worker

import org.apache.spark.SparkEnv
import org.apache.spark.sql.execution.streaming.state.StateStoreCoordinatorRef

/** The coordinator's reference in this executor, made once per SparkEnv. */
private[arrowstate] object ExecutorCoordinator {
  private var cached: Option[(SparkEnv, StateStoreCoordinatorRef)] = None

  def apply(env: SparkEnv): StateStoreCoordinatorRef = synchronized {
    cached match {
      case Some((e, ref)) if e eq env => ref
      case _ =>
        val ref = StateStoreCoordinatorRef.forExecutor(env)
        cached = Some(env -> ref)
        ref
    }
  }
}
