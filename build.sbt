// Builds the same shim jar as `python -m arrowstate build`, for people with sbt.
// Spark is "provided": the jar runs inside the Spark that pyspark ships.
ThisBuild / scalaVersion := "2.13.18"

lazy val root = (project in file("."))
  .settings(
    name := "arrowstate-shim",
    version := "0.1.0", // keep equal to python/arrowstate/_version.py
    Compile / scalaSource := baseDirectory.value / "jvm-shim" / "src" / "main" / "scala",
    libraryDependencies += "org.apache.spark" %% "spark-sql" % "4.3.0" % "provided",
    scalacOptions ++= Seq("-release", "17", "-deprecation"),
    // The Python side checks this file to refuse a jar of another version.
    Compile / resourceGenerators += Def.task {
      val props = (Compile / resourceManaged).value / "arrowstate.properties"
      IO.write(props, s"version=${version.value}\n")
      Seq(props)
    }.taskValue,
    Compile / packageBin / artifactPath :=
      target.value / s"arrowstate-shim_2.13-${version.value}.jar"
  )
