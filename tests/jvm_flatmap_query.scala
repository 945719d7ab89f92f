// Scala's flatMapGroupsWithState (a JVM state function), run by test_flatmap.py in
// spark-shell with arrowstate on: the operator must stay Spark's, with the reason shown.
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode}
import spark.implicits._

val counts = spark.readStream.schema("id long").parquet(sys.env("ARROWSTATE_TEST_SOURCE"))
  .as[Long].groupByKey(identity)
  .flatMapGroupsWithState(OutputMode.Update, GroupStateTimeout.NoTimeout) {
    (key: Long, rows: Iterator[Long], state: GroupState[Long]) =>
      val n = state.getOption.getOrElse(0L) + rows.size
      state.update(n)
      Iterator((key, n))
  }
val query = counts.writeStream.format("memory").queryName("counts").outputMode("update")
  .option("checkpointLocation", sys.env("ARROWSTATE_TEST_CHECKPOINT")).start()
query.processAllAvailable()
query.explain()
println(s"ROWS ${spark.table("counts").count()}")
query.stop()
System.exit(0)
