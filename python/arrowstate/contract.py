"""The JVM <-> Python contract, loaded from `contract.json` (the shim loads the same file).

Frame tags, header fields, metric names, file names and settings are declared there once;
this module exposes them to the Python side.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable, NamedTuple

import fastjsonschema

from .errors import ArrowStateError

_SPEC: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "contract.json").read_text(encoding="utf-8"))

PROTOCOL_VERSION: int = _SPEC["protocolVersion"]


class Frame(NamedTuple):
    """A frame: its tag and the (name, type) fields of its body as each side sends it
    (None: that side never sends it) and of the JVM's reply to it (tagged with the
    request's tag)."""
    name: str
    tag: int
    from_jvm: tuple[tuple[str, str], ...] | None
    from_python: tuple[tuple[str, str], ...] | None
    reply: tuple[tuple[str, str], ...] | None


def _fields(spec: dict, side: str) -> tuple[tuple[str, str], ...] | None:
    return None if side not in spec else tuple((n, t) for n, t in spec[side])


FRAME_SPECS: dict[str, Frame] = {
    name: Frame(name, f["tag"], _fields(f, "fromJvm"), _fields(f, "fromPython"),
                _fields(f, "reply"))
    for name, f in _SPEC["frames"].items()}
FRAMES: dict[str, int] = {name: f.tag for name, f in FRAME_SPECS.items()}
FRAME_TYPES: tuple[str, ...] = tuple(_SPEC["frameTypes"])
PAYLOADS: dict[str, dict[str, Any]] = dict(_SPEC["payloads"])
# what contract.json's schemas may use: the JVM's checker implements exactly these
SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties",
                             "items", "enum", "description", "x-payload"})
STORE_CONF: dict[str, str] = dict(_SPEC["storeConf"])
FILES: dict[str, str] = dict(_SPEC["files"])
FAMILIES: dict[str, dict[str, Any]] = dict(_SPEC["families"])
METRICS: dict[str, dict[str, Any]] = {m["name"]: m for m in _SPEC["metrics"]}
SETTINGS: dict[str, dict[str, Any]] = {s["key"]: s for s in _SPEC["settings"]}
# what each setting type accepts; the shim parses and refuses values by these
SETTING_TYPES: dict[str, str] = dict(_SPEC["settingTypes"])
ERRORS: dict[str, dict[str, Any]] = {k: v for k, v in _SPEC["errors"].items()
                                     if not k.startswith("_")}


CONTRACT_VIOLATION = "ARROWSTATE_CONTRACT_VIOLATION"


@functools.cache
def _validator(payload: str) -> Callable[[Any], Any]:
    return fastjsonschema.compile(PAYLOADS[payload])


def check_payload(payload: str, value: Any, at: str = "") -> None:
    """Fails, naming the field, when `value` does not match `payloads.<payload>`; a field
    whose schema names a payload of its own (`x-payload`, `{field}` filled from its
    siblings) is checked against that one too."""
    schema = PAYLOADS.get(payload)
    if schema is None:
        raise ArrowStateError(CONTRACT_VIOLATION, f"contract.json declares no payload "
                              f"{payload!r}", payload=payload, field=at, reason="undeclared")
    try:
        _validator(payload)(value)
    except fastjsonschema.JsonSchemaValueException as e:
        path = [str(x) for x in (e.path[1:] if e.path else [])]
        if e.rule == "required" and isinstance(e.value, dict):   # name the missing field
            path += [r for r in e.rule_definition if r not in e.value][:1]
        elif e.rule == "additionalProperties" and isinstance(e.value, dict):
            known = e.definition.get("properties", {})
            path += sorted(k for k in e.value if k not in known)[:1]
        field = ".".join([at] * bool(at) + path)
        raise ArrowStateError(
            CONTRACT_VIOLATION,
            f"the {payload} payload does not match contract.json at "
            f"{field or 'its top'}: {e.message}", payload=payload, field=field,
            reason=e.message) from None
    for name, nested in _nested_payloads(payload):
        if isinstance(value.get(name), dict):
            check_payload(nested.format(**value), value[name], f"{at}.{name}" if at else name)


@functools.cache
def _nested_payloads(payload: str) -> tuple[tuple[str, str], ...]:
    """The payload's fields checked against a payload of their own (`x-payload`)."""
    return tuple((name, sub["x-payload"])
                 for name, sub in PAYLOADS[payload].get("properties", {}).items()
                 if sub.get("x-payload"))


@functools.lru_cache(maxsize=None)
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


def setting_accepts(setting: dict[str, Any]) -> str:
    """What a setting accepts, in a few words (settings.md's table)."""
    kind = setting["type"]
    if kind == "boolean":
        return "`true` or `false`"
    if kind == "integer":
        low, high = setting.get("min"), setting.get("max")
        if low is not None and high is not None:
            return f"integer, {low} to {high}"
        return "integer" + (f", at least {low}" if low is not None else "") + (
            f", at most {high}" if high is not None else "")
    return {"size": "size (`512m`, `2g`, bytes)", "path": "path"}[kind]


def settings_table() -> str:
    """docs/settings.md's table, generated from the declaration."""
    lines = ["| key | accepts | default | read | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in _SPEC["settings"]:
        read = "per session" if s["scope"] == "session" else "at startup"
        lines.append(f"| `{s['key']}` | {setting_accepts(s)} | {s['default']} | {read} | "
                     f"{s['doc']} |")
    return "\n".join(lines)


def metrics_table() -> str:
    """docs/metrics.md's table, generated from the declaration."""
    lines = ["| metric | whose | unit | families | meaning |", "| --- | --- | --- | --- | --- |"]
    for m in _SPEC["metrics"]:
        families = ", ".join(m.get("families", ["all"]))
        lines.append(f"| `{m['name']}` | {m['owner']} | {m['unit']} | {families} | "
                     f"{m['description']} |")
    return "\n".join(lines)


def errors_table() -> str:
    """docs/troubleshooting.md's table of arrowstate's own error conditions, generated
    from the declaration."""
    lines = ["| condition | SQLSTATE | when |", "| --- | --- | --- |"]
    for name, e in ERRORS.items():
        lines.append(f"| `{name}` | {e['sqlState']} | {e['doc']} |")
    return "\n".join(lines)
