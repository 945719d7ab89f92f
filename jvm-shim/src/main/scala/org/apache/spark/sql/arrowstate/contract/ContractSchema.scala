package org.apache.spark.sql.arrowstate.contract

import org.json4s._

import org.apache.spark.sql.arrowstate.errors.ArrowStateException

/**
 * Checks a JSON payload against its schema in contract.json (`payloads`), naming the field
 * that does not match. The JVM has no JSON Schema library on Spark's class path (and users
 * install with pip alone), so this checks the subset the contract uses: `type`, `properties`,
 * `required`, `additionalProperties`, `items`, `enum`, and `x-payload` (a field checked
 * against a payload of its own, `{field}` filled from its siblings). Python checks the same
 * schemas with fastjsonschema; its tests keep the contract within this subset.
 */
object ContractSchema {
  def check(payload: String, value: JValue): Unit = checkAt(payload, value, "")

  private def checkAt(payload: String, value: JValue, at: String): Unit = {
    val schema = Contract.Payloads.getOrElse(payload, throw ArrowStateException.contract(
      payload, at, "contract.json declares no such payload"))
    checkValue(payload, schema, value, at)
  }

  private def field(at: String, name: String): String = if (at.isEmpty) name else s"$at.$name"

  private def isType(value: JValue, t: String): Boolean = (t, value) match {
    case ("object", _: JObject) | ("array", _: JArray) | ("string", _: JString) => true
    case ("integer", _: JInt | _: JLong) => true
    case ("number", _: JInt | _: JLong | _: JDouble | _: JDecimal) => true
    case ("boolean", _: JBool) | ("null", JNull) => true
    case _ => false
  }

  private def checkValue(payload: String, schema: JValue, value: JValue, at: String): Unit = {
    def fail(where: String, reason: String) =
      throw ArrowStateException.contract(payload, where, reason)
    val types = schema \ "type" match {
      case JString(t) => Seq(t)
      case JArray(ts) => ts.collect { case JString(t) => t }
      case _ => Nil
    }
    if (types.nonEmpty && !types.exists(isType(value, _))) {
      fail(at, s"must be ${types.mkString(" or ")}, not ${value.getClass.getSimpleName}")
    }
    schema \ "enum" match {
      case JArray(options) if !options.contains(value) =>
        fail(at, s"must be one of ${options.map(JsonText.compact).mkString(", ")}")
      case _ =>
    }
    value match {
      case JObject(fields) =>
        // json4s keeps a None as a JNothing field, which rendering leaves out: absent
        val present = fields.filter(_._2 != JNothing)
        val properties = schema \ "properties" match {
          case JObject(ps) => ps.toMap
          case _ => Map.empty[String, JValue]
        }
        schema \ "required" match {
          case JArray(names) => names.collect { case JString(n) => n }
            .find(n => !present.exists(_._1 == n))
            .foreach(n => fail(field(at, n), "is required"))
          case _ =>
        }
        present.foreach { case (name, v) =>
          properties.get(name) match {
            case Some(s) => checkValue(payload, s, v, field(at, name))
            case None => schema \ "additionalProperties" match {
              case JBool(false) => fail(field(at, name), "is not declared")
              case s: JObject => checkValue(payload, s, v, field(at, name))
              case _ =>
            }
          }
        }
        properties.foreach { case (name, s) =>
          (s \ "x-payload", present.find(_._1 == name).map(_._2)) match {
            case (JString(template), Some(nested: JObject)) =>
              val named = "\\{(\\w+)\\}".r.replaceAllIn(template, { m =>
                val sibling = m.group(1)
                present.collectFirst { case (`sibling`, JString(v)) => v }.getOrElse("")
              })
              checkAt(named, nested, field(at, name))
            case _ =>
          }
        }
      case JArray(items) => schema \ "items" match {
        case s: JObject => items.zipWithIndex.foreach { case (v, i) =>
          checkValue(payload, s, v, field(at, i.toString))
        }
        case _ =>
      }
      case _ =>
    }
  }
}

object JsonText {
  def compact(value: JValue): String =
    org.json4s.jackson.JsonMethods.compact(org.json4s.jackson.JsonMethods.render(value))
}

/** A `sharedJson:<payload>` value: checked against the payload and rendered once, where it
 * is made (on the driver), then sent as these bytes by every task that ships it. */
final class CheckedJson(val payload: String, value: JValue) extends Serializable {
  ContractSchema.check(payload, value)
  val bytes: Array[Byte] =
    JsonText.compact(value).getBytes(java.nio.charset.StandardCharsets.UTF_8)
}
