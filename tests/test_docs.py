"""The docs (README.md, docs/*.md) name only things that exist: repository paths, `python -m distflow.X`
modules, and metric names the code records.

Metric names are checked against the glossary docs/metrics.md when it exists (its names may be templates:
`val/<data_source>/reward/mean`, `critic/advantages/{mean,max,min}`, `actor/kl*`) and against the code:
a quoted literal ("sync/bytes") in distflow/, or a name built by an f-string template (f"actor/{k}") whose
remainder is a quoted key or keyword argument there ("pg_clipfrac", pg_clipfrac=...). A name that neither
knows fails with the doc, the line and where to add it.
"""

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
GLOSSARY = REPO / "docs" / "metrics.md"

PATH_ROOTS = ("distflow", "tools", "examples", "tests", "docs", "ci", "megatron_patches", ".ci")
ROOT_FILES = ("README.md", "requirements.txt", "setup.py", "pytest.ini")
METRIC_PREFIXES = (
    "actor",
    "critic",
    "rollout",
    "rollout_corr",
    "reward",
    "advantage",
    "sync",
    "timing_s",
    "perf",
    "val",
    "dapo",
    "trainer",
    "response_length",
    "prompt_length",
)
PLACEHOLDER = re.compile(r"[<{$*\[]|\.\.\.")

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A quoted string ("distflow/copy", a data_source) is a value, not a path.
_PATH = re.compile(r"(?<![\w./<>'\"-])((?:" + "|".join(map(re.escape, PATH_ROOTS)) + r")/[\w./*<>{}$-]*)")
_ROOT_FILE = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, ROOT_FILES)) + r")(?![\w/-])")
_MODULE = re.compile(r"-m\s+(distflow(?:\.\w+)*)(?![.\w*])")  # not `python -m distflow.*` (any of them)
# A file named without its folder (`reshard_estimate.py`, "see DESIGN.md"): some file of the repo has that name.
_BARE = re.compile(r"(?<![\w./<>-])([\w-]+(?:\.[\w-]+)*\.(?:py|md|sh|yaml|yml))(?![\w/-])")
# A metric-like token: prefix/..., possibly a template (<x>, {a,b}, *, a|b alternatives of the last part).
_METRIC = re.compile(r"(?<![\w./-])((?:" + "|".join(METRIC_PREFIXES) + r")/[\w/<>{},*|-]*[\w>}*])(?![\w.(])")


def _lines_with(text: str, pattern: re.Pattern):
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            yield number, match.group(1)


def _code_text(text: str) -> str:
    """The text of the doc's inline code spans and fenced blocks, line numbers kept (other text blanked)."""
    keep = [" " * len(line) for line in text.splitlines()]
    lines = text.splitlines()
    for block in _FENCE.finditer(text):
        first = text.count("\n", 0, block.start())
        for i in range(first, first + block.group(0).count("\n") + 1):
            keep[i] = lines[i]
    for i, line in enumerate(lines):
        if keep[i].strip():
            continue
        spans = [m.group(1) for m in _INLINE.finditer(line)]
        keep[i] = "  ".join(spans)
    return "\n".join(keep)


def _rel(doc: Path) -> str:
    return str(doc.relative_to(REPO))


# ---- paths -------------------------------------------------------------------------------------------------
def _path_exists(token: str) -> bool:
    token = token.rstrip(".,;:")
    token = token.split(":", 1)[0]  # module.py:function, file.py:line
    if PLACEHOLDER.search(token):  # examples/<script>.sh: the folder before the placeholder must exist
        head = PLACEHOLDER.split(token, 1)[0]
        if "*" in token and "<" not in token and "{" not in token:
            return any(REPO.glob(token.rstrip("/")))
        return (REPO / head.rsplit("/", 1)[0]).exists()
    return (REPO / token).exists()


def named_paths(doc: Path) -> list[tuple[int, str]]:
    """(line, path) of every repository path the doc names in code, and of every relative link."""
    text = doc.read_text()
    code = _code_text(text)
    found = list(_lines_with(code, _PATH)) + list(_lines_with(code, _ROOT_FILE))
    for number, target in _lines_with(text, _LINK):
        if "://" not in target and not target.startswith("mailto:"):
            found.append((number, str((doc.parent / target).resolve().relative_to(REPO.resolve()))))
    return found


def repo_file_names() -> set[str]:
    skip = {".git", "__pycache__", ".venv", "outputs"}
    return {p.name for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)}


def named_file_names(doc: Path) -> list[tuple[int, str]]:
    """(line, name) of files named without a folder, outside fenced blocks (there, commands may create files)."""
    text = _FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), doc.read_text())
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets: checked as paths by named_paths
    return list(_lines_with(text, _BARE))


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_named_paths_exist(doc):
    missing = [f"{_rel(doc)}:{line}: {path}" for line, path in named_paths(doc) if not _path_exists(path)]
    names = repo_file_names()
    missing += [
        f"{_rel(doc)}:{line}: {name} (no file of that name in the repository)"
        for line, name in named_file_names(doc)
        if name not in names
    ]
    assert not missing, "docs name repository paths that do not exist:\n" + "\n".join(missing)


# ---- python -m modules -------------------------------------------------------------------------------------
def _runnable_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_named_modules_run(doc):
    bad = [
        f"{_rel(doc)}:{line}: python -m {name}"
        for line, name in _lines_with(doc.read_text(), _MODULE)
        if not _runnable_module(name)
    ]
    assert not bad, (
        "docs name `python -m` modules that do not exist (no X.py, no X/__main__.py):\n" + "\n".join(bad)
    )


# ---- metric names ------------------------------------------------------------------------------------------
def expand(token: str) -> list[str]:
    """`a/b/{x,y}` -> a/b/x, a/b/y; `a/b/x|y` -> a/b/x, a/b/y (a part with a "/" is a whole name)."""
    out = []
    first, *alternatives = token.split("|")
    names = [first] + [alt if "/" in alt else first.rsplit("/", 1)[0] + "/" + alt for alt in alternatives]
    for name in names:
        brace = re.search(r"\{([^{}]*)\}", name)
        if brace:
            out += [
                n
                for choice in brace.group(1).split(",")
                for n in expand(name[: brace.start()] + choice.strip() + name[brace.end() :])
            ]
        else:
            out.append(name)
    return out


def _template_regex(name: str) -> re.Pattern:
    parts = re.split(r"(<[^>]*>|\*)", name)
    return re.compile(
        "".join(".+" if p.startswith("<") else ".*" if p == "*" else re.escape(p) for p in parts) + "$"
    )


def glossary_patterns() -> list[re.Pattern]:
    """Every metric name docs/metrics.md documents, as regexes; [] until the glossary exists."""
    if not GLOSSARY.is_file():
        return []
    code = _code_text(GLOSSARY.read_text())
    return [_template_regex(n) for _, token in _lines_with(code, _METRIC) for n in expand(token)]


def _code_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((REPO / "distflow").rglob("*.py")))


def code_records(name: str, source: str) -> bool:
    """The code has `name` as a quoted literal, or builds it with f"<head>/{...}" and has the rest as a key."""
    if re.search(r"[\"']" + re.escape(name) + r"[\"']", source):
        return True
    for head in re.findall(r"f[\"']([\w/]+/)\{", source):
        rest = name[len(head) :]
        if (
            name.startswith(head)
            and rest
            and re.search(
                r"[\"']" + re.escape(rest) + r"[\"']|(?<![\w.])" + re.escape(rest) + r"\s*=(?!=)", source
            )
        ):
            return True
    return False


def named_metrics(doc: Path) -> list[tuple[int, str]]:
    """(line, name) of every concrete metric name in the doc's code spans (templates and wildcards are skipped:
    they name families, not one metric)."""
    return [
        (line, name)
        for line, token in _lines_with(_code_text(doc.read_text()), _METRIC)
        for name in expand(token)
        if not re.search(r"[<*{]", name)
    ]


@pytest.fixture(scope="module")
def known():
    source, patterns = _code_sources(), glossary_patterns()
    return lambda name: any(p.match(name) for p in patterns) or code_records(name, source)


@pytest.mark.parametrize("doc", [d for d in DOCS if d != GLOSSARY], ids=_rel)
def test_named_metrics_are_recorded(doc, known):
    unknown = [f"{_rel(doc)}:{line}: {name}" for line, name in named_metrics(doc) if not known(name)]
    assert not unknown, (
        "docs name metrics that neither docs/metrics.md documents nor the code records "
        "(grep ctx.record / metric keys in distflow/):\n" + "\n".join(unknown)
    )


# ---- the checker itself ------------------------------------------------------------------------------------
def test_the_checks_catch_what_they_are_for(tmp_path):
    assert expand("critic/advantages/{mean,max}") == ["critic/advantages/mean", "critic/advantages/max"]
    assert expand("response_length/mean|max|min") == [
        "response_length/mean",
        "response_length/max",
        "response_length/min",
    ]
    assert _template_regex("val/<data_source>/reward/mean").match("val/openai/gsm8k/reward/mean")
    source = 'ctx.record(**{"sync/bytes": 1})\nctx.record(**{f"actor/{k}": v})\nm = dict(pg_clipfrac=0.1)\n'
    assert code_records("sync/bytes", source) and code_records("actor/pg_clipfrac", source)
    assert not code_records("actor/clipfrac", source) and not code_records("sync/seconds", source)
    assert _path_exists("distflow/train.py") and _path_exists("tools/convert_*.py")
    assert _path_exists("examples/<script>.sh") and _path_exists("distflow/rewards/registry.py:load_scorer")
    assert not _path_exists("examples/configs/rl_gpu.yaml") and not _path_exists(
        "nowhere/<x>.sh".join(["tools/", ""])
    )
    assert _runnable_module("distflow.plan") and _runnable_module("distflow.train")
    assert not _runnable_module("distflow.nonexistent")
    doc = tmp_path / "x.md"
    doc.write_text(
        "Watch `actor/clipfrac` and `rollout/response_length/*`; see `distflow/workers/rollout/worker.py`.\n"
        "```bash\npython -m distflow.plan examples/configs/gpu_base.yaml\n```\n"
    )
    assert named_metrics(doc) == [(1, "actor/clipfrac")]  # the path's rollout/ is no metric; * is a family
    assert sorted(p for _, p in named_paths(doc)) == [
        "distflow/workers/rollout/worker.py",
        "examples/configs/gpu_base.yaml",
    ]
    assert [m.group(1) for m in _MODULE.finditer("python -m distflow.* and torchrun -m distflow.train")] == [
        "distflow.train"
    ]
    doc.write_text('`"distflow/copy"` is a data_source, `distflow/copy` a path\n')
    assert [p for _, p in named_paths(doc)] == ["distflow/copy"]
    doc.write_text(
        "The names are in DESIGN.md (`memory.py`, `tools/plot_metrics.py`).\n```\ncat > mine.py\n```\n"
    )
    assert [n for _, n in named_file_names(doc)] == ["DESIGN.md", "memory.py"]


def test_the_glossary_is_read_when_it_exists(tmp_path, monkeypatch):
    glossary = tmp_path / "metrics.md"
    glossary.write_text(
        "| name | meaning |\n|---|---|\n| `val/<data_source>/reward/mean` | per source |\n"
        "| `critic/advantages/{mean,max}` | stats |\n| `actor/kl*` | KL terms |\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "GLOSSARY", glossary)
    patterns = glossary_patterns()
    documented = lambda name: any(p.match(name) for p in patterns)  # noqa: E731
    assert documented("val/openai/gsm8k/reward/mean") and documented("critic/advantages/max")
    assert (
        documented("actor/kl_loss")
        and not documented("actor/clipfrac")
        and not documented("critic/advantages/min")
    )
