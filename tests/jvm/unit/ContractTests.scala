package org.apache.spark.sql.arrowstate.unit

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Paths}

import org.json4s._
import org.json4s.jackson.JsonMethods

import org.apache.spark.sql.arrowstate.contract.{ArrowStateConf, Contract}
import org.apache.spark.sql.arrowstate.planning.FamilyRegistry

/**
 * Contract (the shim's view of contract.json, loaded from the jar) against the JSON file
 * itself, read here on its own: the file the pytest side names in `-Darrowstate.contract`
 * (the Python package's contract.json), else the copy in the jar.
 */
object ContractTests extends UnitTests {
  private implicit val formats: Formats = DefaultFormats

  private lazy val json: JValue = {
    val text = sys.props.get("arrowstate.contract") match {
      case Some(path) => new String(Files.readAllBytes(Paths.get(path)), UTF_8)
      case None =>
        val in = getClass.getResourceAsStream("/arrowstate/contract.json")
        assertTrue(in != null, "no -Darrowstate.contract and no contract.json in the jar")
        try new String(in.readAllBytes(), UTF_8) finally in.close()
    }
    JsonMethods.parse(text)
  }

  private def fields(key: String): List[(String, JValue)] = json \ key match {
    case JObject(fs) => fs.filterNot(_._1.startsWith("_"))
    case other => fail(s"contract.json's '$key' is not an object: $other")
  }

  /** A metric's `families`: None when absent (json4s' extractOpt of a list gives Some(Nil)). */
  private def families(metric: JValue): Option[List[String]] = metric \ "families" match {
    case JNothing => None
    case v => Some(v.extract[List[String]])
  }

  private lazy val frameTags: Map[String, Int] =
    fields("frames").map { case (name, f) => name -> (f \ "tag").extract[Int] }.toMap

  test("the protocol version is the file's") {
    assertEqual(Contract.ProtocolVersion, (json \ "protocolVersion").extract[Int])
  }

  test("every frame is the file's: its tag and the fields each side sends") {
    assertEqual(Contract.Frames.keySet, frameTags.keySet, "frame names")
    for ((name, f) <- fields("frames")) {
      val frame = Contract.Frames(name)
      assertEqual(frame.tag, frameTags(name), s"frame $name")
      def body(side: String) = (f \ side).extractOpt[List[List[String]]]
        .map(_.map { case List(n, t) => n -> t })
      assertEqual(frame.fromJvm, body("fromJvm"), s"frame $name fromJvm")
      assertEqual(frame.fromPython, body("fromPython"), s"frame $name fromPython")
      assertEqual(frame.reply, body("reply"), s"frame $name reply")
    }
    for (name <- Seq("ERROR", "HELLO", "TASK", "DATA", "COMMIT", "COMMITTED", "END")) {
      assertTrue(Contract.Frames.contains(name), s"Contract.Frame names $name")
    }
  }

  test("frame tags are distinct") {
    val tags = frameTags.values.toList
    assertEqual(tags.distinct.size, tags.size, s"tags $frameTags")
  }

  test("describe() reports the frames, families, metrics and settings the file declares") {
    val seen = JsonMethods.parse(Contract.describe)
    assertEqual((seen \ "protocolVersion").extract[Int], (json \ "protocolVersion").extract[Int])
    assertEqual((seen \ "frames").extract[Map[String, Int]], frameTags)
    assertEqual((seen \ "families").extract[List[String]], fields("families").map(_._1).sorted)
    assertEqual((seen \ "metrics").extract[List[String]],
      (json \ "metrics").extract[List[JValue]].map(m => (m \ "name").extract[String]))
    assertEqual((seen \ "settings").extract[List[String]],
      (json \ "settings").extract[List[JValue]].map(s => (s \ "key").extract[String]).sorted)
  }

  test("every setting is the file's, with its type, bounds, default, scope and doc") {
    val declared = (json \ "settings").extract[List[JValue]]
    val keys = declared.map(s => (s \ "key").extract[String])
    assertEqual(Contract.Settings.keySet, keys.toSet, "setting keys")
    for (s <- declared) {
      def text(field: String) = (s \ field).extract[String]
      assertEqual(Contract.setting(text("key")), Contract.Setting(text("key"), text("default"),
        text("scope"), text("doc"), text("type"), (s \ "min").extractOpt[Long],
        (s \ "max").extractOpt[Long]))
    }
    assertEqual(Contract.SettingTypes, fields("settingTypes").map(_._1).toSet)
  }

  test("ArrowStateConf's keys are declared settings") {
    for (key <- Seq(ArrowStateConf.Enabled, ArrowStateConf.FallbackStrict,
        ArrowStateConf.AffinityWaitMs, ArrowStateConf.IdleTimeoutSeconds)) {
      assertTrue(Contract.Settings.contains(key), s"$key is not in contract.json's settings")
    }
  }

  test("an undeclared setting or family fails with its name") {
    val e = assertThrows[IllegalStateException](Contract.setting("spark.arrowstate.nope"))
    assertTrue(e.getMessage.contains("spark.arrowstate.nope"), e.getMessage)
    val f = assertThrows[IllegalStateException](Contract.family("nope"))
    assertTrue(f.getMessage.contains("nope"), f.getMessage)
  }

  test("every metric is the file's, in its order, with all its fields") {
    val declared = (json \ "metrics").extract[List[JValue]]
    assertEqual(Contract.Metrics.map(_.name), declared.map(m => (m \ "name").extract[String]))
    for ((metric, m) <- Contract.Metrics.zip(declared)) {
      assertEqual(metric, Contract.Metric(
        (m \ "name").extract[String], (m \ "owner").extract[String],
        (m \ "reportedBy").extract[String], (m \ "kind").extract[String],
        (m \ "unit").extract[String], (m \ "description").extract[String],
        families(m), (m \ "sparkMetric").extractOpt[String]))
    }
    assertEqual(Contract.MetricsByName.keySet, Contract.Metrics.map(_.name).toSet)
  }

  test("the metrics the worker may report per family follow reportedBy and families") {
    val declared = (json \ "metrics").extract[List[JValue]]
    for ((family, _) <- fields("families")) {
      val expected = declared.filter { m =>
        Set("python", "both")((m \ "reportedBy").extract[String]) &&
          families(m).forall(_.contains(family))
      }.map(m => (m \ "name").extract[String]).toSet
      assertEqual(Contract.pythonMetrics(family), expected, s"family $family")
    }
    assertEqual(Contract.pythonMetrics("noSuchFamily"), Set.empty[String])
  }

  test("every family is the file's, with its node, switch and userCode") {
    val declared = fields("families")
    assertEqual(Contract.Families.keySet, declared.map(_._1).toSet)
    for ((name, f) <- declared) {
      assertEqual(Contract.family(name), Contract.Family(name, (f \ "node").extract[String],
        (f \ "switch").extract[String], (f \ "userCode").extractOpt[Boolean].getOrElse(false)))
    }
  }

  test("file suffixes, payloads, store settings and error SQLSTATEs are the file's") {
    val files = (json \ "files").extract[Map[String, String]]
    assertEqual(Contract.DeltaSuffix, files("deltaSuffix"))
    assertEqual(Contract.SnapshotSuffix, files("snapshotSuffix"))
    assertEqual(Contract.Payloads.keySet, fields("payloads").map(_._1).toSet)
    assertEqual(Contract.StoreConf, (json \ "storeConf").extract[Map[String, String]])
    assertEqual(Contract.ErrorSqlStates,
      fields("errors").map { case (name, e) => name -> (e \ "sqlState").extract[String] }.toMap)
  }

  test("every declared family has one JVM family in the planning rule and an operator payload") {
    val planned = FamilyRegistry.families.map(_.name)
    assertEqual(planned.distinct.size, planned.size, s"families asked twice: $planned")
    assertEqual(planned.toSet, Contract.Families.keySet, "the rule's families and the file's")
    for (name <- planned) {
      assertTrue(Contract.Payloads.contains(s"operator.$name"), s"payloads.operator.$name")
    }
  }
}
