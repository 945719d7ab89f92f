package org.apache.spark.sql.arrowstate.planning

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.runtime.RealTimeModeAllowlist
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.exec.TriggerMode

/**
 * Spark checks every node of a real-time query against its allowlist of operators known to
 * emit as rows arrive (RealTimeModeAllowlist; `spark.sql.streaming.realTimeMode.allowlistCheck`
 * turns the check into a warning). arrowstate's real-time nodes are such operators: this adds
 * their class names (the nodes the families declare for real-time mode) to that list once per
 * JVM, when the extension is installed, so Spark's own check passes them and still refuses
 * every other node it does not know, as the user set it.
 *
 * The list is a private constant of Spark's object, with no API to extend it: it is replaced
 * through sun.misc.Unsafe (a static final field, which reflection cannot set on Java 17). If
 * that fails (another JVM, another Spark build), the log says why, and planning, which asks
 * Spark's list itself (`refusal`), leaves every real-time operator to Spark with the reason.
 */
object RealTimeAllowlist extends Logging {
  /** The class names of the nodes the families make in real-time mode. */
  def operators: Seq[String] = FamilyRegistry.nodesIn(TriggerMode.RealTime).map(_.getName)

  /** A JVM system property that, set to true, makes the registration fail (tests: as it does
   * without access to sun.misc.Unsafe). */
  val FailForTests = "arrowstate.test.failAllowlistRegistration"

  @volatile private var registered = false

  def register(): Unit = synchronized {
    if (!registered) {
      registered = true
      try add(operators)
      catch {
        case e: Exception =>
          logWarning("arrowstate: could not add its real-time operators to Spark's real-time " +
            s"mode allowlist (${e.getClass.getName}: ${e.getMessage}); in real-time mode " +
            "every stateful operator stays Spark's", e)
      }
    }
  }

  private def add(names: Seq[String]): Unit = {
    if (java.lang.Boolean.getBoolean(FailForTests)) {
      throw new UnsupportedOperationException(s"the system property $FailForTests is set")
    }
    val owner = RealTimeModeAllowlist.getClass
    val field = owner.getDeclaredField("allowedOperators")
    val unsafeField = classOf[sun.misc.Unsafe].getDeclaredField("theUnsafe")
    unsafeField.setAccessible(true)
    val unsafe = unsafeField.get(null).asInstanceOf[sun.misc.Unsafe]
    val base = unsafe.staticFieldBase(field)
    val offset = unsafe.staticFieldOffset(field)
    val current = unsafe.getObjectVolatile(base, offset).asInstanceOf[Set[String]]
    unsafe.putObjectVolatile(base, offset, current ++ names)
  }

  /** Whether Spark's list holds the class name (false when the list cannot be read). */
  def holds(name: String): Boolean =
    try {
      val field = RealTimeModeAllowlist.getClass.getDeclaredField("allowedOperators")
      field.setAccessible(true)
      field.get(null).asInstanceOf[Set[String]].contains(name)
    } catch {
      case NonFatal(_) => false
    }

  /** Why Spark's check would refuse these real-time nodes: some are not on its list and the
   * check is on. None when it would pass them. */
  def refusal(nodes: Seq[Class[_ <: SparkPlan]], conf: SQLConf): Option[String] = {
    val missing = nodes.filterNot(n => holds(n.getName))
    if (missing.isEmpty || !conf.getConf(SQLConf.STREAMING_REAL_TIME_MODE_ALLOWLIST_CHECK)) None
    else Some(s"${TriggerMode.RealTime.explain}: Spark's real-time allowlist does not hold " +
      s"${missing.map(_.getSimpleName).mkString(", ")} (arrowstate could not add it: the " +
      "driver's log says why), and Spark's check " +
      s"(${SQLConf.STREAMING_REAL_TIME_MODE_ALLOWLIST_CHECK.key}) refuses what it does not hold")
  }
}
