package org.apache.spark.sql.arrowstate.tools

import java.io.InputStream
import java.net.InetAddress
import java.nio.charset.StandardCharsets

import scala.jdk.CollectionConverters._

import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperator, StatefulOperatorStateInfo}
import org.apache.spark.util.Utils

import org.apache.spark.sql.arrowstate.errors.ArrowStateException
import org.apache.spark.sql.arrowstate.store.StateFiles

/**
 * A stateful operator that stays Spark's must not meet arrowstate's state: Spark's store
 * would fail on the missing files with an error that names neither engine. The planning rule
 * asks here for each operator it leaves to Spark; checked once per query run and operator (a
 * listing of its state directory), and state arrowstate wrote is converted to Spark's store
 * there (LeaveArrowState).
 */
object StateEngineCheck {
  private val checked = java.util.concurrent.ConcurrentHashMap.newKeySet[(String, Long)]()

  def apply(node: SparkPlan, reasons: Seq[String]): Unit = node match {
    // a batch query's stateful operator (transformWithState) has no checkpoint location
    case s: StatefulOperator if s.stateInfo.exists(_.checkpointLocation.nonEmpty) =>
      val info = s.stateInfo.get
      if (checked.add((info.queryRunId.toString, info.operatorId))) {
        val dir = new Path(info.checkpointLocation, info.operatorId.toString)
        val hadoopConf = SparkSession.active.sessionState.newHadoopConf()
        if (StateFiles.operatorHoldsArrowState(dir, hadoopConf)) {
          try LeaveArrowState(info, node.nodeName, reasons, dir) catch {
            case e: Throwable =>
              checked.remove((info.queryRunId.toString, info.operatorId))
              throw e
          }
        }
      }
    case _ =>
  }
}

/**
 * A query leaving arrowstate: an operator that now runs on Spark's own state store (arrowstate
 * switched off, for the family or at all, or the operator no longer one it runs) whose state
 * arrowstate wrote. At planning, as a query adopting arrowstate converts Spark's state on its
 * first load, the state is converted to Spark's store: by the project's one export
 * (`python -m arrowstate state export --operator N --planning-batch B`, with its checks and
 * its move of arrowstate's files aside), run on the driver in a process of its own (the
 * conversion is Python's as much as the JVM's, and this JVM may serve no Python driver, as
 * under Spark Connect). That process starts no Spark of its own: it reaches this JVM through
 * a py4j server opened for it alone (loopback, a secret of its own, shut after), and
 * converts in a new session of the planning query's SparkContext (a second local Spark
 * would take 15-30 s and a JVM's memory on the driver). The planning batch then loads the
 * converted version; the conversion is logged. The checkpoint may be on any filesystem
 * Spark's checkpoints are on: the process reads and writes it through Hadoop's FileSystem in
 * that session, with the planning query's Hadoop settings (its SparkContext's and its own
 * `fs.*`), so none is copied to its command line or environment. A conversion that fails
 * fails the query with ARROWSTATE_STATE_NEEDS_EXPORT naming why and the command.
 */
object LeaveArrowState extends Logging {
  // what pyspark hands the JVM it launched: a child pyspark must start a Spark of its own
  private val GatewayEnv = Seq("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET",
    "_PYSPARK_DRIVER_CONN_INFO_PATH")

  def apply(info: StatefulOperatorStateInfo, nodeName: String, reasons: Seq[String],
      stateDir: Path): Unit = {
    val checkpoint = new Path(info.checkpointLocation).getParent
    val uri = checkpoint.toUri
    // the checkpoint as the state tools take it: a local path, else its URI, scheme included
    val local = uri.getScheme == null || uri.getScheme == "file"
    val where = if (local) uri.getPath else checkpoint.toString
    val session = SparkSession.active   // the planning query's
    val command = Seq(pythonExec(session), "-m", "arrowstate", "state", "export", where,
      "--operator", info.operatorId.toString, "--planning-batch", info.storeVersion.toString)

    def fail(why: String): Nothing = throw new ArrowStateException(
      ArrowStateException.NeedsExport,
      Map("operatorId" -> info.operatorId.toString, "node" -> nodeName,
        "reasons" -> reasons.mkString("; "), "stateDir" -> stateDir.toString),
      s"arrowstate: operator ${info.operatorId} ($nodeName) runs on Spark's own state store " +
        s"(${reasons.mkString("; ")}), but its state in $stateDir was written by arrowstate, " +
        s"and $why. Run it on arrowstate, or convert the checkpoint's state to Spark's " +
        s"format with the query stopped: `python -m arrowstate state export $where`" +
        (if (local) "." else " with the filesystem's settings as `--conf KEY=VALUE` " +
          "(docs/state-tools.md)."))

    // Spark's commit log names arrowstate's checkpoint ids for every version: Spark's store
    // could load no version of the conversion by them
    if (StatefulOperatorStateInfo.enableStateStoreCheckpointIds(session.sessionState.conf)) {
      fail("the query uses state checkpoint format v2 " +
        "(spark.sql.streaming.stateStore.checkpointFormatVersion=2, which real-time mode " +
        "sets), whose commit log names arrowstate's checkpoint ids: Spark's store cannot " +
        "load state converted for it, nor can the export")
    }
    logWarning(s"arrowstate: operator ${info.operatorId} ($nodeName) leaves arrowstate " +
      s"(${reasons.mkString("; ")}): converting its state at batch ${info.storeVersion} to " +
      s"Spark's state store: ${command.mkString(" ")}")
    val builder = new ProcessBuilder(command.asJava)
    GatewayEnv.foreach(builder.environment().remove(_))
    val secret = Utils.createSecret(session.sparkContext.getConf)
    // ClientServer: the child's Python thread keeps one JVM thread (its active session)
    val gateway = new py4j.ClientServer.ClientServerBuilder(new DriverSession(session))
      .authToken(secret).javaPort(0).javaAddress(InetAddress.getLoopbackAddress)
      .autoStartJavaServer(false).build()
    val (stdout, stderr, exit) = try {
      gateway.startServer()
      builder.environment().putAll(Map(
        "PYSPARK_GATEWAY_PORT" -> gateway.getJavaServer.getListeningPort.toString,
        "PYSPARK_GATEWAY_SECRET" -> secret, "PYSPARK_PIN_THREAD" -> "true").asJava)
      val process = builder.start()
      process.getOutputStream.close()
      val stderr = drained(process.getErrorStream)
      val stdout = new String(process.getInputStream.readAllBytes(), StandardCharsets.UTF_8)
      val exit = process.waitFor()
      stderr.join()
      (stdout, stderr, exit)
    } finally gateway.shutdown()
    if (exit != 0) {
      val said = stderr.text.linesIterator.filter(_.startsWith("arrowstate:")).toSeq
      fail(s"converting it at planning (`${command.mkString(" ")}`) failed with exit code " +
        s"$exit: ${if (said.nonEmpty) said.mkString(" ") else stderr.text.takeRight(2000)}")
    }
    logWarning(s"arrowstate: operator ${info.operatorId} ($nodeName) now runs on Spark's " +
      s"state store; its state was converted: ${stdout.replaceAll("\\s+", " ").trim}")
  }

  /** What the conversion's process reaches through its py4j server: the planning query's
   * session (`session()`), whose SparkContext it converts with. */
  final class DriverSession(val session: SparkSession)

  /** The driver's Python, as Spark picks it for the driver. */
  private def pythonExec(session: SparkSession): String = {
    val conf = session.sparkContext.getConf
    Seq("spark.arrowstate.pythonExec", "spark.pyspark.driver.python", "spark.pyspark.python")
      .flatMap(conf.getOption).headOption
      .orElse(sys.env.get("PYSPARK_DRIVER_PYTHON")).orElse(sys.env.get("PYSPARK_PYTHON"))
      .getOrElse("python3")
  }

  /** A stream read whole on a thread of its own (so that neither pipe fills and blocks). */
  private class Drained(in: InputStream) extends Thread("arrowstate-export-stderr") {
    @volatile var text: String = ""
    override def run(): Unit = text = new String(in.readAllBytes(), StandardCharsets.UTF_8)
  }

  private def drained(in: InputStream): Drained = {
    val t = new Drained(in)
    t.setDaemon(true)
    t.start()
    t
  }
}
