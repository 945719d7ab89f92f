package org.apache.spark.sql.arrowstate.unit

import scala.jdk.CollectionConverters._

import org.apache.spark.{SparkConf, SparkIllegalArgumentException}
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}

/**
 * ArrowStateConf reads each `spark.arrowstate.*` setting as contract.json types it: what the
 * type does not take fails with Spark's INVALID_CONF_VALUE, from the planning rule's check
 * (`validate`) and from the reader alike, never read as a default or as off.
 */
object SettingsTests extends UnitTests {
  private val Percent = "spark.arrowstate.worker.stateMemoryPercent"

  private def conf(settings: (String, String)*): SQLConf = {
    val c = new SQLConf
    settings.foreach { case (k, v) => c.setConfString(k, v) }
    c
  }

  /** The value is refused by validate and by `read`, both with the same condition. */
  private def refused(key: String, value: String)(read: SQLConf => Any)
    : SparkIllegalArgumentException = {
    val c = conf(key -> value)
    val checked = assertThrows[SparkIllegalArgumentException](ArrowStateConf.validate(c))
    val e = assertThrows[SparkIllegalArgumentException](read(c))
    assertEqual(checked.getCondition, e.getCondition, s"$key=$value")
    assertEqual(e.getSqlState, "22022", e.getMessage)
    assertTrue(e.getMessage.contains(key) && e.getMessage.contains(s"'$value'"), e.getMessage)
    e
  }

  private def parameters(e: SparkIllegalArgumentException) = e.getMessageParameters.asScala.toMap

  test("a boolean takes true and false in any case") {
    for ((value, expected) <- Seq("true" -> true, "TRUE" -> true, "False" -> false,
        " false " -> false)) {
      val c = conf(ArrowStateConf.Enabled -> value)
      ArrowStateConf.validate(c)
      assertEqual(ArrowStateConf.flag(c, ArrowStateConf.Enabled), expected, value)
    }
    assertEqual(ArrowStateConf.flag(conf(), ArrowStateConf.Enabled), true, "the default")
    assertEqual(ArrowStateConf.flag(conf(), ArrowStateConf.FallbackStrict), false, "the default")
  }

  test("a boolean refuses yes, 1, on, a typo and nothing with TYPE_MISMATCH") {
    for (value <- Seq("yes", "1", "on", "ture", "")) {
      val e = refused(ArrowStateConf.FallbackStrict, value)(
        ArrowStateConf.flag(_, ArrowStateConf.FallbackStrict))
      assertEqual(e.getCondition, "INVALID_CONF_VALUE.TYPE_MISMATCH")
      assertEqual(parameters(e), Map("confName" -> ArrowStateConf.FallbackStrict,
        "confValue" -> value, "confType" -> "boolean"))
    }
  }

  test("an integer takes whole numbers within its bounds") {
    val c = conf(ArrowStateConf.AffinityWaitMs -> "0", Percent -> "100")
    ArrowStateConf.validate(c)
    assertEqual(ArrowStateConf.long(c, ArrowStateConf.AffinityWaitMs), 0L)
    assertEqual(ArrowStateConf.long(c, Percent), 100L)
    assertEqual(ArrowStateConf.long(conf(), ArrowStateConf.IdleTimeoutSeconds), 60L)
  }

  test("an integer refuses words with TYPE_MISMATCH and values out of bounds with REQUIREMENT") {
    val word = refused(ArrowStateConf.IdleTimeoutSeconds, "1m")(
      ArrowStateConf.long(_, ArrowStateConf.IdleTimeoutSeconds))
    assertEqual(parameters(word), Map("confName" -> ArrowStateConf.IdleTimeoutSeconds,
      "confValue" -> "1m", "confType" -> "integer"))
    for ((key, value, requirement) <- Seq(
        (Percent, "101", "between 0 and 100"), (Percent, "-1", "between 0 and 100"),
        (ArrowStateConf.AffinityWaitMs, "-5", "at least 0"))) {
      val e = refused(key, value)(ArrowStateConf.long(_, key))
      assertEqual(e.getCondition, "INVALID_CONF_VALUE.REQUIREMENT")
      assertEqual(parameters(e)("confName"), key)
      assertTrue(parameters(e)("confRequirement").contains(requirement), e.getMessage)
    }
  }

  test("a size takes Spark's byte strings and refuses others with TYPE_MISMATCH") {
    val none = new SparkConf(false)
    for ((value, bytes) <- Seq("2g" -> (2L << 30), "512m" -> (512L << 20), "4096" -> 4096L)) {
      val c = conf(ArrowStateConf.WorkerMemory -> value)
      ArrowStateConf.validate(c)
      assertEqual(ArrowStateConf.workerMemoryBytes(c, none), bytes, value)
    }
    assertEqual(ArrowStateConf.workerMemoryBytes(conf(), none), 0L, "unset: no budget")
    for (value <- Seq("lots", "-1g", "2 gigabytes")) {
      val e = refused(ArrowStateConf.WorkerMemory, value)(
        ArrowStateConf.workerMemoryBytes(_, none))
      assertEqual(e.getCondition, "INVALID_CONF_VALUE.TYPE_MISMATCH")
      assertEqual(parameters(e)("confName"), ArrowStateConf.WorkerMemory)
    }
  }

  test("every setting but a path refuses a word, and every default is taken") {
    for (s <- Contract.Settings.values) {
      if (s.default.nonEmpty && s.valueType != "path") ArrowStateConf.validate(conf(s.key -> s.default))
      if (s.valueType == "path") ArrowStateConf.validate(conf(s.key -> "any /where"))
      else {
        val e = assertThrows[SparkIllegalArgumentException](
          ArrowStateConf.validate(conf(s.key -> "nonsense")))
        assertEqual(parameters(e)("confName"), s.key)
      }
    }
    ArrowStateConf.validate(conf())
  }
}
