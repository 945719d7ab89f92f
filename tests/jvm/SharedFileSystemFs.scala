package org.apache.spark.sql.arrowstate.testing

import java.net.URI

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{DelegateToFileSystem, FileSystem, FilterFileSystem}

/**
 * FileContext's view of `s3a://` over the JVM's cached S3A FileSystem, for the tests'
 * sessions (`fs.AbstractFileSystem.s3a.impl`).
 *
 * Why: Spark's default checkpoint file manager works through a FileContext, and hadoop-aws's
 * own `S3A` (3.5.0) builds a new S3AFileSystem for each and closes it in `finalize()`.
 * A manager dropped while a stream it opened is still being read is finalized when the
 * garbage collector runs, closing the SDK client under the read: Spark's `statestore`
 * reader on the driver then fails, now and then, with a RejectedExecutionException from
 * the client's shut-down scheduler (a suite run on 2026-12-02, reading a native and an
 * arrowstate checkpoint's metadata alike). This one closes nothing: the FileSystem is
 * Hadoop's cached one (`FileSystem.get`), which arrowstate's own files already use, behind
 * a wrapper whose `initialize` leaves an initialized FileSystem as it is. What is read
 * and written is the same; docs/troubleshooting.md says what users can set.
 */
class SharedFileSystemFs(uri: URI, conf: Configuration)
  extends DelegateToFileSystem(uri, new FilterFileSystem(FileSystem.get(uri, conf)), conf,
    uri.getScheme, false)
