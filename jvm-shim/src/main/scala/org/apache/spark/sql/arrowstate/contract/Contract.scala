package org.apache.spark.sql.arrowstate.contract

import org.json4s._
import org.json4s.jackson.JsonMethods

import org.apache.spark.SparkContext
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.execution.python.PythonSQLMetrics
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorCustomMetric
import org.apache.spark.sql.arrowstate.errors.{ContractFile, ErrorConditions}

/**
 * The JVM <-> Python contract, loaded from `arrowstate/contract.json` in the jar: the same
 * file the Python package loads (the build copies it in). A name missing from it fails when
 * this object initialises, so the two halves cannot drift apart silently.
 */
object Contract {
  private implicit val formats: Formats = DefaultFormats

  private val spec: JValue = ContractFile.json

  val ProtocolVersion: Int = (spec \ "protocolVersion").extract[Int]

  /** A frame: its tag and the (name, type) fields of its body as each side sends it (None:
   * that side never sends it) and of the JVM's reply to it (tagged with the request's tag). */
  case class FrameSpec(
      name: String, tag: Int, fromJvm: Option[Seq[(String, String)]],
      fromPython: Option[Seq[(String, String)]], reply: Option[Seq[(String, String)]])

  val Frames: Map[String, FrameSpec] = (spec \ "frames") match {
    case JObject(fields) => fields.map { case (name, f) =>
      def body(side: String): Option[Seq[(String, String)]] =
        (f \ side).extractOpt[List[List[String]]].map(_.map { case List(n, t) => n -> t })
      name -> FrameSpec(name, (f \ "tag").extract[Int], body("fromJvm"), body("fromPython"),
        body("reply"))
    }.toMap
    case _ => throw new IllegalStateException("arrowstate: contract.json declares no frames")
  }
  val FramesByTag: Map[Int, FrameSpec] = Frames.values.map(f => f.tag -> f).toMap
  private def frame(name: String): FrameSpec =
    Frames.getOrElse(name, throw new IllegalStateException(s"arrowstate: no frame $name"))

  object Frame {
    val Error: FrameSpec = frame("ERROR")
    val Ready: FrameSpec = frame("READY")
    val ListFiles: FrameSpec = frame("LIST_FILES")
    val Data: FrameSpec = frame("DATA")
    val NoData: FrameSpec = frame("NO_DATA")
    val End: FrameSpec = frame("END")
    val Committed: FrameSpec = frame("COMMITTED")
    val Lookup: FrameSpec = frame("LOOKUP")
    val ReadFile: FrameSpec = frame("READ_FILE")
    val Commit: FrameSpec = frame("COMMIT")
    val FileTail: FrameSpec = frame("FILE_TAIL")
    val Drop: FrameSpec = frame("DROP")
    val ReadState: FrameSpec = frame("READ_STATE")
    val ImportState: FrameSpec = frame("IMPORT_STATE")
    val InitialState: FrameSpec = frame("INITIAL_STATE")
    val Hello: FrameSpec = frame("HELLO")
    val Task: FrameSpec = frame("TASK")
    val PreInit: FrameSpec = frame("PRE_INIT")
  }

  /** JSON payloads by name, as JSON Schema (checked by ContractSchema). */
  val Payloads: Map[String, JValue] = (spec \ "payloads") match {
    case JObject(fields) => fields.toMap
    case _ => throw new IllegalStateException("arrowstate: contract.json declares no payloads")
  }

  /** arrowstate's own error conditions -> their SQLSTATE (Spark's own are in its registry). */
  val ErrorSqlStates: Map[String, String] = ErrorConditions.SqlStates

  /** Header `conf` field name -> the Spark setting it carries. */
  val StoreConf: Map[String, String] = (spec \ "storeConf").extract[Map[String, String]]

  private val files = (spec \ "files").extract[Map[String, String]]
  val DeltaSuffix: String = files("deltaSuffix")
  val SnapshotSuffix: String = files("snapshotSuffix")
  val RunSuffix: String = files("runSuffix")

  case class Family(name: String, node: String, switch: String, userCode: Boolean)
  val Families: Map[String, Family] = (spec \ "families") match {
    case JObject(fields) => fields.map { case (name, f) =>
      name -> Family(name, (f \ "node").extract[String], (f \ "switch").extract[String],
        (f \ "userCode").extractOpt[Boolean].getOrElse(false))
    }.toMap
    case _ => Map.empty
  }
  def family(name: String): Family = Families.getOrElse(name,
    throw new IllegalStateException(s"arrowstate: contract.json declares no family $name"))

  /** A metric; `sparkMetric`: the SQL metric of Spark's Python operators that shows the same
   * figure in the SQL tab (it shows there under Spark's name and label, not under `name`). */
  case class Metric(
      name: String, owner: String, reportedBy: String, kind: String, unit: String,
      description: String, families: Option[List[String]],
      sparkMetric: Option[String] = None) {
    def appliesTo(family: String): Boolean = families.forall(_.contains(family))
    /** Not among StateStoreWriter's own metrics: the operator declares it itself. */
    def custom: Boolean = owner == "arrowstate" || families.isDefined
    /** Its key in an operator's SQL metrics. */
    def sqlName: String = sparkMetric.getOrElse(name)
  }
  /** In the declared order: a `metrics` frame value names each by its place here. */
  val Metrics: IndexedSeq[Metric] = (spec \ "metrics").extract[List[Metric]].toIndexedSeq
  val MetricsByName: Map[String, Metric] = Metrics.map(m => m.name -> m).toMap
  val MetricPlaces: Map[String, Int] = Metrics.map(_.name).zipWithIndex.toMap

  /** The metric names the worker may report for operators of `family` (checked per task). */
  private val pythonMetricsByFamily: Map[String, Set[String]] = Families.keys.map { family =>
    family -> Metrics.filter(m => Set("python", "both")(m.reportedBy) && m.appliesTo(family))
      .map(_.name).toSet
  }.toMap
  def pythonMetrics(family: String): Set[String] =
    pythonMetricsByFamily.getOrElse(family, Set.empty)

  /** A setting; `valueType` is one of `settingTypes` (what ArrowStateConf parses it as), with
   * an integer's bounds where it declares them. */
  case class Setting(
      key: String, default: String, scope: String, doc: String, valueType: String,
      min: Option[Long] = None, max: Option[Long] = None)
  val SettingTypes: Set[String] = (spec \ "settingTypes").extract[Map[String, String]].keySet
  val Settings: Map[String, Setting] = (spec \ "settings").extract[List[JValue]].map { s =>
    val key = (s \ "key").extract[String]
    val valueType = (s \ "type").extract[String]
    require(SettingTypes(valueType), s"arrowstate: contract.json's setting $key has type " +
      s"$valueType, not one of settingTypes ${SettingTypes.toList.sorted.mkString(", ")}")
    key -> Setting(key, (s \ "default").extract[String], (s \ "scope").extract[String],
      (s \ "doc").extract[String], valueType, (s \ "min").extractOpt[Long],
      (s \ "max").extractOpt[Long])
  }.toMap
  def setting(key: String): Setting = Settings.getOrElse(key,
    throw new IllegalStateException(s"arrowstate: contract.json declares no setting $key"))

  /** Everything above, as the Python side sees it, for the drift test. */
  def describe: String = JsonMethods.compact(JsonMethods.render(
    JObject(
      "protocolVersion" -> JInt(ProtocolVersion),
      "frames" -> JObject(Frames.values.toList.sortBy(_.tag).map(f => f.name -> JInt(f.tag))),
      "payloads" -> JArray(Payloads.keys.toList.sorted.map(JString(_))),
      "deltaSuffix" -> JString(DeltaSuffix),
      "snapshotSuffix" -> JString(SnapshotSuffix),
      "families" -> JArray(Families.keys.toList.sorted.map(JString(_))),
      "metrics" -> JArray(Metrics.map(m => JString(m.name)).toList),
      "settings" -> JArray(Settings.keys.toList.sorted.map(JString(_))))))
}

/** A custom metric declared in the contract, under its SQL metric name and label (Spark's, for
 * a figure Spark's Python operators show). */
case class ContractMetric(metric: Contract.Metric) extends StatefulOperatorCustomMetric {
  override def name: String = metric.sqlName
  override def desc: String = metric.sparkMetric.map { spark =>
    (PythonSQLMetrics.pythonSizeMetricsDesc ++ PythonSQLMetrics.pythonTimingMetricsDesc)
      .getOrElse(spark, throw new IllegalStateException(
        s"arrowstate: contract.json's metric ${metric.name} names sparkMetric $spark, which " +
          "is not among Spark's Python metrics"))
  }.getOrElse(metric.description)
  override def createSQLMetric(sc: SparkContext): SQLMetric = metric.kind match {
    case "timing" => SQLMetrics.createTimingMetric(sc, desc)
    case "size" => SQLMetrics.createSizeMetric(sc, desc)
    case _ => SQLMetrics.createMetric(sc, desc)
  }
}
