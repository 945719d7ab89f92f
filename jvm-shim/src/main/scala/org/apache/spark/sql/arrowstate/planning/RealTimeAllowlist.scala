package org.apache.spark.sql.arrowstate.planning

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.runtime.RealTimeModeAllowlist

import org.apache.spark.sql.arrowstate.families.{ArrowFlatMapGroupsWithStateExec, ArrowStreamingDeduplicateExec, ArrowTransformWithStateExec}

/**
 * Spark checks every node of a real-time query against its allowlist of operators known to
 * emit as rows arrive (RealTimeModeAllowlist; `spark.sql.streaming.realTimeMode.allowlistCheck`
 * turns the check into a warning). arrowstate's real-time nodes are such operators: this adds
 * their class names to that list once per JVM, when the extension is installed, so Spark's own
 * check passes them and still refuses every other node it does not know, as the user set it.
 *
 * The list is a private constant of Spark's object, with no API to extend it: it is replaced
 * through sun.misc.Unsafe (a static final field, which reflection cannot set on Java 17). If
 * that fails (another JVM, another Spark build), nothing changes: the check refuses our nodes
 * with Spark's own error naming them, and the log says why.
 */
object RealTimeAllowlist extends Logging {
  val Operators: Seq[String] =
    Seq(classOf[ArrowFlatMapGroupsWithStateExec], classOf[ArrowTransformWithStateExec],
      classOf[ArrowStreamingDeduplicateExec]).map(_.getName)

  @volatile private var registered = false

  def register(): Unit = synchronized {
    if (!registered) {
      registered = true
      try add(Operators)
      catch {
        case e: Exception =>
          logWarning("arrowstate: could not add its real-time operators to Spark's real-time " +
            s"mode allowlist (${e.getClass.getName}: ${e.getMessage}); real-time queries with " +
            "Python state functions fail Spark's allowlist check", e)
      }
    }
  }

  private def add(names: Seq[String]): Unit = {
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

  /** Whether Spark's list holds them (tests, and EXPLAIN's reason when it does not). */
  def holds(name: String): Boolean = {
    val field = RealTimeModeAllowlist.getClass.getDeclaredField("allowedOperators")
    field.setAccessible(true)
    field.get(null).asInstanceOf[Set[String]].contains(name)
  }
}
