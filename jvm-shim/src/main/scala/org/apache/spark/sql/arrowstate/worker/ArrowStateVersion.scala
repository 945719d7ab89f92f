package org.apache.spark.sql.arrowstate.worker

/** The shim's package version (the jar's arrowstate.properties): a worker's handshake (HELLO)
 * must name the same one. */
object ArrowStateVersion {
  lazy val version: String = {
    val props = new java.util.Properties()
    val in = getClass.getResourceAsStream("/arrowstate.properties")
    if (in != null) try props.load(in) finally in.close()
    props.getProperty("version", "unknown")
  }
}
