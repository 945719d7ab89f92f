"""Kafka for the real-time benchmark and tests (test/bench time only; users bring their own):
a one-node KRaft broker on loopback (`KafkaBroker`), Spark's Kafka connector jars for a
session's `spark.jars` (`connector_jars()`), and, from Python through confluent-kafka (the
`test` extra), a paced producer stamping each record with its send time and a recorder of
what reaches a topic, with each record's arrival time (latency = arrival - sent).
"""
from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from storage import (StorageUnavailable, _artifact, _stop, _wait, free_port,
                     maven_dependency, maven_jars, maven_pom, spark_artifacts)

BROKER_VERSION = "4.1.1"   # kafka_2.13: the broker (KRaft, Java 17)
# Spark's connector of the newest published Spark; none of 4.3.0 is, and 4.2.0's runs on
# pyspark 4.3.0 (its Kafka source and sink both serve real-time mode)
CONNECTOR_VERSION = "4.2.0"
LOG4J_VERSION = "2.24.3"   # the log4j-core kafka_2.13 4.1.1 depends on


def broker_jars(cache: Path | None = None) -> list[str]:
    """The class path of a Kafka broker (and of its StorageTool), downloaded once."""
    pom = maven_pom("kafka-broker-jars", "written by arrowstate's tests/helpers/kafka.py: a "
                    "test-time Kafka broker's jars; not built",
                    [maven_dependency("org.apache.kafka", "kafka_2.13", BROKER_VERSION),
                     # the broker logs through slf4j 1.7: its log4j2 binding, as Kafka's
                     # own distribution ships it (none, and the log says nothing)
                     maven_dependency("org.apache.logging.log4j", "log4j-slf4j-impl",
                                      LOG4J_VERSION)])
    return maven_jars("kafka-jars", f"broker-{BROKER_VERSION}", pom,
                      lambda jars: {"broker": [str(p) for p in jars]},
                      f"the Kafka broker (kafka_2.13 {BROKER_VERSION})", cache)["broker"]


def connector_jars(cache: Path | None = None) -> list[str]:
    """The jars to add to a session's `spark.jars` for `format("kafka")`: Spark's Kafka
    connector and its dependencies that pyspark does not ship already."""
    pom = maven_pom("kafka-connector-jars", "written by arrowstate's tests/helpers/kafka.py: "
                    "Spark's Kafka connector for the tests; not built",
                    [maven_dependency("org.apache.spark", "spark-sql-kafka-0-10_2.13",
                                      CONNECTOR_VERSION)])

    def split(jars: list[Path]) -> dict[str, list[str]]:
        spark_has = spark_artifacts()
        return {"connector": [str(p) for p in jars if _artifact(p.name) not in spark_has]}
    return maven_jars("kafka-jars", f"spark-connector-{CONNECTOR_VERSION}", pom, split,
                      f"Spark's Kafka connector (spark-sql-kafka-0-10 {CONNECTOR_VERSION})",
                      cache)["connector"]


class KafkaBroker:
    """A one-node Kafka broker in KRaft mode (broker and controller in one JVM) on loopback,
    in a temp dir: `with KafkaBroker() as kafka: kafka.bootstrap`. Topics are created on
    first use too (auto.create.topics.enable), with `partitions` partitions."""

    def __init__(self, partitions: int = 1, workdir: str | None = None,
                 heap: str = "512m", start_timeout: float = 90):
        self.partitions = partitions
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="arrowstate-kafka-"))
        self.heap, self.start_timeout = heap, start_timeout
        self.port, self.controller_port = free_port(), free_port()
        self.log = self.workdir / "broker.log"
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _properties(self) -> Path:
        data = self.workdir / "data"
        settings = {
            "process.roles": "broker,controller", "node.id": "1",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "log.dirs": str(data), "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "true",
            # one broker: every internal topic has one replica; few partitions for the
            # consumer groups' offsets (50 by default: seconds to create on first use)
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0"}
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _log4j(self) -> Path:
        # INFO to stdout (the log file), the request and state-change chatter left out
        path = self.workdir / "log4j2.properties"
        path.write_text("rootLogger.level = INFO\nrootLogger.appenderRef.out.ref = out\n"
                        "appender.out.type = Console\nappender.out.name = out\n"
                        "appender.out.layout.type = PatternLayout\n"
                        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
                        "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
                        "logger.state.name = state.change.logger\n"
                        "logger.state.level = WARN\n")
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        java = (str(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
                if os.environ.get("JAVA_HOME") else shutil.which("java"))
        if not java:
            raise StorageUnavailable("no `java` (JAVA_HOME or the PATH) to run the Kafka broker")
        return [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self._log4j()}",
                "-cp", os.pathsep.join(broker_jars()), main, *args]

    def start(self) -> "KafkaBroker":
        try:
            import confluent_kafka  # noqa: F401 (readiness is a metadata request through it)
        except ImportError:
            raise StorageUnavailable("confluent-kafka is not installed (the `test` extra)")
        props = self._properties()
        # a new cluster's storage: its id (22 characters of URL-safe base64, as Kafka's
        # Uuid) and the metadata log's first records; the static voters list needs no
        # --standalone
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        with open(self.log, "wb") as out:
            done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t",
                                             cluster_id, "-c", str(props)),
                                  stdout=out, stderr=subprocess.STDOUT, timeout=120)
        if done.returncode != 0:
            raise StorageUnavailable(f"Kafka's StorageTool could not format {props} (its log: "
                                     f"{self.log}):\n"
                                     + self.log.read_text(errors="replace")[-3000:])
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(props)), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        try:
            _wait(self._ready, f"the Kafka broker at {self.bootstrap}", self.proc, self.log,
                  self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _admin(self):
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def _ready(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        try:
            return bool(self._admin().list_topics(timeout=2).brokers)
        except Exception:   # KafkaException: no answer yet
            return False

    def create_topic(self, name: str, partitions: int | None = None,
                     timeout: float = 30) -> None:
        """Creates `name` and waits until every partition has its leader (a producer or a
        Spark source started at once finds them all)."""
        from confluent_kafka.admin import NewTopic
        partitions = partitions or self.partitions
        admin = self._admin()
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            if (topic is not None and topic.error is None
                    and len(topic.partitions) == partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())):
                return
            if time.monotonic() > deadline:
                raise StorageUnavailable(f"topic {name!r} on {self.bootstrap} has no leader "
                                         f"for each of its {partitions} partitions after "
                                         f"{timeout:.0f} s (broker log: {self.log})")
            time.sleep(0.1)

    def stop(self) -> None:
        _stop(self.proc, grace=20)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
