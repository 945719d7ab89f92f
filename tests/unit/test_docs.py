"""The user docs keep up with contract.json: every declared setting, metric and error
condition is documented, the generated tables are the current ones, and every relative link
in docs/ and the README leads to a file that exists."""
import glob
import os
import re

from arrowstate import contract

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")

# [text](target): the target up to a space (a title) or the closing parenthesis
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _doc(name: str) -> str:
    return _read(os.path.join(DOCS, name))


def _missing(names, text: str, form: str = "{}") -> list:
    return [n for n in names if form.format(n) not in text]


def test_every_declared_setting_is_documented():
    missing = _missing(list(contract.SETTINGS), _doc("settings.md"),
                       "`{}`")
    assert missing == [], f"docs/settings.md does not document settings {missing}"


def test_every_declared_error_condition_has_its_own_section():
    """Each of arrowstate's conditions: what it means and what to do, under its own title."""
    missing = _missing(contract.ERRORS, _doc("troubleshooting.md"), "### `{}`")
    assert missing == [], (f"docs/troubleshooting.md has no section (### `CONDITION`) for "
                           f"error conditions {missing}")


def test_every_declared_metric_is_documented():
    missing = _missing(list(contract.METRICS), _doc("metrics.md"),
                       "`{}`")
    assert missing == [], f"docs/metrics.md does not document metrics {missing}"


def test_the_generated_tables_are_the_declared_ones():
    for page, table, name in [("settings.md", contract.settings_table(), "settings_table"),
                              ("metrics.md", contract.metrics_table(), "metrics_table"),
                              ("troubleshooting.md", contract.errors_table(), "errors_table")]:
        assert table in _doc(page), (
            f"docs/{page}'s table differs from contract.json; paste "
            f"`python -c 'import arrowstate.contract as c; print(c.{name}())'`")


def _relative_links(path: str) -> list:
    text = FENCE.sub("", _read(path))   # code blocks hold no links
    targets = [t for t in LINK.findall(text)
               if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]
    return [t.split("#", 1)[0] for t in targets]


def test_every_relative_link_leads_to_a_file_that_exists():
    pages = sorted(glob.glob(os.path.join(DOCS, "*.md"))) + [README]
    broken = [f"{os.path.relpath(page, ROOT)}: {target}"
              for page in pages for target in _relative_links(page)
              if not os.path.exists(os.path.join(os.path.dirname(page), target))]
    assert broken == [], f"links to files that do not exist: {broken}"
    assert _relative_links(README), "the README links to no docs page"


def _named_in(text: str, rel: str) -> bool:
    """Whether architecture.md names a module: by its path, or by its file name on a line
    that names its folder (`store/formats/`: `files.py`, ...)."""
    folder, _, name = rel.rpartition("/")
    if f"`{rel}`" in text or f"`{rel} " in text or f"`{rel}(" in text:
        return True
    named = re.compile(r"`" + re.escape(name) + r"[` (]")
    return any(named.search(line) and (not folder or f"{folder}/" in line)
               for line in text.splitlines())


def test_architecture_names_every_source_module():
    """docs/architecture.md is the map of the house: every Python module and Scala file
    appears in it, so a newcomer finds each file's concern there."""
    import pathlib
    with open(os.path.join(DOCS, "architecture.md")) as f:
        text = f.read()
    python = pathlib.Path(ROOT, "python", "arrowstate")
    scala = pathlib.Path(ROOT, "jvm-shim", "src", "main", "scala", "org", "apache", "spark",
                         "sql", "arrowstate")
    modules = [p.relative_to(python).as_posix() for p in python.rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts]
    modules += [p.relative_to(scala).as_posix() for p in scala.rglob("*.scala")]
    missing = [m for m in sorted(modules) if not _named_in(text, m)]
    assert not missing, f"docs/architecture.md does not name {missing}"
