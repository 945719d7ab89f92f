// For people with sbt. There is one way to build the shim jar: `sbt package` runs
// `python -m arrowstate build` (the pyspark wheel's Scala compiler, against the Spark jars
// pyspark runs with, contract.json packed in), so both give the same jar. sbt's own
// compile of the same sources is for IDEs and quick checks. The version comes from
// python/arrowstate/_version.py, its one definition.
import scala.sys.process._

ThisBuild / scalaVersion := "2.13.18"

lazy val packageVersion: String = {
  val source = IO.read(file("python/arrowstate/_version.py"))
  "__version__ = \"([^\"]+)\"".r.findFirstMatchIn(source).map(_.group(1))
    .getOrElse(sys.error("no __version__ in python/arrowstate/_version.py"))
}

lazy val root = (project in file("."))
  .settings(
    name := "arrowstate-shim",
    version := packageVersion,
    Compile / scalaSource := baseDirectory.value / "jvm-shim" / "src" / "main" / "scala",
    libraryDependencies += "org.apache.spark" %% "spark-sql" % "4.3.0" % "provided",
    scalacOptions ++= Seq("-release", "17", "-deprecation"),
    Compile / packageBin := {
      val jar = Seq("python", "-m", "arrowstate", "build").!!.trim.linesIterator.toSeq.last
      file(jar)
    }
  )
