"""`python -m arrowstate state history`: per committed batch and stateful operator, the state
rows (total after the batch, updated and removed in it, as Spark's progress reports
numRowsTotal, numRowsUpdated and numRowsRemoved), the bytes of the operator's state files
and the batch's duration, read offline from the checkpoint alone (no Spark for a checkpoint
on the local disk).

Where each figure comes from:
- rows: arrowstate's delta of version N+1 (batch N commits state version N+1) records, per
  partition, the figures its task reported to Spark (store/files.py, `arrowstate.figures`);
  the operator's figure is their sum over partitions, as Spark sums its tasks'. Only the
  delta's trailer, checksum and Arrow schema are read, never its rows, and never a
  snapshot. Spark's own state store files (HDFS-backed, RocksDB) record no such figures:
  their rows are reported as not available, with the reason. Batches whose files
  `state export` or `import` moved aside (`arrowstate-exported-<v>/`,
  `spark-state-imported-<v>/`) are read from there.
- bytes on disk: the files a restart at that batch would load, summed over partitions: the
  newest snapshot at or below version N+1 and the deltas after it (arrowstate's files, or
  the HDFS-backed store's `.snapshot`/`.delta`). Not available once retention has pruned
  one of them, and for RocksDB (whose versions share SST files).
- duration: from the batch's start, the `batchTimestampMs` its offset log entry records
  (the trigger clock's time when Spark planned the batch), to its end, the time its commit
  log entry was written (the file's modification time: Spark's commit entry records no
  time). It covers planning, running and committing; a batch re-run after a restart counts
  from its first planning; a checkpoint copied without keeping file times has none. Object
  stores keep a file's time to the second (S3's Last-Modified): where every commit entry's
  time is a whole second, the commit is taken at the middle of what is left of its second
  after the batch's start, and the history says its durations are to within half a second
  (`timeResolutionMs`: 1000, else 1).
"""
from __future__ import annotations

import json
import os
import re

from ..store.formats import container, decoding, manifest, names as file_names
from .checkpoint_files import (ARROWSTATE, HDFS, MOVED_ASIDE, ROCKSDB, CheckpointError,
                               last_committed_batch, log_ids, operator_metadata,
                               planned_batch, committed_checkpoint_ids)
from .filesystems import files_for
from .inventory import FAMILIES, require_checkpoint

# Spark's progress names of the figures a delta records (container.STATE_FIGURES)
PROGRESS_NAMES = dict(zip(container.STATE_FIGURES,
                          ("numRowsTotal", "numRowsUpdated", "numRowsRemoved")))
_HDFS_NAME = re.compile(r"^(\d+)\.(delta|snapshot)$")
_ROCKSDB_NAME = re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(zip|changelog)$")
SPARK_STORE_NOTE = ("Spark's own state store files record no state figures: rows not "
                    "available (spark.read.format('statestore') reads the state itself)")


def _batch_timestamp(checkpoint: str, batch: int) -> int | None:
    """The batchTimestampMs offsets/`batch` records (None when it cannot be read)."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    try:
        lines = files_for(path).read_text(path).splitlines()
        return int(json.loads(lines[1])["batchTimestampMs"])
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None


class _Partition:
    """One partition directory's state files: per version, kind -> (file name, size)."""

    def __init__(self, where: str, ids: dict[int, str | None] | None = None) -> None:
        """`ids`: per version, the checkpoint id the commit log names for this partition
        (format v2): another attempt's files of a version are not the version's."""
        self.where = where
        self.ours: dict[int, dict[str, tuple[str, int]]] = {}
        self.hdfs: dict[int, dict[str, tuple[str, int]]] = {}
        self.rocksdb: set[int] = set()
        self.columns_bytes = 0   # the columns files small deltas name (formats.compact)
        self.run_bytes: dict[str, int] = {}   # the run files snapshots name (formats.manifest)
        self._snapshot_bytes: dict[int, int] = {}
        for name, size in files_for(where).file_sizes(where).items():
            if file_names.is_columns_file(name):
                self.columns_bytes += size
            if file_names.is_run_file(name):
                self.run_bytes[name] = size
            parsed = file_names.parse_name(name)
            hdfs = _HDFS_NAME.match(name)
            rocks = _ROCKSDB_NAME.match(name)
            attempt = file_names.checkpoint_id_of(name)
            if parsed is not None and (attempt is None or attempt == (ids or {}).get(parsed[0])):
                self.ours.setdefault(parsed[0], {})[parsed[1]] = (name, size)
            elif hdfs is not None:
                self.hdfs.setdefault(int(hdfs.group(1)), {})[hdfs.group(2)] = (name, size)
            elif rocks is not None:
                self.rocksdb.add(int(rocks.group(1)))

    def engine(self, version: int) -> str | None:
        if version in self.ours:
            return ARROWSTATE
        if version in self.hdfs:
            return HDFS
        return ROCKSDB if version in self.rocksdb else None

    def figures(self, version: int) -> dict | None:
        """The figures arrowstate's delta of `version` records (None: no delta, or one
        that records none)."""
        found = self.ours.get(version, {}).get(file_names.DELTA)
        if found is None:
            return None
        path = os.path.join(self.where, found[0])
        return decoding.recorded_figures(path, files_for(path).read_mapped(path))

    def _arrowstate_snapshot_bytes(self, version: int) -> int:
        """A snapshot's bytes: with the run files it names, for a manifest."""
        if version not in self._snapshot_bytes:
            name, size = self.ours[version][file_names.SNAPSHOT]
            if self.run_bytes:
                path = os.path.join(self.where, name)
                try:
                    made = manifest.read(path, "state history",
                                         files_for(path).read_mapped(path))
                except container.CorruptStateFile:
                    made = None   # a damaged snapshot: its own bytes
                if made is not None:
                    size += sum(self.run_bytes.get(n, 0) for n in made.names())
            self._snapshot_bytes[version] = size
        return self._snapshot_bytes[version]

    def chain_bytes(self, version: int, engine: str) -> int | None:
        """Bytes of the files that load `version`: the newest snapshot at or below it and
        the deltas after it, with the partition's columns files when a delta is among them;
        0 for a partition with no file at or below it; None when a file of the chain is
        gone."""
        files = {ARROWSTATE: self.ours, HDFS: self.hdfs}.get(engine)
        if files is None:
            return None
        if not any(v <= version for v in files):
            return 0
        total = 0
        schemas = self.columns_bytes if engine == ARROWSTATE else 0
        for v in range(version, 0, -1):
            kinds = files.get(v, {})
            if file_names.SNAPSHOT in kinds:
                snapshot = (self._arrowstate_snapshot_bytes(v) if engine == ARROWSTATE
                            else kinds[file_names.SNAPSHOT][1])
                return total + snapshot + (schemas if total else 0)
            if file_names.DELTA not in kinds:
                return None
            total += kinds[file_names.DELTA][1]
        return total + schemas


def _join(*notes) -> str | None:
    return "; ".join(n for n in notes if n) or None


def _operator_figures(partitions: list[_Partition], version: int,
                      aside: list[tuple[str, list[_Partition]]]) -> dict:
    """One operator's figures at state `version`, summed over its partitions; from files
    `state export` or `import` moved aside (`aside`: directory name, partitions) when the
    state directory has none of that version."""
    out = _figures_of(partitions, version, count_bytes=True)
    if out["engine"] is not None:
        return out
    for where, moved in aside:
        if any(p.engine(version) for p in moved):
            out = _figures_of(moved, version, count_bytes=False)
            out["note"] = _join(out["note"], f"files moved aside to {where}/ by state export "
                                "or import (bytes not counted: a restart does not load them)")
            return out
    out["note"] = ("no state files of this batch's version on disk (pruned by retention, or "
                   "the operator did not run in this batch)")
    return out


def _figures_of(partitions: list[_Partition], version: int, count_bytes: bool) -> dict:
    engines = {p.engine(version) for p in partitions} - {None}
    out = {"engine": "+".join(sorted(engines)) or None, **dict.fromkeys(
        PROGRESS_NAMES.values()), "bytesOnDisk": None, "note": None}
    if not engines:
        return out
    if engines == {ARROWSTATE}:
        recorded = [p.figures(version) for p in partitions if p.engine(version)]
        if any(r is None for r in recorded):
            out["note"] = ("some partitions' state of this version records no figures (a "
                           "snapshot written by `state import` or `repartition`, or deltas "
                           "of an arrowstate before state history)")
        else:
            for name, progress_name in PROGRESS_NAMES.items():
                out[progress_name] = sum(int(r.get(name, 0)) for r in recorded)
    else:
        out["note"] = SPARK_STORE_NOTE
    if not count_bytes:
        return out
    if engines == {ROCKSDB} or len(engines) > 1:
        out["note"] = _join(out["note"], "bytes not available for RocksDB (its versions "
                                         "share SST files)")
        return out
    sizes = [p.chain_bytes(version, next(iter(engines))) for p in partitions]
    if all(s is not None for s in sizes):
        out["bytesOnDisk"] = sum(sizes)
    else:
        out["note"] = _join(out["note"], "bytes not available: files this version loads "
                                         "from are not on disk (pruned by retention)")
    return out


def _partitions(op_dir: str, ids: dict[int, list] | None = None) -> list[_Partition]:
    """The operator's partitions; `ids`: per version, each partition's checkpoint id the
    commit log records (format v2)."""
    files = files_for(op_dir)
    names = files.listdir(op_dir) if files.isdir(op_dir) else []
    ids = ids or {}

    def of(p: int) -> dict[int, str | None]:
        return {v: found[p] for v, found in ids.items() if p < len(found)}
    return [_Partition(os.path.join(op_dir, n), of(int(n)))
            for n in sorted(names, key=lambda n: (len(n), n)) if n.isdigit()]


def history(checkpoint: str) -> dict:
    """Per committed batch and stateful operator, the figures the module's docstring
    describes; a checkpoint with no committed batch is a CheckpointError."""
    files = files_for(checkpoint)
    require_checkpoint(checkpoint)
    committed = log_ids(checkpoint, "commits")
    last = last_committed_batch(checkpoint)
    planned = planned_batch(checkpoint)
    uncommitted = [b for b in log_ids(checkpoint, "offsets") if last is None or b > last]
    if not committed:
        planned_text = (f" (batch {planned} is planned in offsets/{planned} but was never "
                        "committed)" if planned is not None else "")
        raise CheckpointError(f"{checkpoint}: no committed batch (commits/ is empty)"
                              f"{planned_text}: there is no history to show")
    state_root = os.path.join(checkpoint, "state")
    operators, partitions, aside = [], {}, {}
    moved_aside = sorted(n for n in files.listdir(checkpoint) if n.startswith(MOVED_ASIDE))
    for op in sorted(int(n) for n in files.listdir(state_root) if n.isdigit()) \
            if files.isdir(state_root) else []:
        op_dir = os.path.join(state_root, str(op))
        info = operator_metadata(op_dir)
        name = info["operatorInfo"]["operatorName"] if info is not None else "unknown"
        operators.append({"operatorId": op, "name": name, "family": FAMILIES.get(name)})
        partitions[op] = _partitions(op_dir, committed_checkpoint_ids(checkpoint, op))
        aside[op] = [(name, _partitions(os.path.join(checkpoint, name, "state", str(op))))
                     for name in moved_aside]
    ended = {b: files.modified_ms(os.path.join(checkpoint, "commits", str(b)))
             for b in committed}
    # a store that keeps file times to the second: the commit happened within that second
    resolution = 1000 if all(t % 1000 == 0 for t in ended.values()) else 1
    batches = []
    for batch in committed:
        started = _batch_timestamp(checkpoint, batch)
        duration = None
        if started is not None:
            # the commit is in [its time, its time + resolution) and not before the start:
            # the middle of what is left of that span
            earliest, latest = max(ended[batch], started), ended[batch] + resolution - 1
            if earliest <= latest:
                duration = (earliest + latest) // 2 - started
        batches.append({
            "batchId": batch, "batchTimestampMs": started, "committedAtMs": ended[batch],
            "durationMs": duration,
            "operators": [{"operatorId": o["operatorId"],
                           **_operator_figures(partitions[o["operatorId"]], batch + 1,
                                               aside[o["operatorId"]])}
                          for o in operators]})
    return {"checkpoint": files.absolute(checkpoint), "lastCommittedBatch": last,
            "uncommittedBatches": uncommitted, "operators": operators, "batches": batches,
            "timeResolutionMs": resolution}


def _cell(value) -> str:
    return "-" if value is None else str(value)


def format_history(h: dict) -> str:
    """The history as a text table: a line per batch and operator, notes after it."""
    lines = [f"checkpoint {h['checkpoint']} ({len(h['batches'])} committed batches, last "
             f"{h['lastCommittedBatch']})"]
    if h["uncommittedBatches"]:
        lines.append(f"  planned but not committed (not shown): batches "
                     f"{', '.join(map(str, h['uncommittedBatches']))}")
    names = {o["operatorId"]: o["name"] for o in h["operators"]}
    if not names:
        lines.append("  no stateful operators")
    duration = "duration ms" if h.get("timeResolutionMs", 1) == 1 else \
        f"duration ms (±{h['timeResolutionMs'] // 2})"
    header = ("batch", duration, "operator", "rows total", "updated", "removed",
              "bytes on disk")
    rows, notes = [], {}
    for b in h["batches"]:
        if not b["operators"]:
            rows.append((str(b["batchId"]), _cell(b["durationMs"]), "", "", "", "", ""))
        for i, o in enumerate(b["operators"]):
            mark = ""
            if o["note"]:
                mark = " *" + str(notes.setdefault(o["note"], len(notes) + 1))
            rows.append((str(b["batchId"]) if i == 0 else "",
                         _cell(b["durationMs"]) if i == 0 else "",
                         f"{o['operatorId']} {names[o['operatorId']]}{mark}",
                         _cell(o["numRowsTotal"]), _cell(o["numRowsUpdated"]),
                         _cell(o["numRowsRemoved"]), _cell(o["bytesOnDisk"])))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) if i == 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    lines += [f"*{n} {note}" for note, n in notes.items()]
    return "\n".join(lines)


PLOT_EXTRA = ("--plot needs matplotlib, which arrowstate installs as an optional extra: "
              "pip install 'arrowstate[plot]'")


def require_plotting() -> None:
    """A CheckpointError saying how to install the plot extra, when matplotlib is not
    importable."""
    try:
        import matplotlib   # noqa: F401
    except ImportError as e:
        raise CheckpointError(PLOT_EXTRA) from e


def plot_history(h: dict, path: str) -> None:
    """Draws rows, bytes on disk and duration over the batches into a PNG at `path`
    (matplotlib, the plot extra, off screen). Written whole or not at all."""
    require_plotting()
    import matplotlib
    matplotlib.use("Agg")   # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ids = [b["batchId"] for b in h["batches"]]
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(9, 10))
    panels = [("rows in state (total)", ("numRowsTotal",)),
              ("rows updated / removed", ("numRowsUpdated", "numRowsRemoved")),
              ("bytes on disk", ("bytesOnDisk",))]
    for ax, (title, keys) in zip(axes, panels):
        for n, o in enumerate(h["operators"]):   # one colour per operator in every panel
            for key in keys:
                values = [next((x[key] for x in b["operators"]
                                if x["operatorId"] == o["operatorId"]), None)
                          for b in h["batches"]]
                if any(v is not None for v in values):
                    label = f"{o['operatorId']} {o['name']}" + (
                        f" {key.removeprefix('numRows').lower()}" if len(keys) > 1 else "")
                    removed = key == "numRowsRemoved"
                    ax.plot(ids, [float("nan") if v is None else v for v in values],
                            color=f"C{n % 10}", marker="x" if removed else "o",
                            linestyle="--" if removed else "-", label=label)
        ax.set_title(title)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    axes[3].bar(ids, [0 if b["durationMs"] is None else b["durationMs"] for b in h["batches"]])
    axes[3].set_title("batch duration (ms)")
    axes[3].set_xlabel("batch")
    axes[3].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"state history of {h['checkpoint']}", fontsize="small")
    fig.tight_layout()
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.arrowstate-tmp")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write the plot: {e}") from e
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
