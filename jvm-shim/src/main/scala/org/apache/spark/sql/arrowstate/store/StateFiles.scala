package org.apache.spark.sql.arrowstate.store

import java.io.{FileNotFoundException, FilterInputStream, IOException, InputStream,
  InterruptedIOException, OutputStream}
import java.nio.channels.ClosedByInterruptException
import java.nio.file.{Files, StandardCopyOption, Path => LocalPath}
import java.util.UUID

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{CommonPathCapabilities, FileSystem, LocalFileSystem, Path, PathFilter}

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.internal.SQLConf

import org.apache.spark.sql.arrowstate.contract.Contract
import org.apache.spark.sql.arrowstate.errors.ArrowStateException

/**
 * The files of one operator partition's state, under
 * `<checkpoint>/state/<operatorId>/<partitionId>/`. Which files exist, load, are written or
 * pruned is decided by the Python store (its `lifecycle` module); this class only moves
 * bytes through Hadoop's filesystem layer (atomic write then rename), so any checkpoint
 * filesystem works. Unless a checkpoint file manager of the user's (or a test's) is set, a
 * file on Hadoop's local filesystem is written with Java's own calls (`localDir`), and one
 * on an object store in place (`abortableFs`).
 */
class StateFiles(val dir: Path, hadoopConf: Configuration) extends Logging {
  import StateFiles._

  private lazy val fm = FileManagers.forDir(dir, hadoopConf)

  /** The directory's filesystem when writes may go around Spark's checkpoint file manager:
   * no manager of the user's (or a test's) is set. */
  private lazy val ownWritesFs: Option[FileSystem] =
    if (hadoopConf.get(SQLConf.STREAMING_CHECKPOINT_FILE_MANAGER_CLASS.parent.key) != null) None
    else Some(dir.getFileSystem(hadoopConf))

  /**
   * The directory as a local path when writes may skip Hadoop: its filesystem is Hadoop's
   * local one (`ownWritesFs`). Without
   * Hadoop's native library, which pyspark does not ship, that filesystem forks a child
   * process three times per file written (`chmod` for the new file, `readlink` twice for
   * the rename): at 200 shuffle partitions, most of a small micro-batch's time. The same
   * write here is a temporary file renamed into place, as Hadoop's, with no checksum file
   * beside it (arrowstate's files verify themselves).
   */
  private lazy val localDir: Option[LocalPath] =
    ownWritesFs.collect { case local: LocalFileSystem => local.pathToFile(dir).toPath }

  /** Whether any arrowstate file is here (the partition's state is arrowstate's). */
  def holdsArrowState: Boolean = ourNames().nonEmpty

  /** Whether Spark's own state store wrote here (HDFS-backed or RocksDB files). */
  def holdsSparkState: Boolean = newestSparkVersion >= 0

  /** The newest version of Spark's own state files here (-1 for none). */
  def newestSparkVersion: Long = names().collect {
    case SparkStoreFile(version, _*) => version.toLong
  }.maxOption.getOrElse(-1L)

  /** The newest version of arrowstate's files here (-1 for none). */
  def newestArrowStateVersion: Long = ourNames().flatMap(versionOf).maxOption.getOrElse(-1L)

  /** Whether `version` of this partition is Spark's own state, not arrowstate's: no
   * arrowstate file is here, or arrowstate's files stop short of it where Spark's reach it
   * (Spark's offline repartition writes its store's files over an arrowstate checkpoint). */
  def sparkOwns(version: Long): Boolean = {
    val ours = newestArrowStateVersion
    ours < 0 || (ours < version && newestSparkVersion >= version)
  }

  /** The names of the files in the directory (none if it does not exist): the Python store
   * picks its own, and names another engine's when it finds only those. */
  def names(): Seq[String] = onStore("list", dir) {
    if (!fm.exists(dir)) Nil else fm.list(dir).toSeq.filter(_.isFile).map(_.getPath.getName)
  }

  private def ourNames(): Seq[String] =
    if (!fm.exists(dir)) Nil else fm.list(dir, OurFiles).toSeq.map(_.getPath.getName)

  /** A file's content as a stream (the caller closes it): a file of any size is read a
   * piece at a time, never whole. The store's failures, on opening or reading, name it. */
  def open(name: String): InputStream = {
    val path = new Path(dir, name)
    new FilterInputStream(onStore("read", path)(fm.open(path))) {
      override def read(): Int = onStore("read", path)(super.read())
      override def read(b: Array[Byte], off: Int, len: Int): Int =
        onStore("read", path)(super.read(b, off, len))
    }
  }

  /** The last `size` bytes of a file (all of a shorter one); empty if it does not exist.
   * A ranged read: on an object store a whole-file read policy would fetch all of it. */
  def tail(name: String, size: Int): Array[Byte] = onStore("read", new Path(dir, name)) {
    val path = new Path(dir, name)
    val fs = path.getFileSystem(hadoopConf)
    try {
      val length = fs.getFileStatus(path).getLen
      val in = fs.openFile(path)
        .opt("fs.option.openfile.read.policy", "random")
        .opt("fs.option.openfile.length", length.toString)
        .build().get()
      try {
        val start = math.max(0L, length - size)
        val bytes = new Array[Byte]((length - start).toInt)
        in.readFully(start, bytes)
        bytes
      } finally in.close()
    } catch {
      case _: FileNotFoundException => Array.emptyByteArray
    }
  }

  /** Atomic write of `content` read to its end, streamed (a file of any size, never whole
   * in memory): readers see the old file or the whole new one; a write that fails midway
   * leaves nothing. A name that is one attempt's alone (`neverReplaced`) is never written
   * over: a second write of it fails (on an object store, where a check would cost a
   * request per file, its uniqueness rests on the name); another name's last complete
   * write wins (format v1's names, as Spark's HDFS-backed store writes them). */
  def write(name: String, content: InputStream): Unit = {
    // a failure to read `content` (the worker's stream) is not the store's: it is carried
    // past onStore's wrapping and thrown as it was
    val source = new FilterInputStream(content) {
      override def read(): Int = carried(super.read())
      override def read(b: Array[Byte], off: Int, len: Int): Int = carried(super.read(b, off, len))
      private def carried(read: => Int): Int =
        try read catch { case e: IOException => throw SourceFailed(e) }
    }
    try writeWith(name)(source.transferTo(_)) catch { case SourceFailed(e) => throw e }
  }

  /** Atomic write of a local file's content, streamed. */
  def copyLocal(name: String, localPath: String): Unit = {
    val in = new java.io.FileInputStream(localPath)
    try write(name, in) finally in.close()
  }

  /**
   * The directory's filesystem (`ownWritesFs`) when its output streams can be abandoned
   * unseen: an object store, where an
   * object appears whole when its upload completes or never. A write there needs no
   * temporary file and rename, which on S3 are a PUT, a COPY and a DELETE with some twenty
   * HEAD and LIST probes around them: one PUT does (as Spark's
   * AbortableStreamBasedCheckpointFileManager of spark-hadoop-cloud writes). Hadoop's
   * cached instance: no client is made for it.
   */
  private lazy val abortableFs: Option[FileSystem] =
    ownWritesFs.filter(_.hasPathCapability(dir, CommonPathCapabilities.ABORTABLE_STREAM))

  private def writeWith(name: String)(body: OutputStream => Unit): Unit =
    onStore("write", new Path(dir, name)) {
      (localDir, abortableFs) match {
        case (Some(local), _) => writeLocal(local, name)(body)
        case (_, Some(fs)) => writeDirect(fs, name)(body)
        case _ => writeThroughHadoop(name)(body)
      }
    }

  /** The file written in place, visible only once whole: aborted on any failure. */
  private def writeDirect(fs: FileSystem, name: String)(body: OutputStream => Unit): Unit = {
    // no probe for an existing file or a parent directory (an object store has none)
    val out = fs.createFile(new Path(dir, name)).overwrite(true)
      .opt("fs.s3a.create.performance", true).build()
    wholeOrUndone(out, out.abort())(body)
  }

  /** `body` writes to `out`, closed once done (the file appears whole); on any failure
   * `undo` makes sure nothing of it appears. */
  private def wholeOrUndone(out: OutputStream, undo: => Unit)(body: OutputStream => Unit)
    : Unit =
    try {
      body(out)
      out.close()
    } catch {
      case e: Throwable =>
        undo
        throw e
    }

  private def writeLocal(local: LocalPath, name: String)(body: OutputStream => Unit): Unit = {
    Files.createDirectories(local)
    val target = local.resolve(name)
    val temp = local.resolve(s".$name.${UUID.randomUUID()}.tmp")
    try {
      val out = Files.newOutputStream(temp)
      try body(out) finally out.close()
      if (neverReplaced(name)) {
        // a hard link fails if the name exists, atomically; the temporary name then goes.
        // Where links are not supported, a move without replacing (checked, then renamed)
        try Files.createLink(target, temp) catch {
          case _: UnsupportedOperationException | _: java.nio.file.FileSystemException
              if !Files.exists(target) => Files.move(temp, target)
        }
        Files.deleteIfExists(temp)
      } else {
        // a checksum Hadoop wrote beside an earlier file of this name would not match
        Files.deleteIfExists(local.resolve(s".$name.crc"))
        Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE)
      }
    } catch {
      case e: Throwable =>
        Files.deleteIfExists(temp)
        throw e
    }
  }

  private def writeThroughHadoop(name: String)(body: OutputStream => Unit): Unit = {
    val path = new Path(dir, name)
    val overwrite = !neverReplaced(name)
    val out = try fm.createAtomic(path, overwrite) catch {
      case _: FileNotFoundException =>   // the directory's first file, or it was deleted
        fm.mkdirs(dir)
        fm.createAtomic(path, overwrite)
    }
    wholeOrUndone(out, out.cancel())(body)
  }

  /**
   * Retention, from one listing of the directory: once the snapshot file `snapshot` is
   * there, deletes our files of versions below `version` (of any attempt), the run files
   * `gone` (no snapshot kept names them), and the orphan run files: those not in `keep`
   * (what retained versions and snapshots in progress name) and last modified before
   * `snapshot`, the oldest snapshot retention keeps. The orphans' rule is Spark's RocksDB
   * file manager's (an untracked file older than what retained versions need), anchored on
   * that snapshot: a run file written since, by this attempt or a live one elsewhere
   * (another attempt of a later version, a snapshot shipping over commits), is newer and
   * stays. Orphans are a snapshot's run files whose manifest never came (a worker lost, a
   * query stopped while it shipped). A delete that fails is tried again at the next prune,
   * which lists the directory anew. Whether the snapshot was there.
   */
  def prune(version: Long, snapshot: String, gone: Seq[String], keep: Set[String]): Boolean = {
    val statuses = onStore("list", dir) {
      if (!fm.exists(dir)) Nil else fm.list(dir).toSeq.filter(_.isFile)
    }
    statuses.find(_.getPath.getName == snapshot).exists { anchor =>
      val goneSet = gone.toSet
      statuses.map(s => (s.getPath.getName, s.getModificationTime)).foreach {
        case (name, _) if versionOf(name).exists(_ < version) || goneSet(name) =>
          deleteLogged(name)
        case (name, modified) if isRunFile(name) && !keep(name) &&
            modified < anchor.getModificationTime => deleteLogged(name)
        case _ =>
      }
      true
    }
  }

  private def deleteLogged(name: String): Unit =
    try fm.delete(new Path(dir, name)) catch {
      case e: IOException =>
        logWarning(s"arrowstate: could not delete ${new Path(dir, name)} (the next prune " +
          s"tries again): ${e.getMessage}")
    }

}

/**
 * One checkpoint file manager per checkpoint and filesystem settings in this JVM, kept for
 * its life as Spark's state store providers keep theirs. Spark's default manager opens a
 * Hadoop FileContext, and a FileContext on an object store makes a client of its own
 * (connection and thread pools): made per task, that was a new client per partition and
 * micro-batch.
 */
object FileManagers {
  private val MaxKept = 64
  private val kept = new java.util.LinkedHashMap[(String, Int), CheckpointFileManager](
      16, 0.75f, true) {
    override def removeEldestEntry(
        e: java.util.Map.Entry[(String, Int), CheckpointFileManager]): Boolean =
      size() > MaxKept
  }

  /** The manager for a partition directory `<checkpoint>/state/<operator>/<partition>`
   * (or any directory): shared by every directory of the same checkpoint whose filesystem
   * settings are the same. */
  def forDir(dir: Path, hadoopConf: Configuration): CheckpointFileManager = {
    val root = Option(dir.getParent).flatMap(p => Option(p.getParent)).getOrElse(dir)
    val key = (root.toUri.toString, filesystemSettings(hadoopConf))
    kept.synchronized {
      Option(kept.get(key)).getOrElse {
        val made = CheckpointFileManager.create(root, hadoopConf)
        kept.put(key, made)
        made
      }
    }
  }

  /** What of the settings can change how a filesystem is reached (its `fs.*` settings and
   * the checkpoint file manager's class), as one number. */
  private def filesystemSettings(conf: Configuration): Int = {
    var hash = 0
    val entries = conf.iterator()
    while (entries.hasNext) {
      val e = entries.next()
      if (e.getKey.startsWith("fs.") || e.getKey.startsWith("spark.sql.streaming.")) {
        hash += (e.getKey, e.getValue).hashCode   // a sum: the entries' order does not matter
      }
    }
    hash
  }

  /** How many managers this JVM keeps (tests). */
  def count: Int = kept.synchronized(kept.size())
}

object StateFiles {
  /** A failure to read what is being written, carried through the store's error wrapping. */
  private case class SourceFailed(cause: IOException) extends RuntimeException(cause)

  val DeltaSuffix: String = Contract.DeltaSuffix
  val SnapshotSuffix: String = Contract.SnapshotSuffix

  private val SparkStoreFile = "^(\\d+)(\\.delta|\\.snapshot|(_[0-9a-f-]+)?\\.zip|(_[0-9a-f-]+)?\\.changelog)$".r

  private object OurFiles extends PathFilter {
    override def accept(p: Path): Boolean = versionOf(p.getName).isDefined
  }

  /**
   * Runs one operation of the checkpoint's filesystem on `path`. A failure of the
   * filesystem (not a missing file, which the Python store judges, nor an interrupted task)
   * becomes an error naming the path and the settings that let the filesystem retry longer:
   * for a write Spark's own condition for a state store's failed commit (what Spark's store
   * gives on the same fault, without the path), for a list or read arrowstate's own under
   * Spark's CANNOT_LOAD_STATE_STORE.
   */
  private[store] def onStore[T](operation: String, path: Path)(body: => T): T =
    try body catch {
      case e @ (_: FileNotFoundException | _: InterruptedIOException |
                _: ClosedByInterruptException) => throw e
      case e: IOException =>
        val write = operation == "write"
        val setting = retrySettings(path, e)
        val lost = if (write) " Nothing committed is lost: a write is whole or not at all, " +
          "and the batch runs again when the query is restarted." else ""
        val retry = if (setting.isEmpty) "" else " If the store was unavailable or " +
          s"throttling for a while, let the filesystem retry longer: $setting."
        throw new ArrowStateException(
          if (write) "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT"
          else "CANNOT_LOAD_STATE_STORE.CANNOT_READ_STATE_FILE",
          Map("path" -> path.toString, "reason" -> s"${e.getClass.getName}: ${e.getMessage}",
            "setting" -> setting) ++ (if (write) Map("providerClass" -> "arrowstate") else Nil),
          s"arrowstate could not $operation state file $path: the checkpoint's filesystem " +
            s"failed (${e.getClass.getSimpleName}: ${firstLine(e.getMessage)}).$lost$retry", e)
    }

  private def firstLine(text: String): String =
    Option(text).map(_.linesIterator.nextOption().getOrElse("")).getOrElse("")

  /** The settings that make the filesystem of `path` retry longer, as a Spark setting, per
   * bucket where the filesystem has that; throttling has its own on S3A. */
  private def retrySettings(path: Path, e: Throwable): String = {
    val uri = path.toUri
    def s3a(names: String*) = names.map(n => s"spark.hadoop.fs.s3a.$n").mkString(", ") +
      Option(uri.getHost).map(b => s" (for this bucket only: " +
        names.map(n => s"spark.hadoop.fs.s3a.bucket.$b.$n").mkString(", ") + ")").getOrElse("")
    val throttled = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null).exists {
      c => c.getClass.getSimpleName.contains("Throttled") || Option(c.getMessage).exists(
        m => m.contains("Status Code: 503") || m.contains("SlowDown"))
    }
    Option(uri.getScheme).getOrElse("file") match {
      case "s3a" if throttled =>
        s3a("retry.throttle.limit", "retry.throttle.interval", "attempts.maximum")
      case "s3a" => s3a("retry.limit", "attempts.maximum", "retry.interval")
      case "hdfs" | "viewfs" =>
        "spark.hadoop.ipc.client.connect.max.retries, spark.hadoop.dfs.client.retry.max.attempts"
      case "abfs" | "abfss" => "spark.hadoop.fs.azure.io.retry.max.retries"
      case "gs" => "spark.hadoop.fs.gs.http.max.retry"
      case "file" => ""
      case other => s"the $other filesystem's retry settings (spark.hadoop.fs.$other.*)"
    }
  }

  /** The version of one of our delta or snapshot names: `<version>` then, under
   * checkpoint format v2, `_<checkpoint id>` of the attempt that wrote it. */
  def versionOf(name: String): Option[Long] = name match {
    case VersionedName(version, _, _) => version.toLongOption
    case _ => None
  }

  /** Whether a file of this name is never written over: it carries an attempt's checkpoint
   * id (checkpoint format v2) or is a run file (a random name). */
  def neverReplaced(name: String): Boolean = hasCheckpointId(name) || isRunFile(name)

  /** Whether the name carries an attempt's checkpoint id (checkpoint format v2). */
  def hasCheckpointId(name: String): Boolean = name match {
    case VersionedName(_, id, _) => id != null
    case _ => false
  }

  private val VersionedName = ("^(\\d+)(?:_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-" +
    "[0-9a-f]{12}))?(" + java.util.regex.Pattern.quote(Contract.DeltaSuffix) + "|" +
    java.util.regex.Pattern.quote(Contract.SnapshotSuffix) + ")$").r

  private val RunName = ("^[0-9a-f]{32}" + java.util.regex.Pattern.quote(Contract.RunSuffix) +
    "$").r

  def isRunFile(name: String): Boolean = RunName.matches(name)

  def partitionDir(checkpointLocation: String, operatorId: Long, partitionId: Int): Path =
    new Path(new Path(checkpointLocation, operatorId.toString), partitionId.toString)

  /** Whether any partition directory of an operator (`<checkpoint>/state/<operator>`)
   * holds arrowstate files. */
  def operatorHoldsArrowState(operatorDir: Path, hadoopConf: Configuration): Boolean =
    anyPartitionHolds(operatorDir, hadoopConf, OurFiles)

  /** Whether any partition directory of an operator holds Spark's own state store files. */
  def operatorHoldsSparkState(operatorDir: Path, hadoopConf: Configuration): Boolean =
    anyPartitionHolds(operatorDir, hadoopConf,
      (p: Path) => SparkStoreFile.pattern.matcher(p.getName).matches())

  private def anyPartitionHolds(operatorDir: Path, hadoopConf: Configuration,
      files: PathFilter): Boolean = {
    val fs = operatorDir.getFileSystem(hadoopConf)
    fs.exists(operatorDir) && fs.listStatus(operatorDir).exists { p =>
      p.isDirectory && p.getPath.getName.forall(_.isDigit) &&
        fs.listStatus(p.getPath, files).nonEmpty
    }
  }
}
