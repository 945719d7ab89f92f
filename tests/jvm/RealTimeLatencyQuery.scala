package org.apache.spark.sql.arrowstate.bench

import org.apache.spark.sql.{Encoders, SparkSession}
import org.apache.spark.sql.functions.{col, get_json_object, struct, to_json}
import org.apache.spark.sql.streaming.{OutputMode, StatefulProcessor, StreamingQuery, TimeMode, TimerValues, Trigger, TTLConfig, ValueState}

/** One input record of the real-time latency benchmark: its key and sequence number. */
case class LatencyEvent(key: String, seq: Long)

/** What the processor emits per input record: the key's count so far, and the record's
 * sequence number (the consumer measures latency from the record's scheduled send time). */
case class LatencyCount(key: String, seq: Long, count: Long)

/** The SPARK-58884 workload as a Scala processor: a ValueState read and update per row, one
 * output row per input row. Spark's JVM transformWithState runs it in real-time mode: the
 * benchmark's baseline (scripts/bench.py --real-time). */
class CountPerKeyProcessor extends StatefulProcessor[String, LatencyEvent, LatencyCount] {
  @transient private var count: ValueState[Long] = _

  override def init(outputMode: OutputMode, timeMode: TimeMode): Unit = {
    count = getHandle.getValueState[Long]("count", Encoders.scalaLong, TTLConfig.NONE)
  }

  override def handleInputRows(key: String, rows: Iterator[LatencyEvent],
      timerValues: TimerValues): Iterator[LatencyCount] = {
    rows.map { e =>
      val n = (if (count.exists()) count.get() else 0L) + 1
      count.update(n)
      LatencyCount(key, e.seq, n)
    }.toList.iterator
  }
}

/** The benchmark's query with the JVM processor, Kafka to Kafka: records whose key is the
 * state key and whose value is JSON with `seq`, out as JSON with it, the key and the count.
 * Python starts it through py4j. */
object RealTimeLatencyQuery {
  def start(spark: SparkSession, bootstrap: String, inTopic: String, outTopic: String,
      checkpoint: String, realTime: String): StreamingQuery = {
    import spark.implicits._
    val events = spark.readStream.format("kafka")
      .option("kafka.bootstrap.servers", bootstrap).option("subscribe", inTopic)
      .option("startingOffsets", "latest").load()
      .select(col("key").cast("string").as("key"),
        get_json_object(col("value").cast("string"), "$.seq").cast("long").as("seq"))
      .as[LatencyEvent]
    val counted = events.groupByKey(_.key)
      .transformWithState(new CountPerKeyProcessor, TimeMode.None(), OutputMode.Update())
    val writer = counted
      .select(col("key"), to_json(struct(col("key"), col("seq"), col("count"))).as("value"))
      .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
      .option("topic", outTopic).option("checkpointLocation", checkpoint).outputMode("update")
    (if (realTime.nonEmpty) writer.trigger(Trigger.RealTime(realTime)) else writer).start()
  }
}
