"""Kafka for the real-time benchmark and tests (test/bench time only; users bring their own):
a one-node KRaft broker on loopback (`KafkaBroker`), Spark's Kafka connector jars for a
session's `spark.jars` (`connector_jars()`), and, from Python through confluent-kafka (the
`test` extra), a paced producer stamping each record with its sequence number and send time
(`PacedProducer`, `produce_paced`, on a latency.Schedule) and a recorder of what reaches a
topic with each record's arrival time (`TopicRecorder`): latency = arrival - send time, or,
where the producer may fall behind, arrival - the time the schedule gave the record
(latency.py). scripts/kafka_smoke.py puts them together.

The jars are test-time downloads with `mvn` (storage.py's `maven_jars`), cached in
~/.cache/arrowstate/kafka-jars: the broker (kafka_2.13, with log4j's slf4j binding) on a
class path of its own, and the connector less what pyspark ships. No 4.3.0 connector is
published; 4.2.0's (kafka-clients 3.9.2) runs on pyspark 4.3.0.

Real-time mode (`trigger(realTime=...)`) with Kafka, as found here (pyspark 4.3.0, the 4.2.0
connector, a 4.1.1 broker):
- The source and the sink need no option of their own. `startingOffsets=earliest` has the
  query read what was sent before its first batch was planned (`latest` by default).
- A real-time batch runs all its stages at once, a task slot per partition of each: a local
  master needs local[N] with N >= the source's partitions (+ spark.sql.shuffle.partitions
  when the query shuffles, as a state function does). Too few is no error: with local[4]
  and a 5-partition source, 138 of 200 records came back within 60 s.
- The trigger's interval is the batch's length (when offsets and state are checkpointed),
  5 s at least unless spark.sql.streaming.realTimeMode.minBatchDuration (5000 ms) is
  lowered. Between two batches nothing is read: records sent then waited 0.7 s
  (stateless) to 2 s (a state function on arrowstate) on a 2-core machine. A latency
  benchmark reports those apart, or runs within one batch (a trigger longer than the run).
- The first batch's tasks read 4 to 11 s after start(): send until a record comes back
  before measuring (kafka_smoke.py's warm-up).
- A state function's code runs in Python workers that cannot import tests/helpers: what it
  uses from here goes in by value (a constant copied into a local).
- query.stop() cancels the running batch: its Kafka clients log InterruptExceptions, as
  errors, on the way out.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from latency import Schedule
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


def new_cluster_id() -> str:
    """A cluster id as Kafka's Uuid.randomUuid makes one: 22 characters of URL-safe base64,
    never starting with '-', which StorageTool's argument parser takes for an option (a
    1-in-64 failure, seen in CI)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


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
        if importlib.util.find_spec("confluent_kafka") is None:   # readiness is asked with it
            raise StorageUnavailable("confluent-kafka is not installed (the `test` extra)")
        props = self._properties()
        # a new cluster's storage: its id (22 characters of URL-safe base64, as Kafka's
        # Uuid) and the metadata log's first records; the static voters list needs no
        # --standalone
        cluster_id = new_cluster_id()
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


# -- from Python: paced records stamped with their send time, and what reaches a topic -----

PRODUCED_AT = "produced_at_ns"   # the value's field with the record's send time (time_ns)


class _InThread:
    """`_run` in a daemon thread from start() on, until stop() (a context manager too)."""

    def __init__(self, name: str):
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self):
        self._thread.start()
        return self


class PacedProducer(_InThread):
    """Sends `records_per_s` records a second to `topic` from a thread, for `seconds` (None:
    until stop()), each at its own time on a fixed schedule (start + i / rate: a late one is
    sent at once, the next ones keep the schedule). `schedule`, set when sending starts,
    gives each record's due time; `max_lag_ms` is the most a record was sent after it. A
    record's key is `make_key(i)` (default `k<i % 16>`), its value the JSON of {"seq": i,
    PRODUCED_AT: send time in time.time_ns(), **make_value(i)}. Each record goes out on its
    own (linger.ms=0)."""

    def __init__(self, bootstrap: str, topic: str, records_per_s: float,
                 seconds: float | None = None, make_value=None, make_key=None,
                 config: dict | None = None):
        from confluent_kafka import Producer
        self.topic, self.rate, self.seconds = topic, records_per_s, seconds
        self.make_value = make_value or (lambda i: {})
        self.make_key = make_key or (lambda i: f"k{i % 16}")
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                   "acks": "all", **(config or {})})
        # connected, with the topic's leaders known, before the schedule starts (the first
        # records would wait for that otherwise)
        self._producer.list_topics(topic, timeout=10)
        _InThread.__init__(self, f"produce-{topic}")
        self.sent = 0          # records handed to the client
        self.errors: list[str] = []   # delivery failures, as the client reports them
        self.schedule: Schedule | None = None
        self.max_lag_ms = 0.0   # the most a record was sent after its due time

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def _run(self) -> None:
        start = time.monotonic()   # waits by the monotonic clock, the schedule in wall time
        self.schedule = Schedule(time.time_ns(), self.rate)
        end = None if self.seconds is None else start + self.seconds
        i = 0
        try:
            while not self._stopping.is_set():
                due = start + i / self.rate
                if end is not None and due >= end:
                    break
                if self._stopping.wait(max(0.0, due - time.monotonic())):
                    break
                value = {"seq": i, PRODUCED_AT: time.time_ns(), **self.make_value(i)}
                while True:
                    try:
                        self._producer.produce(self.topic, key=self.make_key(i),
                                               value=json.dumps(value),
                                               on_delivery=self._delivered)
                        break
                    except BufferError:   # the client's queue is full: the broker lags
                        self._producer.poll(0.05)
                self.max_lag_ms = max(self.max_lag_ms, (time.monotonic() - due) * 1000)
                self._producer.poll(0)
                i += 1
                self.sent = i
        except BaseException as e:   # join() raises it: a thread's error is lost otherwise
            self.errors.append(f"record {i}: {e!r}")
        finally:
            self._producer.flush(30)

    def join(self, timeout: float | None = None) -> int:
        """Waits for the schedule's end (all sent and acknowledged); the records sent."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"producing to {self.topic!r} still going after {timeout} s")
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} records to {self.topic!r} failed: "
                               f"{self.errors[:3]}")
        return self.sent

    def stop(self) -> int:
        self._stopping.set()
        return self.join(60) if self._thread.ident else 0


def produce_paced(bootstrap: str, topic: str, records_per_s: float, seconds: float,
                  make_value=None, make_key=None) -> int:
    """PacedProducer's schedule, run to its end in the caller: the records sent."""
    return PacedProducer(bootstrap, topic, records_per_s, seconds, make_value,
                         make_key).start().join()


@dataclass(frozen=True)
class Arrival:
    arrived_ns: int          # time.time_ns() when the record reached Python
    key: str | None
    value: object            # the JSON value parsed (the raw string when not JSON)
    partition: int
    offset: int
    timestamp_ms: int        # the record's Kafka timestamp (CreateTime: the producer's)

    def latency_ms(self, field: str = PRODUCED_AT) -> float:
        """arrival - the value's send time (PacedProducer's stamp, carried through)."""
        return (self.arrived_ns - self.value[field]) / 1e6


class TopicRecorder(_InThread):
    """Reads every partition of `topic` from its beginning in a thread, recording each
    record with the time it arrived. The topic must exist (its partitions are assigned,
    no consumer group rebalances)."""

    def __init__(self, bootstrap: str, topic: str, config: dict | None = None):
        from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
        self.topic = topic
        self._consumer = Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": f"arrowstate-recorder-{uuid.uuid4().hex[:8]}",
                                   "enable.auto.commit": False,
                                   "auto.offset.reset": "earliest",
                                   # an empty fetch comes back after 10 ms: a record is
                                   # fetched within that of its write
                                   "fetch.wait.max.ms": 10, **(config or {})})
        meta = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            self._consumer.close()
            raise ValueError(f"topic {topic!r} at {bootstrap} is not there to record "
                             f"({meta.error if meta is not None else 'no metadata'})")
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                               for p in sorted(meta.partitions)])
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self.error: BaseException | None = None
        _InThread.__init__(self, f"record-{topic}")

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                # poll returns with the first record; consume(timeout=0) then takes those
                # already fetched (consume with a timeout waits it out for a full batch)
                first = self._consumer.poll(0.05)
                if first is None:
                    continue
                batch = [first, *self._consumer.consume(num_messages=1000, timeout=0)]
                now = time.time_ns()
                got = []
                for m in batch:
                    if m.error() is not None:
                        raise RuntimeError(f"reading {self.topic!r}: {m.error()}")
                    got.append(Arrival(now, m.key().decode() if m.key() else None,
                                       _parsed(m.value()), m.partition(), m.offset(),
                                       m.timestamp()[1]))
                with self._lock:
                    self._arrivals.extend(got)
        except BaseException as e:   # kept for the caller: a thread's error is lost otherwise
            self.error = e
        finally:
            self._consumer.close()

    def arrivals(self) -> list[Arrival]:
        if self.error is not None:
            raise RuntimeError(f"recording {self.topic!r} failed") from self.error
        with self._lock:
            return list(self._arrivals)

    def wait_for(self, count: int, timeout: float, failed=lambda: None,
                 where=None) -> list[Arrival]:
        """The arrivals (those `where(arrival)` keeps, when given) once there are `count`;
        `failed()` (say, a query's exception) is raised when it returns one; TimeoutError
        after `timeout` s, saying how many came."""
        deadline = time.monotonic() + timeout
        while True:
            got = [a for a in self.arrivals() if where is None or where(a)]
            if len(got) >= count:
                return got
            error = failed()
            if error is not None:
                raise error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(got)} of {count} records reached {self.topic!r} "
                                   f"within {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.ident:
            self._thread.join(30)


def _parsed(raw: bytes | None):
    if raw is None:
        return None
    text = raw.decode()
    try:
        return json.loads(text)
    except ValueError:
        return text
