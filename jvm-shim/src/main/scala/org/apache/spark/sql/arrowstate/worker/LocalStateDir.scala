package org.apache.spark.sql.arrowstate.worker

/**
 * Where state workers keep state over their memory budget: the `spark.arrowstate.worker.localDir`
 * setting, else one directory per executor among Spark's local directories, made on first use
 * and deleted when the executor stops (each worker removes its own part when it exits).
 */
object LocalStateDir {
  private lazy val executorDir: String = {
    val conf = org.apache.spark.SparkEnv.get.conf
    org.apache.spark.util.Utils.createTempDir(
      org.apache.spark.util.Utils.getLocalDir(conf), "arrowstate").getAbsolutePath
  }

  def path(setting: String): String = if (setting.nonEmpty) setting else executorDir
}
