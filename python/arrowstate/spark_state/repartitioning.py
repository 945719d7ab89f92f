"""`python -m arrowstate state repartition`: arrowstate state of a stopped query, offline,
into another number of partitions, as Spark 4.3's repartition does it for RocksDB.
"""
from __future__ import annotations

import os

from .checkpoint_files import (ARROWSTATE, CheckpointError, offset_conf, offsets_with_conf,
                               planned_batch, write_log_entry)
from .conversion import conversion_session, operator_layout, refuse_column_families, \
    refuse_running
from .filesystems import files_for
from .inventory import describe
from .layout import OperatorJob


def repartition(checkpoint: str, partitions: int, time_zone: str | None = None,
                spark_conf: dict | None = None) -> dict:
    """Offline repartition of arrowstate state, as Spark 4.3's repartition does it for
    RocksDB: batch L+1 (after the last committed L) is recorded as a batch that reads no
    input, with `partitions` shuffle partitions, and every operator's state becomes, at its
    version L+2, the same rows hash-partitioned anew by their keys. The query then continues
    from L+2 with `partitions` partitions.

    The order keeps a failure safe: offsets/L+1 first (until its commit exists Spark
    refuses to restart the query: an unfinished repartition), then the snapshots, then
    commits/L+1. After a failure, run the command again: it finishes the same batch.
    `spark_conf` configures the Spark it starts."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    stateful = [o for o in described["operators"] if o["engine"] != "none"]
    theirs = [o for o in stateful if o["engine"] != ARROWSTATE]
    if theirs:
        raise CheckpointError(
            f"{checkpoint}: operator {theirs[0]['operator_id']} holds {theirs[0]['engine']} "
            "state; this command repartitions checkpoints whose state is all arrowstate's "
            "(Spark's own repartition handles RocksDB state)")
    if not stateful or last is None:
        raise CheckpointError(f"{checkpoint}: no committed arrowstate state to repartition")
    if partitions < 1:
        raise CheckpointError(f"the number of partitions must be positive, not {partitions}")
    for o in stateful:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; only the default store is repartitioned")
        refuse_column_families(checkpoint, o, last)
    key = "spark.sql.shuffle.partitions"
    current = int(offset_conf(checkpoint, last).get(key, "0"))
    planned = planned_batch(checkpoint)
    if planned == last + 1 and int(offset_conf(checkpoint, planned).get(key, "0")) == partitions \
            and current != partitions:
        pass   # an unfinished run of this command: finish it
    else:
        refuse_running(checkpoint, last)
        if current == partitions:
            return {"checkpoint": described["checkpoint"], "repartitioned": [],
                    "message": f"the state already has {partitions} partitions: nothing to do"}
        write_log_entry(os.path.join(checkpoint, "offsets", str(last + 1)),
                        offsets_with_conf(checkpoint, last, {key: str(partitions)}))
    version = last + 2
    state_root = files_for(checkpoint).absolute(os.path.join(checkpoint, "state"))
    done = []
    with conversion_session("arrowstate state repartition", {},
                            spark_conf=spark_conf) as (spark, _):
        zone = time_zone or spark.conf.get("spark.sql.session.timeZone")
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.tools.StateConversion
        for o in stateful:
            job = OperatorJob(spark, conversion, checkpoint, state_root, o, last, version,
                              partitions, {}, zone)
            counts = operator_layout(checkpoint, o).repartition_operator(job)
            done.append({"operator_id": o["operator_id"], "version": version,
                         "rows": list(counts)})
    commit = files_for(checkpoint).read_text(os.path.join(checkpoint, "commits", str(last)))
    write_log_entry(os.path.join(checkpoint, "commits", str(last + 1)), commit)
    return {"checkpoint": described["checkpoint"], "repartitioned": done,
            "message": f"batch {last + 1} repartitions the state from {current} to "
                       f"{partitions} partitions"}
