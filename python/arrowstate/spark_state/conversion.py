"""`python -m arrowstate state export` and `import`: an operator's state converted between
arrowstate's files and Spark's own store (the newest committed version), by the family's
layout (spark_state.layouts), in a Spark session; the offset log records a changed
provider, and the old engine's files are moved aside.
"""
from __future__ import annotations

import contextlib
import os

from ..session import EXTENSION_CLASS, configure
from ..store.formats import files as store_files
from ..store.formats import names as file_names
from . import filesystems
from .checkpoint_files import (ARROWSTATE, EXPORTED, IMPORTED, CheckpointError, PartitionFiles,
                               offset_conf, offsets_with_conf, planned_batch,
                               read_state_schema_file, write_log_entry,
                               committed_checkpoint_ids)
from .filesystems import files_for
from .inventory import describe
from .layout import HDFS_PROVIDER, PROVIDER_SETTING, ROCKSDB_PROVIDER, OperatorJob, SparkLayout
from .layouts import LAYOUTS, layout_of_schema
from .readers import stored_schema
from .transform_with_state import TIMER_VARIABLE, operator_properties


def operator_layout(checkpoint: str, o: dict) -> SparkLayout:
    """The layout of the operator's family; for an operator Spark's metadata does not name
    (older checkpoints have none), the one its state schema file's value is."""
    if o["family"] is not None:
        return LAYOUTS[o["family"]]
    _, value = read_state_schema_file(os.path.join(
        checkpoint, "state", str(o["operator_id"]), "0", "_metadata", "schema"))
    return layout_of_schema(value)


def in_column_families(o: dict) -> bool:
    """Whether Spark keeps the operator's family's state in column families."""
    return o["family"] is not None and LAYOUTS[o["family"]].column_families


def refuse_running(checkpoint: str, last: int | None, planning: int | None = None) -> None:
    """Refuses a checkpoint with a batch planned but not committed, but for `planning`: the
    batch whose planning asks for the conversion (the shim's, when a query leaves
    arrowstate), which then follows the last committed one."""
    planned = planned_batch(checkpoint)
    if planning is not None and planned == planning == (-1 if last is None else last) + 1:
        return
    if planned is not None and (last is None or planned > last):
        raise CheckpointError(
            f"{checkpoint}: batch {planned} is planned (offsets/{planned}) but not committed: "
            "a query is running on this checkpoint, or stopped in the middle of a batch. "
            "Stop the query; if it had stopped mid-batch, run it to the end of a batch first.")


def refuse_column_families(checkpoint: str, o: dict, last: int) -> None:
    """State in column families is converted for transformWithState and for nothing else;
    arrowstate's transformWithState state, while it holds no variable the processor no
    longer declares (the conversions read the declared ones)."""
    if o["key_schema"] is None and not in_column_families(o):
        raise CheckpointError(
            f"{checkpoint}: operator {o['operator_id']} ({o['name']}) keeps its state in "
            "column families, which this command does not convert yet; nothing was changed")
    kept = _undeclared_variables(checkpoint, o, last) if in_column_families(o) else []
    if kept:
        raise CheckpointError(
            f"{checkpoint}: operator {o['operator_id']} ({o['name']}) keeps the state of "
            f"variables {kept} that its processor no longer declares (as Spark keeps their "
            "column families), and this command converts declared variables only. Run the "
            "query once with a processor whose init() declares them again, or removes them "
            "with deleteIfExists; nothing was changed")


def _undeclared_variables(checkpoint: str, o: dict, last: int) -> list[str]:
    """The state variables arrowstate's files of the operator hold at batch `last` that
    the processor (its newest operator metadata) does not declare."""
    if ARROWSTATE not in o["engine"].split("+"):
        return []
    op_dir = os.path.join(checkpoint, "state", str(o["operator_id"]))
    declared = {v["stateName"] for v in
                operator_properties(op_dir, last)["stateVariables"]}
    held = set()
    ids = committed_checkpoint_ids(checkpoint, o["operator_id"]).get(last + 1, [])
    for p in range(o["partitions"]):
        where = os.path.join(op_dir, str(p))
        source = PartitionFiles(where, f"operator {o['operator_id']}, partition {p}")
        if files_for(where).isdir(where) and any(file_names.parse_name(n) for n in source.names()):
            held.update((f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()[2:]
                        for f in stored_schema(source, last + 1,
                                               checkpoint_id=ids[p] if p < len(ids) else None))
    return sorted(held - declared - {"", TIMER_VARIABLE})


_open: list[tuple] = []   # the session a state command opened (for a remote checkpoint)


@contextlib.contextmanager
def conversion_session(app: str, conf: dict, on_driver: bool = False,
                       spark_conf: dict | None = None):
    """The Spark session a conversion reads and writes state with. Called from a process
    whose active session runs arrowstate (a notebook, an application): a new session of its
    SparkContext, so no second Spark starts, with the checkpoint's store settings as its
    own and the active session's Hadoop settings (its `fs.*`, as Hadoop reads them).
    `on_driver` (the shim's conversion of a query leaving arrowstate, from a process it
    starts on the driver): a new session of the planning query's SparkContext, reached
    through the py4j gateway the shim opens for it (PYSPARK_GATEWAY_PORT/SECRET), so with
    the planning query's filesystem settings. Else (the command line) a local Spark with
    `spark_conf` (its --conf), started for it and stopped after. Yields the session and
    which of the three it is ("active", "driver", "local"); while open, a checkpoint off the
    local disk is reached through it (filesystems.bound). Opened again inside (a state
    command on a remote checkpoint opens it first, to read the checkpoint), the same one."""
    from pyspark.sql import SparkSession

    if _open:
        session, kind = _open[-1]
        for k, v in conf.items():
            session.conf.set(k, v)
        yield session, kind
        return
    active, kind = SparkSession.getActiveSession(), "active"
    if active is None and on_driver and "PYSPARK_GATEWAY_PORT" in os.environ:
        active, kind = _driver_session(), "driver"
    if (getattr(active, "_jsparkSession", None) is not None
            and EXTENSION_CLASS in active.conf.get("spark.sql.extensions", "")):
        session = active.newSession()
        for k, v in {**_hadoop_settings(active), **conf}.items():
            session.conf.set(k, v)
        jvm_session = session._jvm.org.apache.spark.sql.SparkSession
        jvm_session.setActiveSession(session._jsparkSession)   # what SQLConf.get reads
        try:
            with _opened(session, kind):
                yield session, kind
        finally:
            jvm_session.setActiveSession(active._jsparkSession)
        return
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false"))
    for k, v in {**(spark_conf or {}), **conf}.items():
        builder = builder.config(k, v)
    spark = configure(builder).getOrCreate()
    try:
        with _opened(spark, "local"):
            yield spark, "local"
    finally:
        spark.stop()


@contextlib.contextmanager
def _opened(session, kind: str):
    _open.append((session, kind))
    try:
        with filesystems.bound(session):
            yield
    finally:
        _open.pop()


def _hadoop_settings(session) -> dict:
    """The settings of a session that Hadoop's configuration takes from it (a session's
    Hadoop configuration is the SparkContext's plus the session's own settings): those
    outside Spark's namespace, such as `fs.s3a.*`, a new session of the same context would
    not have."""
    return {k: v for k, v in session.conf.getAll.items()
            if not k.startswith("spark.") or k.startswith("spark.hadoop.")}


def _driver_session():
    """The planning query's session on the driver that started this process, wrapped by
    pyspark through the gateway in PYSPARK_GATEWAY_PORT/SECRET, with no SparkContext
    started: pyspark's objects around the driver's own (which this process never stops),
    and the driver's default session left as it was."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    gateway = launch_gateway()
    planning = gateway.entry_point.session()
    jsc = gateway.jvm.org.apache.spark.api.java.JavaSparkContext(planning.sparkContext())
    context = SparkContext(gateway=gateway, jsc=jsc, conf=SparkConf(_jconf=jsc.getConf()))
    sessions = SparkSession._get_j_spark_session_class(gateway.jvm)
    default = sessions.getDefaultSession()
    try:
        return SparkSession(context, jsparkSession=planning)
    finally:   # pyspark makes the first session it wraps the JVM's default
        if default.isDefined():
            sessions.setDefaultSession(default.get())
        else:
            sessions.clearDefaultSession()


def _move_aside(checkpoint: str, operators: list[int], backup: str, is_moved) -> None:
    """Moves the files `is_moved` picks from the operators' partition directories (and their
    checksum files) to the same places under `backup`."""
    files = files_for(checkpoint)
    state_root = os.path.join(checkpoint, "state")
    for op in operators:
        op_dir = os.path.join(state_root, str(op))
        for p in (n for n in files.listdir(op_dir) if n.isdigit()):
            src = os.path.join(op_dir, p)
            for name in files.listdir(src):
                if is_moved(name.lstrip(".").removesuffix(".crc")):
                    dst = os.path.join(backup, "state", str(op), p)
                    files.makedirs(dst)
                    files.rename(os.path.join(src, name), os.path.join(dst, name))


def _convert(checkpoint: str, direction: str, choose, check, operate, backup_prefix: str,
             is_moved, time_zone: str | None = None, planning: int | None = None,
             spark_conf: dict | None = None) -> dict:
    """The shared steps of export and import: pick the operators (`choose`), refuse what
    cannot be converted (`check(conf, last, chosen, operators)`, given the offset log's
    settings; it returns the settings the conversion changes there, if any), write the other
    engine's snapshot of the newest committed version per operator in the session of
    `conversion_session`, by the operator's layout (`operate(layout, job)` gives the rows
    per partition; the job's time zone is `time_zone`, else the session's), then record the
    changed settings in the offset log's newest entry, and only then move the old engine's
    files aside."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    chosen = [o for o in described["operators"] if choose(o)]
    if not chosen:
        return {"checkpoint": described["checkpoint"], direction: [],
                "message": f"no state to {direction.removesuffix('ed')} in this checkpoint: "
                           "nothing to do"}
    refuse_running(checkpoint, last, planning)
    conf = offset_conf(checkpoint, last)
    changed = check(conf, last, chosen, described["operators"])
    conf = {**conf, **changed}
    for o in chosen:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; only the default store is converted")
        refuse_column_families(checkpoint, o, last)
    version = last + 1
    state_root = files_for(checkpoint).absolute(os.path.join(checkpoint, "state"))
    converted = []
    with conversion_session(f"arrowstate state {direction}", _store_settings(conf),
                            on_driver=planning is not None,
                            spark_conf=spark_conf) as (spark, session):
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.tools.StateConversion
        zone = time_zone or spark.conf.get("spark.sql.session.timeZone")
        for o in chosen:
            job = OperatorJob(spark, conversion, checkpoint, state_root, o, last, version,
                              o["partitions"], conf, zone)
            rows = operate(operator_layout(checkpoint, o), job)
            converted.append({"operator_id": o["operator_id"], "version": version,
                              "rows": sum(rows)})
    message = ""
    if changed:   # before the move: a failure in between leaves a run of this to redo
        offsets = os.path.join(checkpoint, "offsets")
        text = offsets_with_conf(checkpoint, last, changed)
        # Hadoop's checksum of the old text (the local filesystem's)
        files_for(offsets).remove(os.path.join(offsets, f".{last}.crc"))
        write_log_entry(os.path.join(offsets, str(last)), text)
        message = "; offsets/{} now records {}".format(
            last, ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
    backup = os.path.join(checkpoint, f"{backup_prefix}{version}")
    _move_aside(checkpoint, [o["operator_id"] for o in chosen], backup, is_moved)
    return {"checkpoint": described["checkpoint"], direction: converted, "session": session,
            "message": f"the old engine's files were moved to {backup}{message}"}


def _store_settings(conf: dict) -> dict:
    """The state store settings the checkpoint's offset log records (provider, codec,
    RocksDB's), for the session that converts its state."""
    return {k: v for k, v in conf.items() if k.startswith("spark.sql.streaming.")}


def export_to_spark(checkpoint: str, operator: int | None = None,
                    planning: int | None = None, spark_conf: dict | None = None) -> dict:
    """Converts every arrowstate operator's state to the format of the Spark state store
    the checkpoint records (the newest committed version: HDFS-backed, `<v>.snapshot` per
    partition; RocksDB, a snapshot of that version written through its provider, and for
    transformWithState through Spark's own state variable implementations), so that the
    query continues on Spark's own operators. arrowstate's files are moved, once every
    partition is written, to `<checkpoint>/arrowstate-exported-<v>/`. Running it again does
    nothing. `operator` converts that operator only; `planning` is the batch a query is
    planning when the shim converts its state because it leaves arrowstate (that batch's
    offsets are written, its commit not yet). `spark_conf` configures a Spark it starts."""
    def check(conf, last, chosen, operators):
        provider = conf.get(PROVIDER_SETTING, HDFS_PROVIDER)
        if provider not in (HDFS_PROVIDER, ROCKSDB_PROVIDER):
            raise CheckpointError(
                f"{checkpoint}: the query's state store provider is {provider} "
                f"(offsets/{last}); export writes the formats of {HDFS_PROVIDER} and "
                f"{ROCKSDB_PROVIDER} only")
        if conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled") == "true":
            raise CheckpointError(f"{checkpoint}: the query stores row checksums "
                                  "(spark.sql.streaming.stateStore.rowChecksum.enabled=true); "
                                  "export does not write them")
        tws = [o for o in chosen if in_column_families(o)]
        encoding = conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")
        if tws and encoding != "unsaferow":
            raise CheckpointError(
                f"{checkpoint}: operator {tws[0]['operator_id']} ({tws[0]['name']}) records "
                f"the state encoding {encoding} (spark.sql.streaming.stateStore."
                f"encodingFormat, offsets/{last}); export writes transformWithState state as "
                "unsaferow only; nothing was changed")
        if provider == ROCKSDB_PROVIDER or not tws:
            return {}
        if planning is not None:   # the running query's provider is already the recorded one
            raise CheckpointError(
                f"{checkpoint}: operator {tws[0]['operator_id']} ({tws[0]['name']}) leaves "
                f"arrowstate while batch {planning} is planned on {HDFS_PROVIDER} "
                f"(offsets/{planning}); Spark runs transformWithState on {ROCKSDB_PROVIDER} "
                "only. Stop the query and run `python -m arrowstate state export` on the "
                "checkpoint (it records RocksDB), then restart; nothing was changed")
        # Spark runs transformWithState on RocksDB only: arrowstate ran it on the recorded
        # HDFS-backed provider, so every operator's state is written for RocksDB and the
        # offset log records it, which needs all the query's state to be arrowstate's
        theirs = [o for o in operators if o["engine"] != "none" and o not in chosen]
        if theirs:
            raise CheckpointError(
                f"{checkpoint}: operator {theirs[0]['operator_id']} ({theirs[0]['name']}) "
                f"holds {theirs[0]['engine']} state of {HDFS_PROVIDER}; Spark runs "
                f"transformWithState on {ROCKSDB_PROVIDER} only, and export moves only "
                "arrowstate's state to it; nothing was changed")
        return {PROVIDER_SETTING: ROCKSDB_PROVIDER}

    def choose(o):
        return (ARROWSTATE in o["engine"].split("+")
                and (operator is None or o["operator_id"] == operator))

    return _convert(checkpoint, "exported", choose, check,
                    lambda layout, job: layout.export_operator(job), EXPORTED,
                    file_names.is_ours, planning=planning,
                    spark_conf=spark_conf)


def import_from_spark(checkpoint: str, time_zone: str | None = None,
                      spark_conf: dict | None = None) -> dict:
    """Converts the state Spark's own store holds (through the provider the checkpoint
    records: HDFS-backed or RocksDB) for the operators arrowstate runs to arrowstate's
    format (the newest committed version, as one snapshot per partition), so that the
    query continues on arrowstate. Spark's files are moved, once every snapshot is written,
    to `<checkpoint>/spark-state-imported-<v>/`. Timestamps in the state take `time_zone`
    (the session time zone the query runs with; this machine's by default). Running it
    again does nothing. `spark_conf` configures a Spark it starts."""
    def choose(o):
        if o["engine"] == "none" or ARROWSTATE in o["engine"].split("+"):
            return False
        if o["family"] is None:
            raise CheckpointError(
                f"{checkpoint}: operator {o['operator_id']} ({o['name']}) is not one "
                "arrowstate runs; its state stays Spark's (nothing was converted)")
        return True

    return _convert(checkpoint, "imported", choose, lambda conf, last, chosen, ops: {},
                    lambda layout, job: layout.import_operator(job), IMPORTED,
                    # RocksDB's SST files too: left behind, they read as Spark's state
                    lambda name: name == "SSTs" or bool(file_names.spark_store_files([name])),
                    time_zone, spark_conf=spark_conf)
