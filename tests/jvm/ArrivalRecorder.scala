package org.apache.spark.sql.arrowstate.testing

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Paths, StandardOpenOption}

import org.apache.spark.sql.{ForeachWriter, Row}

/**
 * A foreach sink for the real-time tests (tests/helpers/real_time.py): each output row, as
 * the task hands it over, appended to `path` as a JSON line of its fields and `at`, the
 * epoch seconds it arrived. In the JVM, as Spark's own real-time tests' sinks: PySpark's
 * foreach sink streams rows to its Python worker through a buffered pipe that is flushed
 * when the task ends, so in real-time mode a Python sink sees a batch's rows at its end
 * (measured: Spark's own deduplication too, every row the batch's length late).
 */
class ArrivalRecorder(path: String) extends ForeachWriter[Row] {
  override def open(partitionId: Long, epochId: Long): Boolean = true

  override def process(row: Row): Unit = {
    val at = System.currentTimeMillis() / 1000.0
    val line = row.json.stripSuffix("}") + (if (row.length > 0) "," else "") +
      s""""at":$at}""" + "\n"
    ArrivalRecorder.synchronized {   // the tasks of a local session share the file
      Files.write(Paths.get(path), line.getBytes(UTF_8), StandardOpenOption.CREATE,
        StandardOpenOption.APPEND)
    }
  }

  override def close(errorOrNull: Throwable): Unit = ()
}

object ArrivalRecorder
