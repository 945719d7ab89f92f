"""The parts of scripts/spark_suites.py (the entry point, with the command line): config
(versions, suite groups, JVM options, exit codes), expected (EXPECTED_FAILURES, data),
classpath (the test jars with mvn, suite names), launch (one suite in one mode), results
(reading ScalaTest's reports) and compare (off against on, summaries, the exit code)."""
