package org.apache.spark.sql.arrowstate.tools

import java.time.Duration
import java.util.UUID

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration

import org.apache.spark.Partitioner
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.catalyst.encoders.{ExpressionEncoder, RowEncoder}
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.statefulprocessor.ImplicitGroupingKeyTracker
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.statevariables.{ListStateImpl, MapStateImpl, ValueStateImpl}
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.timers.TimerStateImpl
import org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate.ttl.{ListStateImplWithTTL, MapStateImplWithTTL, ValueStateImplWithTTL}
import org.apache.spark.sql.execution.streaming.state.{NoPrefixKeyStateEncoderSpec, StateStore, StateStoreConf, StateStoreId, StateStoreProvider, StateStoreProviderId}
import org.apache.spark.sql.streaming.{ListState, MapState, TimeMode, TTLConfig, ValueState}
import org.apache.spark.sql.types.{BinaryType, StructType}
import org.apache.spark.util.SerializableConfiguration
import org.apache.spark.SparkException

/**
 * `python -m arrowstate state export` of transformWithState state: Spark keeps it in
 * RocksDB column families (one per state variable, and internal ones for TTL indexes, list
 * sizes and the two timer indexes), laid out by its state variable implementations. So
 * those write it here: per partition, a fresh RocksDB store committed as `version`, in
 * which Spark's own ValueState/ListState/MapState (with TTL where declared) and timer
 * implementations put each grouping key's values as its operator would. The rows come
 * from Spark's `statestore` reader over the arrowstate checkpoint, one DataFrame per
 * variable (flattened: one row per list element, per map entry, per timer).
 */
object TransformWithStateExport {
  private val Timers = "Timers"
  // a TTL'd value's expiry is the implementation's clock plus the TTL: with a 1 ms TTL the
  // clock is set to each value's own expiry less 1 ms, so the stored expiry is the value's
  private val OneMs = TTLConfig(Duration.ofMillis(1))

  /** One state variable (or the timers): its kind, TTL and the schemas the reader gives. */
  private case class Variable(name: String, kind: String, ttl: Boolean, keySchema: StructType,
      userKeySchema: StructType, valueSchema: StructType)

  /** The rows per partition. `kinds`: ValueState, ListState, MapState or Timers;
   * `timeMode`: the operator's (NoTime, ProcessingTime, EventTime). */
  def exportOperator(
      session: SparkSession,
      stateRoot: String,
      operatorId: Long,
      partitions: Int,
      version: Long,
      names: java.util.List[String],
      kinds: java.util.List[String],
      ttls: java.util.List[java.lang.Boolean],
      frames: java.util.List[DataFrame],
      timeMode: String): Array[Long] = {
    val dfs = frames.asScala.toIndexedSeq
    val variables = dfs.indices.map { i =>
      val schema = dfs(i).schema
      def struct(name: String) = schema(name).dataType.asInstanceOf[StructType]
      val element = kinds.get(i) match {
        case "ValueState" => "value"
        case "ListState" => "list_element"
        case "MapState" => "user_map_value"
        case _ => null
      }
      val ttl = ttls.get(i).booleanValue
      val value = Option(element).map { e =>
        if (ttl) struct(e)("value").dataType.asInstanceOf[StructType] else struct(e)
      }.orNull
      Variable(names.get(i), kinds.get(i), ttl, struct("key"),
        if (kinds.get(i) == "MapState") struct("user_map_key") else null, value)
    }
    // each variable's rows, tagged with it, to the task of the partition they were read from
    val tagged = dfs.indices.map { i =>
      val partitionColumn = dfs(i).schema.fieldIndex("partition_id")
      dfs(i).rdd.map(row => (row.getInt(partitionColumn), (i, row)))
    }
    val storeConf = new StateStoreConf(session.sessionState.conf)
    val hadoopConf = session.sparkContext.broadcast(
      new SerializableConfiguration(session.sessionState.newHadoopConf()))
    val all = if (tagged.isEmpty) session.sparkContext.emptyRDD[(Int, (Int, Row))]
      else session.sparkContext.union(tagged)
    all.partitionBy(new PartitionIdPartitioner(partitions))
      .mapPartitionsWithIndex { (partition, rows) =>
        Iterator(writePartition(StateStoreId(stateRoot, operatorId, partition), version,
          variables, timeMode, rows.map(_._2), storeConf, hadoopConf.value.value))
      }.collect()
  }

  private class PartitionIdPartitioner(override val numPartitions: Int) extends Partitioner {
    override def getPartition(key: Any): Int = key.asInstanceOf[Int]
  }

  private def encoder(schema: StructType): ExpressionEncoder[Any] =
    // lenient: timestamps come as java.sql.Timestamp or Instant, as the session reads them
    ExpressionEncoder(RowEncoder.encoderFor(schema, lenient = true))
      .resolveAndBind().asInstanceOf[ExpressionEncoder[Any]]

  private def writePartition(
      id: StateStoreId,
      version: Long,
      variables: IndexedSeq[Variable],
      timeMode: String,
      rows: Iterator[(Int, Row)],
      storeConf: StateStoreConf,
      conf: Configuration): Long = {
    val keySchema = new StructType().add("key", BinaryType)
    val provider = StateStoreProvider.createAndInit(StateStoreProviderId(id, UUID.randomUUID()),
      keySchema, new StructType().add("value", BinaryType), NoPrefixKeyStateEncoderSpec(keySchema),
      true, storeConf, conf, true, None)
    StateConversion.writeFreshVersion(provider, version) { store =>
      var clock = 0L
      val writers = variables.map(v => writer(store, v, timeMode, () => clock))
      var count = 0L
      rows.foreach { case (i, row) =>
        ImplicitGroupingKeyTracker.setImplicitKey(row.getStruct(row.fieldIndex("key")))
        try writers(i)(row, expiry => clock = expiry - 1)
        finally ImplicitGroupingKeyTracker.removeImplicitKey()
        count += 1
      }
      count
    }
  }

  /** Puts one reader row of `v` through Spark's implementation of it; with a TTL the value's
   * expiry is first handed to `setExpiry`. */
  private def writer(store: StateStore, v: Variable, timeMode: String, clock: () => Long)
    : (Row, Long => Unit) => Unit = {
    val key = encoder(v.keySchema)
    lazy val value = encoder(v.valueSchema)
    def payload(row: Row, column: String, setExpiry: Long => Unit): Row = {
      val stored = row.getStruct(row.fieldIndex(column))
      if (!v.ttl) stored else {
        setExpiry(stored.getLong(1))
        stored.getStruct(0)
      }
    }
    (v.kind, v.ttl) match {
      case ("ValueState", ttl) =>
        val state: ValueState[Any] =
          if (ttl) new ValueStateImplWithTTL[Any](store, v.name, key, value, OneMs, clock, None,
            Map.empty)
          else new ValueStateImpl[Any](store, v.name, key, value, Map.empty)
        (row, set) => state.update(payload(row, "value", set))
      case ("ListState", ttl) =>
        val state: ListState[Any] =
          if (ttl) new ListStateImplWithTTL[Any](store, v.name, key, value, OneMs, clock, None,
            Map.empty)
          else new ListStateImpl[Any](store, v.name, key, value, Map.empty)
        (row, set) => state.appendValue(payload(row, "list_element", set))
      case ("MapState", ttl) =>
        val userKey = encoder(v.userKeySchema)
        val state: MapState[Any, Any] =
          if (ttl) new MapStateImplWithTTL[Any, Any](store, v.name, key, userKey, value, OneMs,
            clock, None, Map.empty)
          else new MapStateImpl[Any, Any](store, v.name, key, userKey, value, Map.empty)
        (row, set) => {
          val entry = payload(row, "user_map_value", set)
          state.updateValue(row.getStruct(row.fieldIndex("user_map_key")), entry)
        }
      case (Timers, _) =>
        val mode = if (timeMode == "EventTime") TimeMode.EventTime() else TimeMode.ProcessingTime()
        val timers = new TimerStateImpl(store, mode, key)
        (row, _) => timers.registerTimer(row.getLong(row.fieldIndex("expiration_timestamp_ms")))
      case (kind, _) =>
        throw SparkException.internalError(
          s"arrowstate: state variable ${v.name} is a $kind, which export does not write")
    }
  }
}
