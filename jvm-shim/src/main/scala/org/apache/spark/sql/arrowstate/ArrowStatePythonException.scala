package org.apache.spark.sql.arrowstate

import java.nio.charset.StandardCharsets.UTF_8

import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.JsonMethods

import org.apache.spark.{QueryContext, SparkException, SparkThrowableHelper}

/**
 * A failure in the Python state worker, raised with the condition it carried across (Spark's
 * own where Spark has one, else arrowstate's, declared in contract.json), its message
 * parameters, and its Python traceback in the message.
 */
class ArrowStatePythonException(
    condition: String,
    parameters: Map[String, String],
    message: String,
    val pythonTraceback: String)
  // a SparkException, as Spark's own task failures are (Spark rethrows a SparkThrowable of
  // a task as the job's error, and callers match on SparkException)
  extends SparkException(
    s"[$condition] $message\n\nPython traceback of the arrowstate state worker:\n" +
      pythonTraceback, null, Some(condition), parameters, Array.empty[QueryContext]) {

  override def getSqlState: String = Contract.ErrorSqlStates.getOrElse(condition,
    scala.util.Try(SparkThrowableHelper.getSqlState(condition)).toOption.orNull)
}

object ArrowStatePythonException {
  private implicit val formats: Formats = DefaultFormats

  /** From an ERROR frame's payload (JSON: condition, parameters, message, traceback). */
  def fromFrame(payload: Array[Byte]): ArrowStatePythonException = {
    val error = JsonMethods.parse(new String(payload, UTF_8))
    new ArrowStatePythonException((error \ "condition").extract[String],
      (error \ "parameters").extract[Map[String, String]], (error \ "message").extract[String],
      (error \ "traceback").extract[String])
  }
}
