"""The import graph of the library and the tools on it: no cycles, and no module imports a layer above its own.

Every import counts, those inside functions too (a lazy import still ties the two modules together), and importing
a.b.c also runs a.b's __init__, so it counts as an arrow to a.b unless the importer sits inside a.b already."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("toolkit", "evaluation", "gui", "training")

# bottom to top; a module's layer is its longest prefix here. A module may import its own layer and those below.
LAYERS = [
    # torch-free leaves: settings, files, text, the progress bar, the weight type checks
    [
        "toolkit.params",
        "toolkit.fileio",
        "toolkit.text",
        "toolkit.progress",
        "toolkit.weights",
        "toolkit.audio",
        "toolkit.frontend",
        "toolkit.plan",
        "toolkit.textsets",
        "toolkit.sampling",
        "toolkit.speakers",
        "toolkit.refine",
    ],
    ["toolkit.models"],
    ["toolkit.runtime"],  # the torch-free edge runtime: the models' configs (torch-free; the package loads lazily)
    ["toolkit.checkpoint"],
    ["toolkit.decode", "toolkit.kernels", "toolkit.engine", "toolkit.prompt", "toolkit.streaming"],
    ["toolkit.precision"],
    # one synthesizer API and what is built on it (the package's own names load it)
    [
        "toolkit",
        "toolkit.synthesizer",
        "toolkit.sample_speaker",
        "toolkit.scheduler",
        "toolkit.batching",
        "toolkit.serving",
        "toolkit.quantize_job",
        "toolkit.export",
        "toolkit.bench",
    ],
    ["evaluation"],
    ["toolkit.cli", "toolkit.server", "gui"],  # entry points: `ttsq gui` starts the GUI, `ttsq serve` the server
    ["training"],  # the voice lab: reads the library and evaluation, nothing imports it
]
RANK = {prefix: i for i, layer in enumerate(LAYERS) for prefix in layer}


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for f in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else []:
            parts = list(f.relative_to(root).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in its file), package __init__s run on the way included."""
    mods = modules(root)

    def known(name: str) -> str | None:  # a.b.func -> a.b
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for m, f in mods.items():
        package = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets |= {
                    known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base) for a in node.names
                }
        edges = set()
        for t in targets - {None, m}:
            parts = t.split(".")
            edges |= {
                ".".join(parts[:i]) for i in range(1, len(parts) + 1) if not m.startswith(".".join(parts[:i]) + ".")
            }  # parents m is inside have run already
        graph[m] = edges - {m}
    return graph


def rank(module: str) -> int:
    """The layer of module's longest prefix in LAYERS; "toolkit" names only the package's own __init__ (a new module
    of the library has to be placed in a layer here)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in RANK and (i > 1 or len(parts) == 1 or parts[0] != "toolkit"):
            return RANK[".".join(parts[:i])]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts if rank(t) > rank(m))


def test_the_graph_sees_relative_lazy_and_package_imports(tmp_path):
    """The checker itself: a cycle through a lazy import and a package __init__, and an upward arrow, are found."""
    (tmp_path / "toolkit" / "precision").mkdir(parents=True)
    (tmp_path / "toolkit" / "__init__.py").write_text("")
    (tmp_path / "toolkit" / "precision" / "__init__.py").write_text("from .calibration import x\n")
    (tmp_path / "toolkit" / "precision" / "calibration.py").write_text("from ..engine import Engine\nx = 1\n")
    (tmp_path / "toolkit" / "precision" / "recipes.py").write_text("y = 1\n")
    (tmp_path / "toolkit" / "engine.py").write_text("def f():\n    from .precision.recipes import y\n")
    (tmp_path / "toolkit" / "models.py").write_text("import toolkit.synthesizer\n")
    (tmp_path / "toolkit" / "synthesizer.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["toolkit.engine"] == {"toolkit.precision", "toolkit.precision.recipes"}
    assert cycles(graph) == [["toolkit.engine", "toolkit.precision", "toolkit.precision.calibration"]]
    assert "toolkit.models -> toolkit.synthesizer" in upward(graph)


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward(import_graph()) == []


if __name__ == "__main__":  # python tests/test_layers.py: the graph's size, its cycles and its upward arrows
    g = import_graph()
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports")
    print("cycles:", *cycles(g) or ["none"], sep="\n  ")
    print("upward:", *upward(g) or ["none"], sep="\n  ")
