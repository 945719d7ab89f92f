"""Reading one run's results: ScalaTest's file report and JUnit XML, and a failure's first
line and the plugin's frames in it."""
from __future__ import annotations

import re
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

_DURATION = r"\((?:\d+ (?:hours?|minutes?|seconds?|milliseconds?)(?:, )?)+\)"


def parse_report(text: str) -> tuple[dict[str, dict], list[str]]:
    """ScalaTest's file reporter (-fWD): {test: {status, seconds?}}, and the abort notes."""
    tests: dict[str, dict] = {}
    aborts: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "*** ABORTED ***" in line or "*** RUN ABORTED ***" in line:
            aborts.append("\n".join(lines[i:i + 8]))
            continue
        if not line.startswith("- "):
            continue
        body = line[2:]
        seconds = None
        m = re.search(r" " + _DURATION + r"$", body)
        if m:
            seconds = _seconds(m.group(0))
            body = body[:m.start()]
        status = "passed"
        for note, st in (("*** FAILED ***", "failed"), ("!!! CANCELED !!!", "canceled"),
                         ("!!! IGNORED !!!", "ignored"), ("(pending)", "pending")):
            if body.endswith(" " + note):
                status, body = st, body[:-len(note) - 1]
                break
        entry = {"status": status}
        if seconds is not None:
            entry["seconds"] = seconds
        if status in ("failed", "canceled"):
            # the message (its first line indented by two spaces, the rest as it is) and
            # ScalaTest's short trace follow, up to the next test or the run's end
            msg = []
            for nxt in lines[i + 1:i + 3000]:
                if nxt.startswith("- ") or nxt.startswith("Run completed in ") or \
                        "*** ABORTED ***" in nxt:
                    break
                msg.append(nxt[2:] if not msg and nxt.startswith("  ") else nxt)
            if msg:
                entry["message"] = "\n".join(msg).strip("\n")
        tests[body] = entry
    return tests, aborts


def _seconds(duration: str) -> float:
    total = 0.0
    for n, unit in re.findall(r"(\d+) (hour|minute|second|millisecond)", duration):
        total += int(n) * {"hour": 3600, "minute": 60, "second": 1, "millisecond": 0.001}[unit]
    return round(total, 3)


def parse_junit(xml_dir: Path) -> dict[str, dict]:
    """Failure details from ScalaTest's JUnit XML: {test: {message, trace}} (the message as
    the trace's text has it, lines kept: the XML attribute has them joined)."""
    details: dict[str, dict] = {}
    for f in xml_dir.glob("*.xml"):
        try:
            root = ET.parse(f).getroot()
        except ET.ParseError:
            continue
        for tc in root.iter("testcase"):
            for child in tc:
                if child.tag in ("failure", "error"):
                    trace = textwrap.dedent((child.text or "").strip("\n"))
                    details[tc.get("name")] = {
                        "message": _trace_message(trace) or child.get("message") or "",
                        "trace": trace}
    return details


def _trace_message(trace: str) -> str:
    """The message at the head of a JUnit XML trace (up to its first frame)."""
    head = []
    for line in trace.splitlines():
        if re.match(r"^\s*at \S+\(.*\)$", line):
            break
        head.append(line)
    return "\n".join(head).strip("\n")


# a JVM frame or exception of the shim, a Python frame in arrowstate, a Python exception of it
PLUGIN_FRAME = re.compile(r"org\.apache\.spark\.sql\.arrowstate\.\S|/arrowstate/\S+\.py\b|"
                          r"^arrowstate\.[\w.]+: ")


def where(frames: list[str]) -> str | None:
    """The plugin's frame that tells most: the Python one that raised, else the first JVM."""
    py = [f for f in frames if re.search(r'File ".*/arrowstate/.*\.py"', f)]
    if py:
        return py[-1]
    jvm = [f for f in frames if f.startswith("at org.apache.spark.sql.arrowstate.")]
    return jvm[0] if jvm else (frames[0][:300] if frames else None)


def plugin_frames(text: str) -> list[str]:
    """The lines of a failure that name arrowstate (its JVM classes, its Python files)."""
    seen, out = set(), []
    for line in text.splitlines():
        s = line.strip()
        if PLUGIN_FRAME.search(s) and s not in seen and len(s) < 600:
            seen.add(s)
            out.append(s)
    return out[:20]


_PREFIXES = [
    r"^(?:org\.apache\.spark\.sql\.streaming\.StreamingQueryException|"
    r"org\.apache\.spark\.SparkException|org\.scalatest\.exceptions\.TestFailedException):"
    r" ?",
    r"^[\w.$]+(?:Exception|Error): (?=\[STREAM_FAILED\])",
    r"^\[STREAM_FAILED\] Query \[id = [^\]]*\] terminated with exception: ",
    r"^Job aborted due to stage failure: Task \S+ in stage \S+ failed \d+ times?, most recent "
    r"failure: Lost task \S+ in stage \S+ \(TID \d+\) \([^)]*\): ",
]


def first_line(text: str) -> str:
    """What a failure says, in a line: its message's first line less Spark's wrapping (the
    streaming query's, the failed job's), with the Python exception of a traceback and the
    step of a StreamTest that failed."""
    text = text or ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    line = lines[0] if lines else ""
    for _ in range(3):
        for p in _PREFIXES:
            line = re.sub(p, "", line)
    if not line and len(lines) > 1:   # 'SomeException: ' with the message on the next line
        line = lines[1]
    if "Traceback (most recent call last)" in text:
        after = text[text.index("Traceback (most recent call last)"):].splitlines()[1:]
        exc = next((x for x in after if x and not x[0].isspace()), None)
        if exc:
            line = f"{line.split('Traceback')[0].strip()} ... {exc.strip()}"
    step = re.search(r"^\s*=> (.+)$", text, re.M)
    if step and "== Progress ==" in text:
        line = f"{line} [failing step: {step.group(1).strip()}]"
    return line[:500]
