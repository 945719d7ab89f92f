package org.apache.spark.sql.arrowstate.unit

import org.json4s._

import org.apache.spark.sql.execution.SortExec
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.Contract
import org.apache.spark.sql.arrowstate.exec.TriggerMode
import org.apache.spark.sql.arrowstate.families.{Runs, StaysSpark}
import org.apache.spark.sql.arrowstate.planning.{FamilyRegistry, RealTimeAllowlist, TriggerSupport}

/**
 * Each family declares its trigger modes once (`ArrowStateFamily.modes`); Spark's real-time
 * allowlist, EXPLAIN's reasons and the operator payload's mode come from that declaration.
 * These tests fail when a family, the allowlist, EXPLAIN and the contract disagree.
 */
object TriggerModesTests extends UnitTests {
  private def nodes(mode: TriggerMode) = FamilyRegistry.families.map { f =>
    f -> (f.modes(mode) match {
      case Runs(nodes, _) => nodes
      case _: StaysSpark => Nil
    })
  }

  private def named(text: String, node: String): Boolean =
    s"(?<![A-Za-z])$node(?![A-Za-z])".r.findFirstIn(text).isDefined

  test("a family that runs in a mode makes there the node contract.json names for it") {
    for (mode <- TriggerMode.All; (family, made) <- nodes(mode) if made.nonEmpty) {
      val node = Contract.family(family.name).node
      assertTrue(made.exists(_.getSimpleName == s"${node}Exec"),
        s"${family.name} in ${mode.name} makes ${made.map(_.getSimpleName)}, not ${node}Exec")
    }
    assertTrue(FamilyRegistry.runningIn(TriggerMode.RealTime).nonEmpty,
      "no family runs in real-time mode")
  }

  test("Spark's real-time allowlist holds the real-time families' nodes and no other node") {
    RealTimeAllowlist.register()
    val realTime = FamilyRegistry.nodesIn(TriggerMode.RealTime)
    for (node <- realTime) {
      assertTrue(RealTimeAllowlist.holds(node.getName), s"the allowlist lacks ${node.getName}")
    }
    for (node <- FamilyRegistry.nodesIn(TriggerMode.MicroBatch).filterNot(realTime.contains)) {
      assertTrue(!RealTimeAllowlist.holds(node.getName),
        s"the allowlist holds ${node.getName}, which no family makes in real-time mode")
    }
    assertEqual(RealTimeAllowlist.operators.sorted, realTime.map(_.getName).sorted)
  }

  test("EXPLAIN's real-time reason names the nodes of exactly the families that run there") {
    val reason = TriggerSupport.noFamilyReason(TriggerMode.RealTime)
    assertTrue(reason.startsWith(TriggerMode.RealTime.explain), reason)
    for ((family, made) <- nodes(TriggerMode.RealTime)) {
      val node = Contract.family(family.name).node
      assertEqual(named(reason, node), made.nonEmpty, s"$node in '$reason'")
    }
  }

  test("a family that runs in real-time mode declares the mode's fields in its payload") {
    for (family <- FamilyRegistry.runningIn(TriggerMode.RealTime)) {
      val payload = Contract.Payloads(s"operator.${family.name}")
      for ((field, _) <- TriggerMode.RealTime.operatorFields.obj) {
        assertTrue(payload \ "properties" \ field != JNothing,
          s"contract.json payloads.operator.${family.name} does not declare $field")
      }
    }
  }

  test("a real-time node Spark's list does not hold is refused while Spark's check is on") {
    RealTimeAllowlist.register()
    val conf = new SQLConf
    assertEqual(RealTimeAllowlist.refusal(FamilyRegistry.nodesIn(TriggerMode.RealTime), conf),
      None)
    // SortExec: a node Spark's list does not hold
    val refused = RealTimeAllowlist.refusal(Seq(classOf[SortExec]), conf)
    assertTrue(refused.exists(r => r.contains("SortExec") &&
      r.contains(SQLConf.STREAMING_REAL_TIME_MODE_ALLOWLIST_CHECK.key)), refused.toString)
    conf.setConf(SQLConf.STREAMING_REAL_TIME_MODE_ALLOWLIST_CHECK, false)
    assertEqual(RealTimeAllowlist.refusal(Seq(classOf[SortExec]), conf), None)
  }
}
