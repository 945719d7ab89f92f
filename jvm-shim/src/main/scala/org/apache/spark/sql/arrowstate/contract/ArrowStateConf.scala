package org.apache.spark.sql.arrowstate.contract

import java.util.Locale

import org.apache.spark.{SparkConf, SparkIllegalArgumentException}
import org.apache.spark.network.util.JavaUtils
import org.apache.spark.sql.internal.SQLConf

/**
 * The `spark.arrowstate.*` settings, read as contract.json types them, with the defaults it
 * declares. A value its type does not take fails with Spark's INVALID_CONF_VALUE, as Spark's
 * own settings do: it never reads as the default, or as off.
 */
object ArrowStateConf {
  val Enabled = "spark.arrowstate.enabled"
  val FallbackStrict = "spark.arrowstate.fallback.strict"
  val AffinityWaitMs = "spark.arrowstate.worker.affinityWaitMs"
  val IdleTimeoutSeconds = "spark.arrowstate.worker.idleTimeoutSeconds"
  val WorkerMemory = "spark.arrowstate.worker.memory"
  val LocalDir = "spark.arrowstate.worker.localDir"
  val FileChunkBytes = "spark.arrowstate.worker.fileChunkBytes"
  val FileMemoryBytes = "spark.arrowstate.worker.fileMemoryBytes"
  val RealTimeFlushMs = "spark.arrowstate.realTime.flushMs"

  /** Fails on the first declared setting the session has (its own, or the SparkConf's it
   * started with: startup and worker settings included) that its type does not take. The
   * planning rule calls it before it reads any setting. */
  def validate(conf: SQLConf): Unit =
    Contract.Settings.values.toSeq.sortBy(_.key).foreach { s =>
      Option(conf.getConfString(s.key, null)).foreach(v => check(s, v.trim))
    }

  def get(conf: SQLConf, key: String): String =
    conf.getConfString(key, Contract.setting(key).default).trim

  def flag(conf: SQLConf, key: String): Boolean = boolean(Contract.setting(key), get(conf, key))

  def long(conf: SQLConf, key: String): Long = integer(Contract.setting(key), get(conf, key))

  /** The most bytes of a state file in one frame chunk (its declared max fits an Int). */
  def fileChunkBytes(conf: SQLConf): Int = long(conf, FileChunkBytes).toInt

  /** A state worker's memory budget in bytes: spark.arrowstate.worker.memory, else Spark's
   * spark.executor.pyspark.memory shared by the executor's cores (as Spark's Python runner
   * shares it among its workers), else 0 (no budget). */
  def workerMemoryBytes(conf: SQLConf, sparkConf: SparkConf): Long = {
    val own = get(conf, WorkerMemory)
    if (own.nonEmpty) size(Contract.setting(WorkerMemory), own)
    else pysparkMemoryMbPerWorker(sparkConf).map(_ * 1024L * 1024L).getOrElse(0L)
  }

  /** spark.executor.pyspark.memory shared by the executor's cores, in MiB, as Spark's Python
   * runner shares it among its workers (None when it is not set). */
  def pysparkMemoryMbPerWorker(sparkConf: SparkConf): Option[Long] = {
    val cores = math.max(1, sparkConf.getInt("spark.executor.cores", 1))
    sparkConf.getOption("spark.executor.pyspark.memory").map(JavaUtils.byteStringAsMb(_) / cores)
  }

  /** Fails when the setting's type does not take `value`. */
  private def check(s: Contract.Setting, value: String): Unit = s.valueType match {
    case "boolean" => boolean(s, value)
    case "integer" => integer(s, value)
    case "size" => if (value.nonEmpty) size(s, value)   // empty: unset
    case "path" =>   // taken as written
    case other => throw new IllegalStateException(
      s"arrowstate: contract.json's setting type $other has no parser in ArrowStateConf")
  }

  /** `true` or `false` in any case, as Spark's own booleans; `yes`, `1` or `on` are refused,
   * not read as false. */
  private def boolean(s: Contract.Setting, value: String): Boolean =
    value.toLowerCase(Locale.ROOT) match {
      case "true" => true
      case "false" => false
      case _ => throw typeMismatch(s, value, "boolean")
    }

  private def integer(s: Contract.Setting, value: String): Long = {
    val n = value.toLongOption.getOrElse(throw typeMismatch(s, value, "integer"))
    if (s.min.exists(n < _) || s.max.exists(n > _)) {
      val range = (s.min, s.max) match {
        case (Some(low), Some(high)) => s"between $low and $high"
        case (Some(low), None) => s"at least $low"
        case (_, high) => s"at most ${high.get}"
      }
      throw new SparkIllegalArgumentException("INVALID_CONF_VALUE.REQUIREMENT",
        Map("confName" -> s.key, "confValue" -> value,
          "confRequirement" -> s"${s.key} must be an integer $range."))
    }
    n
  }

  private def size(s: Contract.Setting, value: String): Long =
    try JavaUtils.byteStringAsBytes(value) catch {
      case _: IllegalArgumentException | _: ArithmeticException =>
        throw typeMismatch(s, value, "size in bytes (such as 512m or 2g)")
    }

  private def typeMismatch(s: Contract.Setting, value: String, confType: String) =
    new SparkIllegalArgumentException("INVALID_CONF_VALUE.TYPE_MISMATCH",
      Map("confName" -> s.key, "confValue" -> value, "confType" -> confType))
}
