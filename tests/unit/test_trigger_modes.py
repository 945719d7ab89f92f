"""Trigger modes are declared once per family, in its Scala object (`modes = TriggerModes(...)`),
and the trigger mode of a node has one definition (exec/TriggerMode.scala): read from the
Scala sources alone, no Spark. (tests/jvm/unit/TriggerModesTests.scala checks the same
declarations against Spark's real-time allowlist, EXPLAIN's reasons and the contract.)"""
import json
import os
import re

from test_jvm_layers import SOURCES, code_of, read_sources

HERE = os.path.dirname(os.path.abspath(__file__))
OPERATORS_DOC = os.path.join(HERE, "..", "..", "docs", "operators.md")
CONTRACT = os.path.join(HERE, "..", "..", "python", "arrowstate", "contract.json")
_FAMILY = re.compile(r"^object\s+(\w+)\s+extends\s+ArrowStateFamily\b", re.MULTILINE)
_TOP_LEVEL = re.compile(r"^\S", re.MULTILINE)


def declared_modes(sources):
    """{family name: {"microBatch": "Runs" | "StaysSpark", "realTime": ...}} from each
    `object ... extends ArrowStateFamily` and its `modes` declaration."""
    found = {}
    for path, text in sources.items():
        code = code_of(text)
        for match in _FAMILY.finditer(code):
            end = _TOP_LEVEL.search(code, match.end())
            span = slice(match.end(), end.start() if end else None)
            body = code[span]
            # (the name from the source: code_of blanks strings, keeping every offset)
            name = re.search(r'\boverride\s+val\s+name\s*=\s*"(\w+)"', text[span])
            assert name, f"{path}: {match.group(1)} has no `override val name = \"...\"`"
            modes = {mode: kind for mode, kind in re.findall(
                r"\b(microBatch|realTime)\s*=\s*(Runs|StaysSpark)\b", body)}
            assert set(modes) == {"microBatch", "realTime"}, (
                f"{path}: {match.group(1)} declares no `modes = TriggerModes(microBatch = ..., "
                f"realTime = ...)` (found {modes})")
            found[name.group(1)] = modes
    return found


def real_time_table(path=OPERATORS_DOC):
    """The rows of the table under "### Real-time mode" in operators.md, as cell lists."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Real-time mode", 1)[1].split("\n#", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_family_declares_both_trigger_modes():
    with open(CONTRACT, encoding="utf-8") as f:
        families = {k for k in json.load(f)["families"] if not k.startswith("_")}
    modes = declared_modes(read_sources())
    assert set(modes) == families, "the Scala families and contract.json's differ"
    assert any(m["realTime"] == "Runs" for m in modes.values())


def test_operators_doc_lists_the_nodes_of_the_families_that_run_in_real_time_mode():
    with open(CONTRACT, encoding="utf-8") as f:
        nodes = {name: f["node"] for name, f in json.load(f)["families"].items()
                 if not name.startswith("_")}
    modes = declared_modes(read_sources())
    running = {nodes[name] for name, m in modes.items() if m["realTime"] == "Runs"}
    rows = real_time_table()
    listed = {node for row in rows for node in re.findall(r"`(Arrow\w+)`", row[-1])}
    assert listed == running, (
        "docs/operators.md's real-time table lists other nodes than the families that run in "
        f"real-time mode: {sorted(listed)} against {sorted(running)}")


def test_the_trigger_mode_of_a_node_has_one_definition():
    """Only exec/TriggerMode.scala reads whether a plan is real-time (Spark's real-time scan
    in it); no family exec carries a flag of its own."""
    readers = sorted(path for path, text in read_sources().items()
                     if "RealTimeStreamScanExec" in code_of(text))
    assert readers == [os.path.join("exec", "TriggerMode.scala")], readers
    flags = sorted(path for path, text in read_sources().items()
                   if path.startswith("families") and
                   re.search(r"\brealTime\s*:\s*Boolean", code_of(text)))
    assert flags == [], f"family files with a real-time flag: {flags}"


def test_the_reading_finds_declarations_and_their_absence():
    runs = ('object AFamily extends ArrowStateFamily {\n  override val name = "a"\n'
            '  override val modes = TriggerModes(\n    microBatch = Runs(classOf[X]),\n'
            '    realTime = StaysSpark("why"))\n}\n')
    assert declared_modes({"A.scala": runs}) == {
        "a": {"microBatch": "Runs", "realTime": "StaysSpark"}}
    missing = 'object BFamily extends ArrowStateFamily {\n  override val name = "b"\n}\n'
    try:
        declared_modes({"B.scala": missing})
    except AssertionError as e:
        assert "BFamily declares no `modes" in str(e)
    else:
        raise AssertionError("a family without modes was not noticed")
    assert os.path.isdir(SOURCES)
