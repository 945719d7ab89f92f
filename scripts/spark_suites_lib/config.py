"""What the suites run with: the Spark test jars' version and libraries, the suite groups,
the JVM's options and logging, the exit codes and the script's own errors."""
from __future__ import annotations

SPARK_TEST_VERSION = "4.2.0"   # the newest Spark whose test jars Maven Central has
SCALA_BINARY = "2.13"
# the test libraries of Spark 4.2.0's build (its parent pom)
TEST_LIBRARIES = [
    ("org.scalatest", f"scalatest_{SCALA_BINARY}", "3.2.19"),
    ("org.scalatestplus", f"scalacheck-1-18_{SCALA_BINARY}", "3.2.19.0"),
    ("org.scalatestplus", f"mockito-5-18_{SCALA_BINARY}", "3.2.19.0"),
    ("org.mockito", "mockito-core", "5.23.0"),
    ("net.bytebuddy", "byte-buddy", "1.18.4"),
    ("net.bytebuddy", "byte-buddy-agent", "1.18.4"),
]
# Spark's test jars: the suites (sql), the base classes they extend (core: SparkFunSuite,
# catalyst: PlanTest, SQLHelper) and the test tags (tags)
SPARK_TEST_JARS = ["spark-sql", "spark-core", "spark-catalyst", "spark-tags"]

SQL_STREAMING = "org.apache.spark.sql.streaming"
STATE_READER = "org.apache.spark.sql.execution.datasources.v2.state"
SUITE_GROUPS = {
    # what this project's operators replace, and the state data source reading their state
    "default": [
        f"{SQL_STREAMING}.StreamingDeduplicationSuite",
        f"{SQL_STREAMING}.StreamingDeduplicationWithinWatermarkSuite",
        f"{SQL_STREAMING}.StreamingAggregationSuite",
        f"{SQL_STREAMING}.StreamingSessionWindowSuite",
        f"{SQL_STREAMING}.MultiStatefulOperatorsSuite",
        f"{STATE_READER}.HDFSBackedStateDataSourceReadSuite",
        f"{STATE_READER}.RocksDBStateDataSourceReadSuite",
        f"{STATE_READER}.RocksDBWithChangelogCheckpointStateDataSourceReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceReaderSnapshotSuite",
        f"{STATE_READER}.HDFSBackedStateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.RocksDBWithChangelogCheckpointStateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.RocksDBWithCheckpointV2StateDataSourceChangeDataReaderSuite",
        f"{STATE_READER}.StateDataSourceNegativeTestSuite",
        f"{STATE_READER}.StateDataSourceSQLConfigSuite",
        f"{STATE_READER}.StateDataSourceNoEmptyDirCreationSuite",
        f"{STATE_READER}.StatePartitionAllColumnFamiliesReaderSuite",
    ],
    # the same operators on RocksDB, their distribution checks, and the state reader's suites
    # for Scala transformWithState (which stays Spark's operator)
    "extra": [
        f"{SQL_STREAMING}.RocksDBStateStoreStreamingDeduplicationSuite",
        f"{SQL_STREAMING}.RocksDBStateStoreStreamingAggregationSuite",
        f"{SQL_STREAMING}.DeprecatedStreamingAggregationSuite",
        f"{SQL_STREAMING}.StreamingDeduplicationDistributionSuite",
        f"{SQL_STREAMING}.StreamingAggregationDistributionSuite",
        f"{SQL_STREAMING}.StreamingSessionWindowDistributionSuite",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuite",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuiteCheckpointV2",
        f"{STATE_READER}.StateDataSourceTransformWithStateSuiteWithRowChecksum",
    ],
}
SUITE_GROUPS["all"] = SUITE_GROUPS["default"] + SUITE_GROUPS["extra"]

EXTENSIONS = "org.apache.spark.sql.arrowstate.ArrowStateExtensions"
EXPLAIN_PROVIDER = "org.apache.spark.sql.arrowstate.ArrowStateExplainGenerator"

# Spark's build: scalatest-maven-plugin's argLine (with extraJavaTestArgs) and system properties
JAVA_OPTIONS = [
    "-ea", "-Xmx4g", "-Xss4m", "-XX:MaxMetaspaceSize=2g", "-XX:ReservedCodeCacheSize=128m",
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    *[f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net",
        "java.nio", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
        "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action",
        "sun.util.calendar")],
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.type=pooled",
    "-Dio.netty.handler.ssl.defaultEndpointVerificationAlgorithm=NONE",
    "--sun-misc-unsafe-memory-access=allow",
    "--enable-native-access=ALL-UNNAMED",
    "-XX:+EnableDynamicAgentLoading",
    "-Dderby.system.durability=test",
    "-Djava.awt.headless=true",
    "-Dspark.testing=1",
    "-Dspark.master.rest.enabled=false",
    "-Dspark.ui.enabled=false",
    "-Dspark.ui.showConsoleProgress=false",
    "-Dspark.unsafe.exceptionOnMemoryLeak=true",
    "-Dspark.hadoop.hadoop.caller.context.enabled=true",
    "-Dspark.memory.debugFill=true",
]

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = File
appender.file.type = File
appender.file.name = File
appender.file.fileName = ${sys:arrowstate.suites.log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{HH:mm:ss.SSS} %t %p %c{1}: %m%n%ex
"""

EXIT_REGRESSION, EXIT_ERROR, EXIT_NO_JARS = 1, 2, 3


class NoTestJars(Exception):
    """The test jars are not cached and cannot be downloaded (no mvn, no network)."""


class ScriptError(Exception):
    """An error of the script's own (bad arguments, a suite not in the jar): exit code 2."""
