"""The JVM <-> Python contract, loaded from `contract.json` (the shim loads the same file).

Frame tags, header fields, metric names, file names and settings are declared there once;
this module exposes them to the Python side.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_SPEC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "contract.json").read_text(encoding="utf-8"))

PROTOCOL_VERSION: int = _SPEC["protocolVersion"]
FRAMES: dict[str, int] = dict(_SPEC["frames"])
HEADER_FIELDS: tuple[str, ...] = tuple(_SPEC["header"])
STORE_CONF: dict[str, str] = dict(_SPEC["storeConf"])
FILES: dict[str, str] = dict(_SPEC["files"])
FAMILIES: dict[str, dict[str, Any]] = dict(_SPEC["families"])
METRICS: dict[str, dict[str, Any]] = {m["name"]: m for m in _SPEC["metrics"]}
SETTINGS: dict[str, dict[str, Any]] = {s["key"]: s for s in _SPEC["settings"]}
ERRORS: dict[str, dict[str, Any]] = {k: v for k, v in _SPEC["errors"].items()
                                     if not k.startswith("_")}


def python_metrics(family: str) -> frozenset[str]:
    """The metric names the Python worker may report for operators of `family`."""
    return frozenset(
        name for name, m in METRICS.items()
        if m["reportedBy"] in ("python", "both") and family in m.get("families", [family]))


def check_reported(family: str, reported: dict[str, int]) -> None:
    """Fails on a metric the contract does not let Python report for this family."""
    unknown = set(reported) - python_metrics(family)
    if unknown:
        raise RuntimeError(
            f"arrowstate: the worker reports metrics {sorted(unknown)} that contract.json "
            f"does not declare for family {family!r}")


def settings_table() -> str:
    """The README's settings table, generated from the declaration."""
    lines = ["| key | default | read | meaning |", "| --- | --- | --- | --- |"]
    for s in _SPEC["settings"]:
        read = "per session" if s["scope"] == "session" else "at startup"
        lines.append(f"| `{s['key']}` | {s['default']} | {read} | {s['doc']} |")
    return "\n".join(lines)


def metrics_table() -> str:
    """The README's metrics table, generated from the declaration."""
    lines = ["| metric | whose | unit | families | meaning |", "| --- | --- | --- | --- | --- |"]
    for m in _SPEC["metrics"]:
        families = ", ".join(m.get("families", ["all"]))
        lines.append(f"| `{m['name']}` | {m['owner']} | {m['unit']} | {families} | "
                     f"{m['description']} |")
    return "\n".join(lines)
