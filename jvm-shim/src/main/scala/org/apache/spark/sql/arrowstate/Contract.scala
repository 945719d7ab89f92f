package org.apache.spark.sql.arrowstate

import java.nio.charset.StandardCharsets.UTF_8

import org.json4s._
import org.json4s.jackson.JsonMethods

import org.apache.spark.SparkContext
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorCustomMetric
import org.apache.spark.sql.internal.SQLConf

/**
 * The JVM <-> Python contract, loaded from `arrowstate/contract.json` in the jar: the same
 * file the Python package loads (the build copies it in). A name missing from it fails when
 * this object initialises, so the two halves cannot drift apart silently.
 */
object Contract {
  private implicit val formats: Formats = DefaultFormats

  private val spec: JValue = {
    val in = getClass.getResourceAsStream("/arrowstate/contract.json")
    require(in != null, "arrowstate: contract.json is missing from the shim jar; rebuild it " +
      "with `python -m arrowstate build`")
    try JsonMethods.parse(new String(in.readAllBytes(), UTF_8)) finally in.close()
  }

  val ProtocolVersion: Int = (spec \ "protocolVersion").extract[Int]

  private val frames: Map[String, Int] = (spec \ "frames").extract[Map[String, Int]]
  private def frame(name: String): Int =
    frames.getOrElse(name, throw new IllegalStateException(s"arrowstate: no frame $name"))

  object Frame {
    val Error: Int = frame("ERROR")
    val Ready: Int = frame("READY")
    val ListFiles: Int = frame("LIST_FILES")
    val Data: Int = frame("DATA")
    val NoData: Int = frame("NO_DATA")
    val End: Int = frame("END")
    val Committed: Int = frame("COMMITTED")
    val Lookup: Int = frame("LOOKUP")
    val ReadFile: Int = frame("READ_FILE")
    val Commit: Int = frame("COMMIT")
    val FileTail: Int = frame("FILE_TAIL")
    val Drop: Int = frame("DROP")
    val ReadState: Int = frame("READ_STATE")
    val ImportState: Int = frame("IMPORT_STATE")
    val InitialState: Int = frame("INITIAL_STATE")
  }

  val HeaderFields: Set[String] = (spec \ "header").extract[Map[String, String]].keySet

  /** arrowstate's own error conditions -> their SQLSTATE (Spark's own are in its registry). */
  val ErrorSqlStates: Map[String, String] = (spec \ "errors") match {
    case JObject(fields) => fields.collect {
      case (name, o: JObject) if !name.startsWith("_") => name -> (o \ "sqlState").extract[String]
    }.toMap
    case _ => throw new IllegalStateException("arrowstate: contract.json declares no errors")
  }

  /** Header `conf` field name -> the Spark setting it carries. */
  val StoreConf: Map[String, String] = (spec \ "storeConf").extract[Map[String, String]]

  private val files = (spec \ "files").extract[Map[String, String]]
  val DeltaSuffix: String = files("deltaSuffix")
  val SnapshotSuffix: String = files("snapshotSuffix")

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

  case class Metric(
      name: String, owner: String, reportedBy: String, kind: String, unit: String,
      description: String, families: Option[List[String]]) {
    def appliesTo(family: String): Boolean = families.forall(_.contains(family))
    /** Not among StateStoreWriter's own metrics: the operator declares it itself. */
    def custom: Boolean = owner == "arrowstate" || families.isDefined
  }
  val Metrics: Seq[Metric] = (spec \ "metrics").extract[List[Metric]]
  val MetricsByName: Map[String, Metric] = Metrics.map(m => m.name -> m).toMap

  /** The custom metrics an operator of `family` declares to Spark. */
  def customMetrics(family: String): Seq[StatefulOperatorCustomMetric] =
    Metrics.filter(m => m.custom && m.appliesTo(family)).map(ContractMetric)

  /** The metric names the worker may report for operators of `family` (checked per task). */
  private val pythonMetricsByFamily: Map[String, Set[String]] = Families.keys.map { family =>
    family -> Metrics.filter(m => Set("python", "both")(m.reportedBy) && m.appliesTo(family))
      .map(_.name).toSet
  }.toMap
  def pythonMetrics(family: String): Set[String] =
    pythonMetricsByFamily.getOrElse(family, Set.empty)

  case class Setting(key: String, default: String, scope: String, doc: String)
  val Settings: Map[String, Setting] =
    (spec \ "settings").extract[List[Setting]].map(s => s.key -> s).toMap
  def setting(key: String): Setting = Settings.getOrElse(key,
    throw new IllegalStateException(s"arrowstate: contract.json declares no setting $key"))

  /** Everything above, as the Python side sees it, for the drift test. */
  def describe: String = JsonMethods.compact(JsonMethods.render(
    JObject(
      "protocolVersion" -> JInt(ProtocolVersion),
      "frames" -> JObject(List(
        "ERROR" -> Frame.Error, "READY" -> Frame.Ready, "LIST_FILES" -> Frame.ListFiles,
        "DATA" -> Frame.Data, "NO_DATA" -> Frame.NoData, "END" -> Frame.End,
        "COMMITTED" -> Frame.Committed, "LOOKUP" -> Frame.Lookup,
        "READ_FILE" -> Frame.ReadFile, "COMMIT" -> Frame.Commit,
        "FILE_TAIL" -> Frame.FileTail, "DROP" -> Frame.Drop,
        "READ_STATE" -> Frame.ReadState, "IMPORT_STATE" -> Frame.ImportState,
        "INITIAL_STATE" -> Frame.InitialState).map { case (k, v) =>
          k -> JInt(v) }),
      "deltaSuffix" -> JString(DeltaSuffix),
      "snapshotSuffix" -> JString(SnapshotSuffix),
      "families" -> JArray(Families.keys.toList.sorted.map(JString(_))),
      "metrics" -> JArray(Metrics.map(m => JString(m.name)).toList),
      "settings" -> JArray(Settings.keys.toList.sorted.map(JString(_))))))
}

/** A custom metric declared in the contract. */
case class ContractMetric(metric: Contract.Metric) extends StatefulOperatorCustomMetric {
  override def name: String = metric.name
  override def desc: String = metric.description
  override def createSQLMetric(sc: SparkContext): SQLMetric = metric.kind match {
    case "timing" => SQLMetrics.createTimingMetric(sc, desc)
    case "size" => SQLMetrics.createSizeMetric(sc, desc)
    case _ => SQLMetrics.createMetric(sc, desc)
  }
}

/** The `spark.arrowstate.*` settings, with the defaults the contract declares. */
object ArrowStateConf {
  val Enabled = "spark.arrowstate.enabled"
  val FallbackStrict = "spark.arrowstate.fallback.strict"
  val AffinityWaitMs = "spark.arrowstate.worker.affinityWaitMs"
  val IdleTimeoutSeconds = "spark.arrowstate.worker.idleTimeoutSeconds"

  def get(conf: SQLConf, key: String): String =
    conf.getConfString(key, Contract.setting(key).default).trim

  def flag(conf: SQLConf, key: String): Boolean =
    get(conf, key).toLowerCase(java.util.Locale.ROOT) == "true"

  def long(conf: SQLConf, key: String): Long = {
    val v = get(conf, key)
    v.toLongOption.getOrElse(throw new IllegalArgumentException(
      s"arrowstate: setting $key must be a whole number, not '$v'"))
  }
}
