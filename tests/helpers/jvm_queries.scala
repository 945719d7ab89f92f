// Stateful queries in one spark-shell with arrowstate on, run by test_fallback.py: a JVM
// state function and real-time mode's aggregation stay Spark's, run, and show their reasons;
// real-time deduplication runs on arrowstate.
import org.apache.spark.sql.execution.streaming.sources.LowLatencyMemoryStream
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode, Trigger}
import spark.implicits._

// 1. Scala's flatMapGroupsWithState: a JVM state function.
val counts = spark.readStream.schema("id long").parquet(sys.env("ARROWSTATE_TEST_SOURCE"))
  .as[Long].groupByKey(identity)
  .flatMapGroupsWithState(OutputMode.Update, GroupStateTimeout.NoTimeout) {
    (key: Long, rows: Iterator[Long], state: GroupState[Long]) =>
      val n = state.getOption.getOrElse(0L) + rows.size
      state.update(n)
      Iterator((key, n))
  }
val query = counts.writeStream.format("memory").queryName("counts").outputMode("update")
  .option("checkpointLocation", sys.env("ARROWSTATE_TEST_CHECKPOINT") + "/jvm").start()
query.processAllAvailable()
query.explain()
println(s"ROWS ${spark.table("counts").count()}")
query.stop()

// 2. Deduplication in real-time mode (Trigger.RealTime), from a low-latency memory source:
// arrowstate's, which Spark's real-time allowlist passes (RealTimeAllowlist).
implicit val sqlContext: org.apache.spark.sql.SQLContext = spark.sqlContext
val source = LowLatencyMemoryStream[Int](2)
val realTime = source.toDF().dropDuplicates().writeStream.format("console")
  .outputMode("update").trigger(Trigger.RealTime("5 seconds"))
  .option("checkpointLocation", sys.env("ARROWSTATE_TEST_CHECKPOINT") + "/realtime").start()
source.addData(Seq(1, 2, 3, 1))
// until two real-time batches (5 s each) have reported, the first with the rows: what a
// fixed 12 s sleep gave on an idle machine, and not too little on a busy one
val realTimeDeadline = System.currentTimeMillis() + 120000
while (realTime.exception.isEmpty && realTime.recentProgress.length < 2 &&
       System.currentTimeMillis() < realTimeDeadline) Thread.sleep(200)
realTime.explain()
println(s"REALTIME EXCEPTION ${realTime.exception}")
println(s"REALTIME ROWS ${realTime.recentProgress.map(_.numInputRows).sum}")
realTime.stop()

// 3. An aggregation in real-time mode: Spark's streamline operator, which stays Spark's.
val counts2 = LowLatencyMemoryStream[Int](2)
val realTimeCount = counts2.toDF().groupBy("value").count().writeStream.format("console")
  .outputMode("update").trigger(Trigger.RealTime("5 seconds"))
  .option("checkpointLocation", sys.env("ARROWSTATE_TEST_CHECKPOINT") + "/realtime-count").start()
counts2.addData(Seq(1, 2, 1))
val countDeadline = System.currentTimeMillis() + 120000
while (realTimeCount.exception.isEmpty && realTimeCount.recentProgress.isEmpty &&
       System.currentTimeMillis() < countDeadline) Thread.sleep(200)
realTimeCount.explain(true)
println(s"REALTIME COUNT EXCEPTION ${realTimeCount.exception}")
realTimeCount.stop()
System.exit(0)
