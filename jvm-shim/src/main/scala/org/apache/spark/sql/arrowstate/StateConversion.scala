package org.apache.spark.sql.arrowstate

import java.io.DataOutputStream

import org.apache.hadoop.fs.Path

import org.apache.spark.SparkEnv
import org.apache.spark.io.CompressionCodec
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.state.{StateStoreConf, StateStoreId}
import org.apache.spark.sql.types.{DataType, StructType}
import org.apache.spark.util.SerializableConfiguration

/**
 * Converts arrowstate state to Spark's HDFS-backed state store format (`python -m
 * arrowstate state export`): per partition, the rows of the newest committed version, read
 * through a Python state worker (verified as a task's load), are written as that version's
 * `<v>.snapshot`, in the format HDFSBackedStateStoreProvider writes and loads (its
 * compression codec; per row the key's and the value's UnsafeRow bytes, each after its
 * length; -1 at the end). The file is written atomically; arrowstate's own files are left
 * for the caller to move away once every partition is written.
 */
object StateConversion {
  /** Writes `<version>.snapshot` for each partition of one operator; the rows per partition. */
  def exportOperator(
      session: SparkSession,
      stateRoot: String,
      operatorId: Long,
      partitions: Int,
      version: Long,
      keySchemaJson: String,
      valueSchemaJson: String): Array[Long] = {
    val keySchema = DataType.fromJson(keySchemaJson).asInstanceOf[StructType]
    val valueSchema = DataType.fromJson(valueSchemaJson).asInstanceOf[StructType]
    val storeConf = new StateStoreConf(session.sessionState.conf)
    val hadoopConf = session.sparkContext.broadcast(
      new SerializableConfiguration(session.sessionState.newHadoopConf()))
    val settings = ArrowStateStoreProvider.workerSettings(storeConf)
    session.sparkContext.parallelize(0 until partitions, partitions).map { partition =>
      val conf = hadoopConf.value.value
      val dir = StateFiles.partitionDir(stateRoot, operatorId, partition)
      val files = new StateFiles(dir, conf)
      if (!files.holdsArrowState) 0L else {
        val id = StateStoreId(stateRoot, operatorId, partition)
        val rows = new ArrowStateReadStore(id, version, keySchema, valueSchema, files,
          settings).iterator()
        val fm = CheckpointFileManager.create(dir, conf)
        val raw = fm.createAtomic(new Path(dir, s"$version.snapshot"), true)
        var count = 0L
        try {
          val out = new DataOutputStream(CompressionCodec.createCodec(SparkEnv.get.conf,
            storeConf.compressionCodec).compressedOutputStream(raw))
          rows.foreach { pair =>
            val key = pair.key.getBytes
            val value = pair.value.getBytes
            out.writeInt(key.length)
            out.write(key)
            out.writeInt(value.length)
            out.write(value)
            count += 1
          }
          out.writeInt(-1)
          out.close()
        } catch {
          case e: Throwable =>
            raw.cancel()
            throw e
        } finally rows.close()
        count
      }
    }.collect()
  }
}
