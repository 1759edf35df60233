"""The layers of docs/design.md are true: no `distflow.*` import points up the layer list.

Every distflow/**/*.py is parsed with `ast`; each import of a distflow module (at module level, inside a
function, under `if TYPE_CHECKING`, relative or absolute) is checked against LAYERS. A module's layer is that
of its top-level package (PACKAGE_LAYER); any `__main__` module is entry (a CLI). A new top-level package
needs a row in PACKAGE_LAYER: the test says so rather than guess.

Where a package sits was read off what it imports, not only its name:
- checkpointing writes the HF source record and the sharded state dict of the model families
  (models.checkpoint_import), so it sits with models, below the workers that save through it;
- data prepares datasets with the rewards' answer extraction (rewards.gsm8k, rewards.math_answer), so it
  sits with rewards in the workers layer;
- rewards score samples (workers layer) with algorithms.reward_shaping;
- the package root distflow/__init__.py runs before any distflow module, so it is foundation.

KNOWN lists the upward imports that exist today in files other helpers of issue #13 are rewriting; the test
fails on any import not in it, and on an entry of it that is gone (so the list only shrinks).
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "distflow"

LAYERS = ("foundation", "models", "algorithms", "workers", "coordination", "dag", "entry")  # bottom to top
PACKAGE_LAYER = {
    "": "foundation",  # distflow/__init__.py
    "batch": "foundation",
    "config": "foundation",
    "cpu_support": "foundation",
    "distributed": "foundation",
    "layout": "foundation",
    "tracking": "foundation",
    "checkpointing": "models",
    "models": "models",
    "algorithms": "algorithms",
    "data": "workers",
    "envs": "workers",
    "rewards": "workers",
    "workers": "workers",
    "coordination": "coordination",
    "dag": "dag",
    "nodes": "dag",
    "plan": "entry",
    "preflight": "entry",
    "run_context": "entry",
    "smoke_run": "entry",
    "testing": "entry",
    "train": "entry",
    "trainer": "entry",
    "trainer_setup": "entry",
}
# (importing module, imported module) -> who removes it. Empty it; never add to it.
KNOWN = {}


def module_name(file: Path, root: Path) -> str:
    """distflow/a/b.py -> distflow.a.b; distflow/a/__init__.py -> distflow.a."""
    parts = file.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer of a distflow module, or None when its top-level package has no row in PACKAGE_LAYER."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "entry"
    return PACKAGE_LAYER.get(parts[1] if len(parts) > 1 else "")


def imported_modules(tree: ast.AST, module: str, is_package: bool, root: Path):
    """(line, imported distflow module) for every import in `tree`, relative ones resolved; `from X import y`
    names the module X.y when y is a submodule, else X."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root.name:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != root.name:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                folder = root.parent.joinpath(*sub.split("."))
                is_module = folder.with_suffix(".py").is_file() or (folder / "__init__.py").is_file()
                yield node.lineno, sub if is_module else source


def layer_violations(root: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Scans every .py under `root` (a package folder). Returns the upward imports as (importer, imported,
    message 'file:line imports X (layer a) from layer b') and the modules that have no layer."""
    upward, unplaced = [], []
    for file in sorted(root.rglob("*.py")):
        module = module_name(file, root)
        own = layer_of(module)
        if own is None:
            unplaced.append(
                f"{file.relative_to(root.parent)}: {module} has no layer; give its top-level package "
                f"a row in PACKAGE_LAYER (one of {', '.join(LAYERS)})"
            )
            continue
        tree = ast.parse(file.read_text(), str(file))
        for line, target in imported_modules(tree, module, file.name == "__init__.py", root):
            theirs = layer_of(target)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(own):
                upward.append(
                    (
                        module,
                        target,
                        f"{file.relative_to(root.parent)}:{line} imports {target} "
                        f"(layer {theirs}) from layer {own}",
                    )
                )
    return upward, unplaced


def test_no_import_points_up_the_layers():
    upward, unplaced = layer_violations(PACKAGE)
    assert not unplaced, "\n".join(unplaced)
    new = [message for importer, target, message in upward if (importer, target) not in KNOWN]
    assert not new, (
        "imports that point up the layer list of docs/design.md (entry > dag > coordination > workers "
        "> algorithms > models > foundation); move the shared piece down instead:\n" + "\n".join(new)
    )
    gone = sorted(set(KNOWN) - {(importer, target) for importer, target, _ in upward})
    assert not gone, "fixed, so remove from KNOWN in tests/test_import_layers.py: " + ", ".join(
        map(str, gone)
    )


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "distflow"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checker_finds_an_upward_import_at_module_and_function_level(tmp_path):
    root = _package(
        tmp_path,
        {
            "layout/__init__.py": "",
            "layout/parallel.py": "from distflow.workers import worker\n",
            "workers/__init__.py": "",
            "workers/worker.py": "def f():\n    import distflow.trainer\n",
            "models/__init__.py": "",
            "models/spec.py": "from ..layout import parallel\nfrom distflow import config\n",
            "config/__init__.py": "",
            "trainer.py": "from distflow.workers.worker import f\n",
        },
    )
    upward, unplaced = layer_violations(root)
    assert unplaced == []
    assert sorted(message for _, _, message in upward) == [
        "distflow/layout/parallel.py:1 imports distflow.workers.worker (layer workers) from layer foundation",
        "distflow/workers/worker.py:2 imports distflow.trainer (layer entry) from layer workers",
    ]


def test_the_checker_resolves_relative_imports_and_cli_modules(tmp_path):
    root = _package(
        tmp_path,
        {
            "config/__init__.py": "from . import __main__\n",
            "config/__main__.py": "from ..layout import x\n",
            "layout/__init__.py": "from .. import dag\n",
            "dag/__init__.py": "",
        },
    )
    upward, _ = layer_violations(root)
    assert sorted(message for _, _, message in upward) == [
        "distflow/config/__init__.py:1 imports distflow.config.__main__ (layer entry) from layer foundation",
        "distflow/layout/__init__.py:1 imports distflow.dag (layer dag) from layer foundation",
    ]


def test_a_package_without_a_layer_is_named(tmp_path):
    _, unplaced = layer_violations(_package(tmp_path, {"helpers.py": ""}))
    assert len(unplaced) == 1 and unplaced[0].startswith("distflow/helpers.py: distflow.helpers has no layer")


@pytest.mark.parametrize(
    "module, layer",
    [
        ("distflow.dag.__main__", "entry"),
        ("distflow.batch.packed", "foundation"),
        ("distflow", "foundation"),
        ("distflow.nodes.train", "dag"),
    ],
)
def test_layer_of(module, layer):
    assert layer_of(module) == layer
