package org.apache.spark.sql.arrowstate.unit

import java.io.{PrintWriter, StringWriter}
import java.util.jar.JarFile

import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

/**
 * Fast Scala unit tests of shim pieces that need no SparkSession, with no test library (the
 * pyspark wheel's jars have no ScalaTest).
 *
 * To add tests, drop a file into tests/jvm/unit/ with an object that extends [[UnitTests]]
 * and registers named tests in its body:
 *
 * {{{
 * package org.apache.spark.sql.arrowstate.unit
 *
 * object FramingTests extends UnitTests {
 *   test("a frame's tag comes first") {
 *     assertEqual(actual, expected)
 *   }
 * }
 * }}}
 *
 * Nothing else to do: the `test_jar` fixture (tests/conftest.py) compiles every file in
 * tests/jvm/ and tests/jvm/unit/ in one scalac run against Spark's jars and the shim jar,
 * [[UnitTestRunner]] finds the objects in that jar, and tests/spark/test_jvm_units.py runs
 * them in one JVM, one pytest test per Scala test. Name tests with a plain string literal
 * (`test("...")`): pytest reads the names from the sources to collect them (a test whose
 * name it cannot read fails `test_every_scala_test_is_collected`). The objects live in this
 * package (any package under org.apache.spark.sql.arrowstate reaches the shim's
 * `private[arrowstate]` members). A test fails by throwing; `-Dkey=value` settings the
 * pytest side passes are in `sys.props`.
 */
trait UnitTests {
  private val registered = ArrayBuffer.empty[(String, () => Unit)]

  /** The group's name in reports: the object's simple name. */
  def suiteName: String = getClass.getSimpleName.stripSuffix("$")

  protected def test(name: String)(body: => Unit): Unit = {
    require(!registered.exists(_._1 == name), s"$suiteName: two tests named '$name'")
    registered += name -> (() => body)
  }

  def tests: Seq[(String, () => Unit)] = registered.toSeq

  protected def fail(message: String): Nothing = throw new AssertionError(message)

  protected def assertTrue(condition: Boolean, clue: => String = ""): Unit =
    if (!condition) fail(if (clue.isEmpty) "expected true" else clue)

  protected def assertEqual[T](actual: T, expected: T, clue: => String = ""): Unit =
    if (actual != expected) {
      fail((if (clue.isEmpty) "" else s"$clue: ") + s"expected <$expected> but was <$actual>")
    }

  /** Runs `body`, which must throw an `E`; returns it. */
  protected def assertThrows[E <: Throwable](body: => Any)(
      implicit tag: scala.reflect.ClassTag[E]): E = {
    val thrown = try { body; None } catch { case NonFatal(e) => Some(e) }
    thrown match {
      case Some(e) if tag.runtimeClass.isInstance(e) => e.asInstanceOf[E]
      case Some(e) => fail(s"expected ${tag.runtimeClass.getName} but ${e.getClass.getName} " +
        s"was thrown: ${e.getMessage}")
      case None => fail(s"expected ${tag.runtimeClass.getName} but nothing was thrown")
    }
  }
}

/**
 * Runs every [[UnitTests]] object in the jar this class is in.
 *
 *     java -cp <test jar>:<shim jar>:<spark jars>/\* \
 *       org.apache.spark.sql.arrowstate.unit.UnitTestRunner [--list] [SUITE[: TEST]]...
 *
 * `--list` prints `SUITE: TEST` a line and runs nothing. Arguments select a suite or one
 * test. Prints `PASS SUITE: TEST` or `FAIL SUITE: TEST` a test (a failure's stack trace
 * follows, each line indented by four spaces) and a count; exits 1 if a test failed (or an
 * object could not initialise, reported as `FAIL SUITE: (initialisation)`), 2 if a selector
 * matches nothing.
 */
object UnitTestRunner {
  private val Package = "org/apache/spark/sql/arrowstate/unit/"

  /** The UnitTests objects in this runner's jar (or classes directory), by name. */
  def suites(): Seq[Either[(String, Throwable), UnitTests]] = {
    val location = new java.io.File(getClass.getProtectionDomain.getCodeSource.getLocation.toURI)
    val entries: Seq[String] =
      if (location.isDirectory) {
        val root = location.toPath
        java.nio.file.Files.walk(root).iterator().asScala
          .map(p => root.relativize(p).toString.replace(java.io.File.separatorChar, '/')).toSeq
      } else {
        val jar = new JarFile(location)
        try jar.entries().asScala.map(_.getName).toList finally jar.close()
      }
    val loader = getClass.getClassLoader
    entries.filter(e => e.startsWith(Package) && e.endsWith("$.class"))
      .map(_.stripSuffix(".class").replace('/', '.')).sorted
      .flatMap { name =>
        val cls = Class.forName(name, false, loader)
        if (!classOf[UnitTests].isAssignableFrom(cls)) None
        else Some(try Right(cls.getField("MODULE$").get(null).asInstanceOf[UnitTests]) catch {
          case e: Throwable =>
            Left(name.stripPrefix(Package.replace('/', '.')).stripSuffix("$") ->
              Option(e.getCause).getOrElse(e))
        })
      }
  }

  private def trace(e: Throwable): String = {
    val out = new StringWriter()
    e.printStackTrace(new PrintWriter(out))
    out.toString.linesIterator.map("    " + _).mkString("\n")
  }

  def main(args: Array[String]): Unit = {
    val list = args.contains("--list")
    val selectors = args.filterNot(_ == "--list").toSeq
    def selected(suite: String, test: String): Boolean =
      selectors.isEmpty || selectors.exists(s => s == suite || s == s"$suite: $test")
    var passed, failed = 0
    val matched = scala.collection.mutable.Set.empty[String]
    for (found <- suites()) found match {
      case Left((suite, e)) =>
        if (selectors.isEmpty || selectors.exists(s => s == suite || s.startsWith(s"$suite: "))) {
          println(s"FAIL $suite: (initialisation)\n${trace(e)}")
          failed += 1
          matched ++= selectors.filter(s => s == suite || s.startsWith(s"$suite: "))
        }
      case Right(suite) =>
        for ((name, body) <- suite.tests if selected(suite.suiteName, name)) {
          val id = s"${suite.suiteName}: $name"
          matched ++= selectors.filter(s => s == suite.suiteName || s == id)
          if (list) println(id)
          else {
            try { body(); println(s"PASS $id"); passed += 1 } catch {
              case e: Throwable => println(s"FAIL $id\n${trace(e)}"); failed += 1
            }
          }
        }
    }
    val unmatched = selectors.filterNot(matched)
    unmatched.foreach(s => println(s"NO SUCH TEST $s"))
    if (!list) println(s"$passed passed, $failed failed")
    Console.out.flush()
    sys.exit(if (failed > 0) 1 else if (unmatched.nonEmpty) 2 else 0)
  }
}
