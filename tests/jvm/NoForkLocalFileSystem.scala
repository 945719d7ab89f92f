package org.apache.spark.sql.arrowstate.testing

import java.net.URI
import java.nio.file.Files
import java.nio.file.attribute.PosixFilePermission

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{ChecksumFs, DelegateToFileSystem, FileStatus, LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local filesystem, with the two calls it makes through a shell done in the JVM.
 * Without Hadoop's native library (pyspark has none) every file Spark writes to a
 * checkpoint costs three child processes: `chmod` when the temporary file is created and
 * `readlink` twice when it is renamed into place. Forked from a busy JVM on two cores that
 * is about a third of a small micro-batch. The tests' session uses this class for `file:`
 * (`fs.file.impl`, `fs.AbstractFileSystem.file.impl`); what is read and written is the same.
 * Tests that start their own Spark (cluster, spark-submit, Spark Connect, the CLI) keep
 * Hadoop's own.
 */
class NoForkRawLocalFileSystem extends RawLocalFileSystem {

  override def setPermission(p: Path, permission: FsPermission): Unit = {
    val bits = permission.toShort
    val modes = PosixFilePermission.values().reverse.zipWithIndex.collect {
      case (mode, bit) if (bits & (1 << bit)) != 0 => mode
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath, java.util.Set.of(modes.toSeq: _*))
  }

  // Hadoop asks `readlink` whether the path is a symbolic link; only links need it
  override def getFileLinkStatus(f: Path): FileStatus =
    if (Files.isSymbolicLink(pathToFile(f).toPath)) super.getFileLinkStatus(f)
    else getFileStatus(f)
}

class NoForkLocalFileSystem extends LocalFileSystem(new NoForkRawLocalFileSystem)

/** The same for FileContext, which Spark's checkpoint file manager uses. */
class NoForkRawLocalFs(uri: URI, conf: Configuration)
  extends DelegateToFileSystem(uri, new NoForkRawLocalFileSystem, conf, "file", false) {
  override def getUriDefaultPort: Int = -1
  override def isValidName(src: String): Boolean = true   // as Hadoop's RawLocalFs
}

class NoForkLocalFs(uri: URI, conf: Configuration)
  extends ChecksumFs(new NoForkRawLocalFs(uri, conf))
