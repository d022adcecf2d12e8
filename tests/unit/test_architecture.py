"""The house stays one-way: no module of batchline imports itself back through others, and
the rooms (top-level packages and modules) form no cycle either. Imports under
``TYPE_CHECKING`` and inside functions count: they are dependencies all the same."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "batchline"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """batchline module -> the batchline modules it names in an import."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "batchline"


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Rooms are the top-level packages and modules; the package's own __init__ (the public
    face, which imports from every room) stands above them all."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "batchline":
            continue
        rooms.setdefault(_room(module), set()).update(
            _room(t) for t in targets if t != "batchline" and _room(t) != _room(module))
    return rooms


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph.get(a, ())) if b in component]
    return "{" + ", ".join(component) + "}: " + "; ".join(edges)


def test_no_module_imports_itself_back():
    graph = import_graph()
    assert len(graph) > 40  # the parser found the package
    found = cycles(graph)
    assert not found, "import cycles among modules:\n" + "\n".join(_describe(c, graph) for c in found)


def test_rooms_import_one_way():
    rooms = room_graph(import_graph())
    found = cycles(rooms)
    assert not found, "import cycles among rooms:\n" + "\n".join(_describe(c, rooms) for c in found)


def test_the_stream_model_is_the_ground_floor():
    """Sources, state, recovery and the API build on the stream model, never the reverse; the
    scheduler knows the pipeline only through its own protocol. Sinks are plug-ins below the
    stream model: an output hands them a DataFrame and a ``BatchContext``, and they know
    nothing of streams, sources or state."""
    rooms = room_graph(import_graph())
    foundations = {"errors", "choices", "batch_time", "durations", "clock", "spark", "checkpoint", "scheduler",
                   "kafka_clients"}
    below_streams = foundations | {"sinks"}
    assert rooms["sinks"] <= foundations, rooms["sinks"] - foundations
    assert rooms["streams"] <= below_streams, rooms["streams"] - below_streams
    assert rooms["scheduler"] <= foundations, rooms["scheduler"] - foundations
    assert "api" not in rooms["recovery"] and "recovery" not in rooms["sources"] | rooms["state"]


def test_the_readme_s_code_map_lists_the_rooms_top_down():
    """The README's layout table says every row imports only rows below it: each package (and
    ``testing.py``) there imports only the rooms of the rows below it, and the foundations
    (``batchline/*.py``, the last row of the package) import no package."""
    rooms = room_graph(import_graph())
    table = re.findall(r"^\| `batchline/([a-z_]+)(?:/|\.py)` \|", (ROOT / "README.md").read_text(), re.MULTILINE)
    rows = [name for name in table if name != "__init__"]  # the public face: see room_graph
    foundations = {room for room in rooms if (PACKAGE / f"{room}.py").exists()} - set(rows)
    assert set(rows) == set(rooms) - foundations, "rooms missing from the README's table"
    for index, room in enumerate(rows):
        allowed = set(rows[index + 1:]) | foundations
        assert rooms[room] <= allowed, f"{room} imports {sorted(rooms[room] - allowed)}, above it in the table"
    for room in foundations:
        assert rooms[room] <= foundations, f"{room}.py imports {sorted(rooms[room] - foundations)}"


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "a -> b" in _describe(["a", "b", "c"], graph)


# A stateful operator keeps its part of each batch in one object per batch (``OperatorBatch``),
# in one map; its runtime holds nothing else keyed by batch time. Besides that map, only the
# DataFrames every stream keeps per batch (``StreamRuntime._generated``) are allowed.
_PER_BATCH_MAPS = {"_batches", "_generated"}
_BATCH_TIME_NAMES = {"batch_time", "time", "t"}
_KEYED_CALLS = {"add", "discard", "remove", "pop", "get", "setdefault"}


def _is_operator_class(cls: ast.ClassDef, module: str) -> bool:
    """An operator's runtime (a ``...Runtime`` class) or the fused path that works for it."""
    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in cls.bases]
    return cls.name.endswith("Runtime") or any(b.endswith("Runtime") for b in bases) or module == "in_output_job"


def batch_keyed_attributes(source: str, module: str) -> dict[str, set[str]]:
    """Per operator class in ``source``: the attributes of ``self`` that it indexes, tests or
    updates by a batch time (``self.x[batch_time]``, ``batch_time in self.x``,
    ``self.x.add(batch_time)``, ...), other than the one per-batch map."""
    found: dict[str, set[str]] = {}
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef) or not _is_operator_class(cls, module):
            continue
        for node in ast.walk(cls):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Subscript):
                pairs.append((node.value, node.slice))
            elif isinstance(node, ast.Compare):
                pairs += [(right, node.left) for op, right in zip(node.ops, node.comparators, strict=True)
                          if isinstance(op, ast.In | ast.NotIn)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr in _KEYED_CALLS:
                    pairs.append((node.func.value, node.args[0]))
            for target, key in pairs:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self" and isinstance(key, ast.Name)
                        and key.id in _BATCH_TIME_NAMES and target.attr not in _PER_BATCH_MAPS):
                    found.setdefault(cls.name, set()).add(target.attr)
    return found


def test_an_operator_keeps_its_part_of_a_batch_in_one_object():
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "state").glob("*.py")):
        for cls, attributes in batch_keyed_attributes(path.read_text(), path.stem).items():
            found[f"{path.stem}.{cls}"] = attributes
    assert not found, ("attributes keyed by batch time besides the per-batch map (keep a batch's part in "
                       f"OperatorBatch): {found}")


def test_the_batch_key_finder_finds_a_batch_keyed_set():
    source = '''
class LeakyRuntime(StreamRuntime):
    def __init__(self):
        self._skipped = set()
        self._batches = {}

    def skip(self, batch_time):
        self._skipped.add(batch_time)
        self._batches[batch_time] = 1

    def has_rows(self, batch_time):
        return batch_time not in self._skipped
'''
    assert batch_keyed_attributes(source, "stateful") == {"LeakyRuntime": {"_skipped"}}


def test_every_input_is_a_source():
    """The engine's input contract (``InputNode``/``InputRuntime``) has one implementation,
    the one that runs a ``Source``: no input, built-in or a user's, implements it itself."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in cls.bases}
                if bases & {"InputNode", "InputRuntime"}:
                    found.append(f"{_module_name(path)}.{cls.name}")
    assert found == ["batchline.sources.source_input.SourceInput", "batchline.sources.source_input.SourceReader"]
