"""The JVM shim's sub-packages form a layered graph: no package reaches, through any chain
of others, back to itself, and each depends only on packages below it in the layers
docs/architecture.md names ("The JVM's layers"); within a package, no file reaches back to
itself through the others. Read from the Scala sources alone, no Spark.

A file depends on a sub-package when it imports from it (grouped or not, at any depth),
names one of its members by a fully qualified name in code, or, where its package clauses
put the root package in scope (`package org.apache.spark.sql.arrowstate` then
`package tools`, or a file of the root package itself), names it relatively (`store.X`).
A file depends on another file of its own package when it names a class, trait, object or
type that file defines at its top level (no import needed there)."""
import os
import re

ROOT_PACKAGE = "org.apache.spark.sql.arrowstate"
ROOT = "(root)"   # the graph's name for the root package itself (the extension entry points)
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "..", "..", "jvm-shim", "src", "main", "scala",
                       *ROOT_PACKAGE.split("."))
ARCHITECTURE = os.path.join(HERE, "..", "..", "docs", "architecture.md")

_CODE_NOISE = re.compile(
    r'"""(?:.|\n)*?"""'                      # triple-quoted strings
    r'|"(?:\\.|[^"\\\n])*"'                  # strings
    r"|'(?:\\.|[^'\\\n])'"                   # characters
    r"|//[^\n]*"                             # line comments
    r"|/\*(?:.|\n)*?\*/")                    # block comments (doc comments too)
_PACKAGE_CLAUSE = re.compile(r"^\s*package\s+([\w.]+)\s*$", re.MULTILINE)
_IMPORT = re.compile(r"^\s*import\s+(.+)$", re.MULTILINE)
_TOP_LEVEL_DEFINITION = re.compile(
    r"^(?:(?:private|protected)(?:\[\w+\])?\s+|(?:final|sealed|abstract|case|implicit)\s+)*"
    r"(?:class|trait|object|type)\s+(\w+)", re.MULTILINE)
_QUALIFIED = re.compile(r"(?<![\w.])(?:_root_\.)?" + re.escape(ROOT_PACKAGE) +
                        r"\.(\w+)")


def code_of(text):
    """The source without comments and string literals (kept as spaces, lines kept)."""
    return _CODE_NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def package_of(code):
    """The file's package, its clauses joined, and whether the root package is in scope
    (so that its sub-packages can be named relatively)."""
    clauses = _PACKAGE_CLAUSE.findall(code)
    name = ".".join(clauses)
    root_in_scope = any(".".join(clauses[:i + 1]) == ROOT_PACKAGE for i in range(len(clauses)))
    return name, root_in_scope


def node_of(package):
    """The graph node of a package: the sub-package of the root it lies in."""
    if package == ROOT_PACKAGE:
        return ROOT
    assert package.startswith(ROOT_PACKAGE + "."), package
    return package[len(ROOT_PACKAGE) + 1:].split(".")[0]


def _split_top(text, sep=","):
    """`text` split at `sep` outside braces."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c == "{"
        depth -= c == "}"
        if c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _imported_paths(clause):
    """The dotted paths an import clause reaches: `a.b.{C, D => E, _}` gives a.b.C, a.b.D, a.b._."""
    paths = []
    for part in _split_top(clause):
        part = re.sub(r"\s+", "", part)
        if "{" in part:
            prefix, selectors = part.split("{", 1)
            for selector in selectors.rstrip("}").split(","):
                paths.append(prefix + selector.split("=>")[0])
        elif part:
            paths.append(part)
    return paths


def dependencies(code, subpackages):
    """{sub-package node: [why]} that this file's code uses (its own package included)."""
    _, root_in_scope = package_of(code)
    imports = [path for m in _IMPORT.finditer(code) for path in _imported_paths(m.group(1))]
    # `import org.apache.spark.sql.arrowstate._` brings the sub-packages into scope as well
    root_in_scope = root_in_scope or ROOT_PACKAGE + "._" in imports
    found = {}

    def use(path, why):
        path = path.replace("_root_.", "", 1)
        if path.startswith(ROOT_PACKAGE + "."):
            head = path[len(ROOT_PACKAGE) + 1:].split(".")[0]
            node = head if head in subpackages else ROOT
        elif root_in_scope and path.split(".")[0] in subpackages:
            node = path.split(".")[0]
        else:
            return
        found.setdefault(node, []).append(why)

    for path in imports:
        use(path, f"import {path}")
    code_only = _IMPORT.sub("", _PACKAGE_CLAUSE.sub("", code))
    for match in _QUALIFIED.finditer(code_only):
        use(match.group(0), f"names {match.group(0)}")
    if root_in_scope:
        # a sub-package named relatively (`store.StateFiles`: its members are capitalised,
        # unlike a local value's, `worker.requestState`)
        for name in subpackages:
            for match in re.finditer(r"(?<![\w.])" + re.escape(name) + r"\.[A-Z]\w*", code_only):
                found.setdefault(name, []).append(f"names {match.group(0)}")
    return found


def read_sources(root=SOURCES):
    """{path relative to root: source text} of every .scala file under it (the root package's
    directory: no source of the shim lies outside it)."""
    sources = {}
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(".scala"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    sources[os.path.relpath(path, root)] = f.read()
    return sources


def package_graph(sources):
    """{node: {node it depends on: [(file, why)]}} between the root's sub-packages."""
    codes = {path: code_of(text) for path, text in sources.items()}
    packages = {path: package_of(code)[0] for path, code in codes.items()}
    subpackages = {node_of(p) for p in packages.values()} - {ROOT}
    graph = {}
    for path, code in codes.items():
        node = node_of(packages[path])
        edges = graph.setdefault(node, {})
        for target, whys in dependencies(code, subpackages).items():
            if target != node:
                edges.setdefault(target, []).extend((path, why) for why in whys)
    return graph


def file_graph(sources):
    """{file: {file of the same package it depends on: [(file, why)]}}: a file names a
    definition another file of its package makes at the top level (by its simple name, not
    after a dot: `x.Name` is some other thing's member)."""
    codes = {path: code_of(text) for path, text in sources.items()}
    packages = {path: package_of(code)[0] for path, code in codes.items()}
    defined = {path: set(_TOP_LEVEL_DEFINITION.findall(code)) for path, code in codes.items()}
    graph = {}
    for path, code in codes.items():
        body = _IMPORT.sub("", _PACKAGE_CLAUSE.sub("", code))
        edges = graph.setdefault(path, {})
        for other in codes:
            if other == path or packages[other] != packages[path]:
                continue
            for name in sorted(defined[other] - defined[path]):
                if re.search(r"(?<![\w.])" + re.escape(name) + r"\b", body):
                    edges.setdefault(other, []).append((path, f"names {name}"))
    return graph


def find_cycles(graph):
    """Per group of nodes that reach each other (a strongly connected component): the group,
    sorted, and one cycle through it (a list of nodes, its first repeated last). Empty for a
    layered graph."""
    reach = {node: {node} for node in graph}
    changed = True
    while changed:   # the transitive closure: a few dozen nodes at most
        changed = False
        for node in graph:
            more = set().union(*(reach.get(t, {t}) for t in graph[node])) - reach[node]
            if more:
                reach[node] |= more
                changed = True
    cycles, seen = [], set()
    for node in sorted(graph):
        group = {n for n in reach[node] if node in reach.get(n, ())}
        if len(group) > 1 and node not in seen:
            seen |= group
            cycles.append((sorted(group), find_cycle(
                {n: {t: e for t, e in graph[n].items() if t in group} for n in group})))
    return cycles


def find_cycle(graph):
    """One cycle of the graph as a list of nodes (first repeated last), or None."""
    state = {}   # node -> "open" while on the path, "done" after

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":   # on the path to here: the way round
                return path[path.index(target):] + [node, target]
            if target not in state:
                cycle = visit(target, path + [node])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def describe_cycle(graph, cycle):
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        file, why = graph[a][b][0]
        more = len(graph[a][b]) - 1
        lines.append(f"  {a} -> {b}: {file} {why}" + (f" (and {more} more)" if more else ""))
    return "\n".join(lines)


def documented_layers(path=ARCHITECTURE):
    """{node: layer number} from the table under "## The JVM's layers" in architecture.md
    (first column the layer, bottom 1; second the package, in backquotes)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert "## The JVM's layers" in text, "docs/architecture.md has no section The JVM's layers"
    section = text.split("## The JVM's layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for row in re.finditer(r"^\|\s*(\d+)\s*\|\s*`([\w()]+)/?`", section, re.MULTILINE):
        layers[row.group(2)] = int(row.group(1))
    return layers


# --- the shim ----------------------------------------------------------------------------

def test_the_jvm_sub_packages_import_each_other_in_no_cycle():
    graph = package_graph(read_sources())
    # the reading found the packages and their imports (a parser that saw nothing passes nothing)
    assert {"contract", "errors", "worker", "exec", "families", "planning"} <= set(graph)
    assert "contract" in graph["worker"] and "planning" in graph[ROOT]
    cycles = find_cycles(graph)
    assert cycles == [], "the JVM sub-packages import each other in circles:\n" + \
        "\n".join(f"{', '.join(group)} reach each other, as in {describe_cycle(graph, cycle)}"
                  for group, cycle in cycles)


def test_the_files_of_each_jvm_package_name_each_other_in_no_cycle():
    graph = file_graph(read_sources())
    # the reading found the files' uses of each other
    assert os.path.join("planning", "FamilyRegistry.scala") in graph[
        os.path.join("planning", "ArrowStateOverrides.scala")]
    cycles = find_cycles(graph)
    assert cycles == [], "files of one package name each other in circles:\n" + \
        "\n".join(f"{', '.join(group)} reach each other, as in {describe_cycle(graph, cycle)}"
                  for group, cycle in cycles)


def test_each_jvm_sub_package_depends_only_on_layers_below_it():
    graph = package_graph(read_sources())
    layers = documented_layers()
    undocumented = sorted(set(graph) - set(layers))
    assert undocumented == [], f"docs/architecture.md's JVM layers name no layer for {undocumented}"
    upward = [f"{a} (layer {layers[a]}) -> {b} (layer {layers[b]}): {edges[b][0][0]} "
              f"{edges[b][0][1]}"
              for a, edges in sorted(graph.items()) for b in sorted(edges)
              if layers[b] >= layers[a]]
    assert upward == [], "dependencies that do not point to a lower layer:\n" + "\n".join(upward)


# --- the reading itself, on small sources -------------------------------------------------

def _graph(**files):
    return package_graph({f"{name}.scala": text for name, text in files.items()})


def test_grouped_qualified_and_relative_uses_are_all_read():
    graph = _graph(
        a="package org.apache.spark.sql.arrowstate.a\n"
          "import org.apache.spark.sql.arrowstate.b.{B1, B2 => Renamed}\n"
          "import java.util.UUID, org.apache.spark.sql.arrowstate.c._\n",
        b="package org.apache.spark.sql.arrowstate.b\n"
          "object B1 { def x = _root_.org.apache.spark.sql.arrowstate.d.D.y }\n",
        c="package org.apache.spark.sql.arrowstate\npackage c\n"
          "object C { def x = d.D.y }\n",
        d="package org.apache.spark.sql.arrowstate.d\n"
          "import org.apache.spark.sql.arrowstate.{e, ArrowStateExtensions}\n",
        e="package org.apache.spark.sql.arrowstate.e\nobject E\n",
        root="package org.apache.spark.sql.arrowstate\nobject R { def x = e.E }\n")
    assert {k: sorted(v) for k, v in graph.items()} == {
        "a": ["b", "c"], "b": ["d"], "c": ["d"], "d": [ROOT, "e"], "e": [], ROOT: ["e"]}
    # d imports the root (ArrowStateExtensions) and the root names e: no cycle through d
    assert find_cycle(graph) is None


def test_comments_strings_and_other_roots_are_not_uses():
    graph = _graph(
        a="package org.apache.spark.sql.arrowstate.a\n"
          "// import org.apache.spark.sql.arrowstate.b.B\n"
          "/** see org.apache.spark.sql.arrowstate.b.B and b.B */\n"
          'object A { val s = "org.apache.spark.sql.arrowstate.b.B"; val t = b.B }\n'
          "import org.apache.spark.sql.arrowstatex.b.B\n",
        b="package org.apache.spark.sql.arrowstate.b\nobject B\n")
    # `b.B` is not visible in a, whose single package clause leaves the root out of scope
    assert graph == {"a": {}, "b": {}}


def test_a_cycle_is_found_and_named_with_its_files():
    graph = _graph(
        x="package org.apache.spark.sql.arrowstate.x\n"
          "import org.apache.spark.sql.arrowstate.y.Y\n",
        y="package org.apache.spark.sql.arrowstate.y\n"
          "import org.apache.spark.sql.arrowstate.z.Z\n",
        z="package org.apache.spark.sql.arrowstate.z\n"
          "object Z { def w = org.apache.spark.sql.arrowstate.x.X }\n")
    cycle = find_cycle(graph)
    assert cycle == ["x", "y", "z", "x"]
    assert find_cycles(graph) == [(["x", "y", "z"], cycle)]
    text = describe_cycle(graph, cycle)
    assert text.splitlines()[0] == "x -> y -> z -> x"
    assert "z -> x: z.scala names org.apache.spark.sql.arrowstate.x" in text
    # two separate circles are both named
    graph["w"] = {"v": [("w.scala", "import v.V")]}
    graph["v"] = {"w": [("v.scala", "import w.W")]}
    assert find_cycles(graph) == [(["v", "w"], ["v", "w", "v"]), (["x", "y", "z"], cycle)]


def test_a_cycle_between_files_of_one_package_is_found():
    graph = file_graph({
        "p/A.scala": "package org.apache.spark.sql.arrowstate.p\n"
                     "private[p] object A { def x = B.y }\n",
        "p/B.scala": "package org.apache.spark.sql.arrowstate.p\n"
                     "case class B(c: C)\nobject B { def y = 1 }\n",
        "p/C.scala": "package org.apache.spark.sql.arrowstate.p\n"
                     "sealed trait C { def a = A.x }\n",
        # a file of another package, a member named after a dot, a comment: none is a use
        "q/D.scala": "package org.apache.spark.sql.arrowstate.q\nobject D { def a = A.x }\n",
        "p/E.scala": "package org.apache.spark.sql.arrowstate.p\n"
                     "object E { def a = other.A.x } // B\n"})
    assert {k: sorted(v) for k, v in graph.items()} == {
        "p/A.scala": ["p/B.scala"], "p/B.scala": ["p/C.scala"], "p/C.scala": ["p/A.scala"],
        "q/D.scala": [], "p/E.scala": []}
    cycles = find_cycles(graph)
    assert [group for group, _ in cycles] == [["p/A.scala", "p/B.scala", "p/C.scala"]]
    assert "p/B.scala -> p/C.scala: p/B.scala names C" in describe_cycle(graph, cycles[0][1])
