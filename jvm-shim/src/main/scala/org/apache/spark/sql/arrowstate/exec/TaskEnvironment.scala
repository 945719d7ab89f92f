package org.apache.spark.sql.arrowstate.exec

import org.json4s.JsonAST.JValue
import org.json4s.JsonDSL._

import scala.jdk.CollectionConverters._

import org.apache.spark.{SparkConf, TaskContext}
import org.apache.spark.api.python.PythonFunction

import org.apache.spark.sql.arrowstate.contract.ArrowStateConf
import org.apache.spark.sql.arrowstate.worker.FunctionEnvironment

/** The running task, as pyspark's TaskContext describes it to Python code. */
object TaskEnvironment {
  def current(): JValue = Option(TaskContext.get()).map { c =>
    ("stageId" -> c.stageId()) ~
      ("stageAttemptNumber" -> c.stageAttemptNumber()) ~
      ("partitionId" -> c.partitionId()) ~
      ("attemptNumber" -> c.attemptNumber()) ~
      ("taskAttemptId" -> c.taskAttemptId()) ~
      ("cpus" -> c.cpus()) ~
      ("localProperties" -> c.getLocalProperties.asScala.toMap): JValue
  }.getOrElse(org.json4s.JNull)

  /** How Spark starts the worker of a Python function: its interpreter, its environment
   * (spark.executorEnv.* and the rest of the function's envVars) and, as Spark's Python
   * runner does, `spark.executor.pyspark.memory` shared by the executor's cores. */
  def forFunction(function: PythonFunction, conf: SparkConf): FunctionEnvironment = {
    val memory = ArrowStateConf.pysparkMemoryMbPerWorker(conf)
      .map(mb => "PYSPARK_EXECUTOR_MEMORY_MB" -> mb.toString)
    FunctionEnvironment(function.pythonExec, function.envVars.asScala.toMap ++ memory)
  }
}
