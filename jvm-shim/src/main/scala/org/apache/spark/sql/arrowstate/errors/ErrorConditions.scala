package org.apache.spark.sql.arrowstate.errors

import java.nio.charset.StandardCharsets.UTF_8

import org.json4s._
import org.json4s.jackson.JsonMethods

/**
 * arrowstate's own error conditions and their SQLSTATEs (Spark's own are in its registry),
 * as contract.json's `errors` declares them: read at the bottom layer, as Spark reads its
 * error-conditions.json, so that the exceptions need nothing above them (the contract's
 * readers throw them).
 */
private[arrowstate] object ErrorConditions {
  private implicit val formats: Formats = DefaultFormats

  val SqlStates: Map[String, String] = (ContractFile.json \ "errors") match {
    case JObject(fields) => fields.collect {
      case (name, o: JObject) if !name.startsWith("_") => name -> (o \ "sqlState").extract[String]
    }.toMap
    case _ => throw new IllegalStateException("arrowstate: contract.json declares no errors")
  }
}

/** `arrowstate/contract.json` as the jar carries it (the build copies it in), parsed once:
 * its errors are read here, the rest by contract.Contract. */
private[arrowstate] object ContractFile {
  lazy val json: JValue = {
    val in = getClass.getResourceAsStream("/arrowstate/contract.json")
    require(in != null, "arrowstate: contract.json is missing from the shim jar; rebuild it " +
      "with `python -m arrowstate build`")
    try JsonMethods.parse(new String(in.readAllBytes(), UTF_8)) finally in.close()
  }
}
