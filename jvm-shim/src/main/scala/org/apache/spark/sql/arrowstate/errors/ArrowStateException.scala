package org.apache.spark.sql.arrowstate.errors

import org.json4s.{DefaultFormats, Formats, JValue}

import org.apache.spark.{QueryContext, SparkException, SparkThrowableHelper}

/**
 * An arrowstate failure with its condition (Spark's own where Spark has one, else
 * arrowstate's, declared in contract.json `errors`) and message parameters: a SparkException,
 * as Spark's own task failures are (Spark rethrows a SparkThrowable of a task as the job's
 * error, and callers match on SparkException).
 */
class ArrowStateException(
    condition: String,
    parameters: Map[String, String],
    message: String,
    cause: Throwable = null)
  extends SparkException(s"[$condition] $message", cause, Some(condition), parameters,
    Array.empty[QueryContext]) {

  override def getSqlState: String = ErrorConditions.SqlStates.getOrElse(getCondition,
    scala.util.Try(SparkThrowableHelper.getSqlState(getCondition)).toOption.orNull)
}

object ArrowStateException {
  val ContractViolation = "ARROWSTATE_CONTRACT_VIOLATION"
  val ProtocolMismatch = "ARROWSTATE_PROTOCOL_MISMATCH"
  val WorkerExited = "ARROWSTATE_WORKER_EXITED"
  val NeedsExport = "ARROWSTATE_STATE_NEEDS_EXPORT"

  /** A frame or payload that does not match contract.json, naming the field. */
  def contract(payload: String, field: String, reason: String): ArrowStateException =
    new ArrowStateException(ContractViolation,
      Map("payload" -> payload, "field" -> field, "reason" -> reason),
      s"the $payload payload does not match contract.json at " +
        s"${if (field.isEmpty) "its top" else field}: $reason")
}

/** A failure in the Python state worker, with its Python traceback in the message. */
class ArrowStatePythonException(
    condition: String,
    parameters: Map[String, String],
    message: String,
    val pythonTraceback: String)
  extends ArrowStateException(condition, parameters,
    s"$message\n\nPython traceback of the arrowstate state worker:\n$pythonTraceback")

object ArrowStatePythonException {
  private implicit val formats: Formats = DefaultFormats

  /** From an ERROR frame's payload (condition, parameters, message, traceback). */
  def fromPayload(error: JValue): ArrowStatePythonException =
    new ArrowStatePythonException((error \ "condition").extract[String],
      (error \ "parameters").extract[Map[String, String]], (error \ "message").extract[String],
      (error \ "traceback").extract[String])
}
