"""tools/convert_hf_to_megatron.py and tools/convert_megatron_to_hf.py end to end, as a user runs them.

HF -> Megatron dist checkpoint -> HF is bit for bit the source, for every family through the tools (qwen2
TP2; qwen3_moe TP2 x EP2; llama PP2 x VPP2; mixtral from a fused-expert file at TP1; mistral PP2; qwen3
TP2 x PP2; qwen2_moe EP2: mixtral and qwen3 from the command lines, the 2-rank ones through the tools'
own functions in one launch); checkpoints saved at one layout load at another (TP2 ones at PP2, PP2 / EP2
/ TP2 x PP2 ones at TP2) with HF's logits, bit-identical to the same layout loaded from HF; bad HF
directories and damaged dist checkpoints are rejected naming the tensor, file or field; import memory
stays under twice the model, export memory near shard size + one layer. (Every family at every layout,
in memory: test_parallel_logits.)
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from distflow.models.checkpoint_export import InvalidMegatronCheckpoint, export_to_hf
from distflow.models.checkpoint_import import SOURCE_FILE
from distflow.models.conversion import HFCheckpoint
from distflow.models.hf_validation import InvalidHFCheckpoint, check_hf_checkpoint
from distflow.models.tiny import make_tiny_model
from distflow.testing.launch import REPO_ROOT, run, torchrun

TO_MEGATRON = REPO_ROOT / "tools" / "convert_hf_to_megatron.py"
TO_HF = REPO_ROOT / "tools" / "convert_megatron_to_hf.py"
LOGITS_JOB = Path(__file__).parent / "jobs" / "parallel_vs_hf_logits.py"
MEMORY_JOB = Path(__file__).parent / "jobs" / "export_peak_memory.py"
IMPORT_MEMORY_JOB = Path(__file__).parent / "jobs" / "import_peak_memory.py"
MAX_ABS_DIFF = 1e-4

# name: (family, make_tiny_model sizes, import layout arguments)
CASES = {
    # tied embedding, vocab 300 padded to 512 rows at TP2, one KV head per TP rank (fewer KV heads than TP
    # ranks is refused by the tool, as by Megatron-Core, which splits whole query groups)
    "qwen2_tp2": ("qwen2", dict(vocab=300, kv_heads=2), ["--tp", "2"]),
    # experts over EP2 but not split (ETP1) while attention is TP2: 2 processes
    "qwen3_moe_tp2_ep2": ("qwen3_moe", {}, ["--tp", "2", "--ep", "2", "--etp", "1"]),
    "llama_pp2_vpp2": ("llama", dict(layers=4), ["--pp", "2", "--vpp", "2"]),
    "mixtral_fused_tp1": ("mixtral", {}, ["--tp", "1"]),  # re-saved in transformers' fused expert layout
    "mistral_pp2": ("mistral", {}, ["--pp", "2"]),
    "qwen3_tp2_pp2": ("qwen3", {}, ["--tp", "2", "--pp", "2"]),  # 4 processes
    "qwen2_moe_ep2": ("qwen2_moe", {}, ["--ep", "2"]),  # shared expert replicated, routed experts split
}


def _make_source(name: str, root: Path) -> Path:
    family, sizes, _ = CASES[name]
    source = make_tiny_model(family, root / f"{name}_hf", **sizes)
    if name.startswith("mixtral_fused"):
        from transformers import AutoModelForCausalLM

        fused = root / f"{name}_hf_fused"
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).save_pretrained(
            fused, save_original_format=False
        )
        shutil.copy(source / "tokenizer.json", fused)
        source = fused
    return source


# These run the tools from their command lines as a user does, covering both launchers (torchrun at 4 ranks,
# in-process at 1); the 2-rank others run the same tool code (argument parsing, input checks, rank work, export
# main) in one torchrun launch and one export process: a tool run's cost is mostly its start-up.
COMMAND_LINE_CASES = ("qwen3_tp2_pp2", "mixtral_fused_tp1")
IMPORT_RUNS_JOB = Path(__file__).parent / "jobs" / "import_tool_runs.py"
EXPORT_RUNS_JOB = Path(__file__).parent / "jobs" / "export_tool_runs.py"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict:
    """name -> (HF source dir, dist checkpoint dir, exported HF dir, export output)."""
    root = tmp_path_factory.mktemp("convert")
    done, imports, exports = {}, {}, {}
    for name, (_, _, layout) in CASES.items():
        source = _make_source(name, root)
        ckpt, back = root / f"{name}_megatron", root / f"{name}_back"
        done[name] = (source, ckpt, back)
        imports[name] = ["--hf", source, "--out", ckpt, *layout]
        exports[name] = [
            "--megatron",
            ckpt,
            "--out",
            back,
            "--max-shard-size",
            "64KB",
            "--verify",
            "--no-progress",
        ]
    outputs = {}
    for name in COMMAND_LINE_CASES:
        run([sys.executable, TO_MEGATRON, *imports[name]], timeout_s=300)
        outputs[name] = run([sys.executable, TO_HF, *exports[name]], timeout_s=300)
    batched = [n for n in CASES if n not in COMMAND_LINE_CASES]
    (root / "imports.json").write_text(json.dumps([[str(a) for a in imports[n]] for n in batched]))
    torchrun(IMPORT_RUNS_JOB, nproc=2, args=[root / "imports.json"], timeout_s=300 + 60 * len(batched))
    (root / "exports.json").write_text(json.dumps([[str(a) for a in exports[n]] for n in batched]))
    run([sys.executable, EXPORT_RUNS_JOB, root / "exported.json", root / "exports.json"], timeout_s=300)
    for name, result in zip(batched, json.loads((root / "exported.json").read_text())):
        assert result["returncode"] == 0, (name, result["stderr"][-2000:])
        outputs[name] = result["stdout"]
    return {name: (*done[name], outputs[name]) for name in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_is_bit_identical(converted, name):
    source, ckpt, back, out = converted[name]
    assert "verify: every tensor equals the checkpoint's" in out
    original, exported = HFCheckpoint(source), HFCheckpoint(back)
    assert exported.names() == original.names()
    for n in original.names():
        a, b = original.get(n), exported.get(n)
        assert a.dtype == b.dtype and torch.equal(a, b), n
    assert exported.expert_layout == original.expert_layout
    # sharded files with an index, as transformers writes them; the same stored names as the source
    index = json.loads((back / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    stored = {n for f in files for n in safe_open(back / f, "pt").keys()}
    assert stored == set(index["weight_map"]) == set(_stored_names(source))
    assert json.loads((back / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    assert (back / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    recorded = json.loads((ckpt / SOURCE_FILE).read_text())
    assert recorded["hf_config"] == original.config and recorded["expert_layout"] == original.expert_layout


CROSS_LAYOUT_LOADS = {  # loaded at: checkpoints saved at other layouts
    "pp2": ["qwen2_tp2", "qwen3_moe_tp2_ep2"],
    "tp2": ["mistral_pp2", "qwen3_tp2_pp2", "qwen2_moe_ep2"],
}


@pytest.fixture(scope="module")
def cross_layout_results(converted, tmp_path_factory) -> dict:
    """target -> the logits job's results for CROSS_LAYOUT_LOADS[target]: both targets in one 2-rank launch."""
    root = tmp_path_factory.mktemp("cross_layout")
    args = []
    for target, names in CROSS_LAYOUT_LOADS.items():
        args += [
            *(["--then"] if args else []),
            f"--{target[:2]}",
            target[2:],
            "--out",
            root / f"{target}.json",
            "--load-megatron",
            *(converted[n][1] for n in names),
            "--",
            *(converted[n][0] for n in names),
        ]
    torchrun(LOGITS_JOB, nproc=2, timeout_s=300 * len(CROSS_LAYOUT_LOADS), args=args)
    return {target: json.loads((root / f"{target}.json").read_text()) for target in CROSS_LAYOUT_LOADS}


@pytest.mark.slow
@pytest.mark.parametrize("target", list(CROSS_LAYOUT_LOADS))
def test_checkpoints_load_at_another_layout_with_hf_logits(converted, cross_layout_results, target):
    names = CROSS_LAYOUT_LOADS[target]
    results = cross_layout_results[target]
    assert sorted(results) == sorted(converted[n][0].name for n in names)
    for name, result in results.items():
        assert result["roundtrip_exact"] and result["max_abs_diff"] <= MAX_ABS_DIFF, (name, result)
        assert result["identical_to_hf_load"], (name, result)


def _stored_names(model_dir: Path) -> list[str]:
    return sorted(n for f in model_dir.glob("*.safetensors") for n in safe_open(f, "pt").keys())


@pytest.fixture
def broken_copy(tiny_model_dirs, tmp_path):
    """A function (family, edit) -> a copy of the tiny model whose tensors and config.json `edit` changed."""

    def make(family: str, edit) -> Path:
        copy = tmp_path / family
        shutil.copytree(tiny_model_dirs[family], copy)
        tensors = load_file(copy / "model.safetensors")
        config = json.loads((copy / "config.json").read_text())
        edit(tensors, config)
        save_file(tensors, copy / "model.safetensors")
        (copy / "config.json").write_text(json.dumps(config))
        return copy

    return make


BAD_INPUTS = {  # name: (family, edit, words the error must contain)
    "shape": (
        "llama",
        lambda t, c: t.update({"model.layers.1.self_attn.k_proj.weight": torch.zeros(64, 64)}),
        ["model.layers.1.self_attn.k_proj.weight is (64, 64), expected (32, 64)"],
    ),
    "missing": (
        "qwen2_moe",
        lambda t, c: t.pop("model.layers.0.mlp.experts.3.up_proj.weight"),
        ["missing tensors", "model.layers.0.mlp.experts.3.up_proj.weight"],
    ),
    "extra": (
        "mixtral",
        lambda t, c: t.update({"model.layers.0.block_sparse_moe.experts.4.w1.weight": torch.zeros(128, 64)}),
        ["does not explain", "model.layers.0.block_sparse_moe.experts.4.w1.weight"],
    ),
    "config_field": (
        "qwen3_moe",
        lambda t, c: c.update(num_hidden_layers=3),
        ["missing tensors (21)", "model.layers.2.input_layernorm.weight"],
    ),
    "architecture": (
        "llama",
        lambda t, c: c.update(architectures=["GPT2LMHeadModel"]),
        [
            "'GPT2LMHeadModel' has no model family spec",
            "MixtralForCausalLM (mixtral)",
            "Qwen3MoeForCausalLM (qwen3_moe)",
            "LlamaForCausalLM (llama)",
        ],
    ),
    "unmapped_feature": ("qwen2_moe", lambda t, c: c.update(mlp_only_layers=[1]), ["mlp_only_layers=[1]"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_hf_input_is_rejected_naming_the_fault(broken_copy, case):
    family, edit, words = BAD_INPUTS[case]
    with pytest.raises(InvalidHFCheckpoint) as error:
        check_hf_checkpoint(HFCheckpoint(broken_copy(family, edit)))
    for word in words:
        assert word in str(error.value), str(error.value)


def test_tool_exits_with_the_error_before_starting_ranks(broken_copy, tmp_path):
    family, edit, words = BAD_INPUTS["shape"]
    proc = subprocess.run(
        [
            sys.executable,
            TO_MEGATRON,
            "--hf",
            broken_copy(family, edit),
            "--out",
            tmp_path / "ckpt",
            "--tp",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and words[0] in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "ckpt").exists()


@pytest.fixture(scope="module")
def memory_model(tmp_path_factory) -> tuple:
    """24 layers of 3.75 MiB (91 MiB fp32), imported by the tool's one-rank work in a process that measures
    its memory: (HF dir, dist checkpoint dir, model bytes, import memory numbers)."""
    root = tmp_path_factory.mktemp("memory")
    source = make_tiny_model("llama", root / "hf", layers=24, hidden=256, heads=4, kv_heads=2, ffn=1024)
    result = root / "import_memory.json"
    run([sys.executable, IMPORT_MEMORY_JOB, source, root / "ckpt", result], timeout_s=300)
    model_bytes = sum(HFCheckpoint(source).get(n).nbytes for n in HFCheckpoint(source).names())
    return source, root / "ckpt", model_bytes, json.loads(result.read_text())


@pytest.mark.slow
def test_export_memory_stays_near_shard_plus_layer(memory_model, tmp_path):
    """Exporting with 4 MiB files adds a few layers' worth of memory, not the model (measured: +23 MiB;
    +108 MiB when one 1 GiB file buffers the whole model)."""
    source, ckpt, model_bytes, _ = memory_model
    result = tmp_path / "memory.json"
    run([sys.executable, MEMORY_JOB, ckpt, tmp_path / "back", str(4 * 2**20), result], timeout_s=300)
    memory = json.loads(result.read_text())
    print(
        f"export peak: +{memory['added_peak'] / 2**20:.1f} MiB over {memory['baseline_rss'] / 2**20:.0f} MiB "
        f"for a {model_bytes / 2**20:.1f} MiB model"
    )
    assert memory["written_bytes"] == model_bytes
    assert memory["added_peak"] < model_bytes / 2, memory


@pytest.mark.slow
def test_import_memory_stays_under_twice_the_model(memory_model):
    """The importing rank holds its GPTModel (here the whole model) and one HF layer at a time, never the
    HF checkpoint as well; dist_checkpointing's save stages part of the state again. Measured: +156 MiB for
    a 91 MiB model, +295 MiB for 182 MiB (1.6-1.7 x)."""
    _, _, model_bytes, memory = memory_model
    print(
        f"import peak: +{memory['added_peak'] / 2**20:.1f} MiB over {memory['baseline_rss'] / 2**20:.0f} MiB "
        f"for a {model_bytes / 2**20:.1f} MiB model"
    )
    assert memory["added_peak"] < 2 * model_bytes, memory


def _edit_source(edit):
    def apply(ckpt: Path) -> None:
        source = json.loads((ckpt / SOURCE_FILE).read_text())
        edit(source)
        (ckpt / SOURCE_FILE).write_text(json.dumps(source))

    return apply


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGED_CHECKPOINTS = {  # name: (edit of a copy of the mistral PP2 checkpoint, words the error must contain)
    "no_source_file": (lambda c: (c / SOURCE_FILE).unlink(), [f"no {SOURCE_FILE}"]),
    "source_not_json": (lambda c: (c / SOURCE_FILE).write_text("{"), [f"{SOURCE_FILE} is not valid JSON"]),
    "architecture": (
        _edit_source(lambda s: s["hf_config"].update(architectures=["GPT2LMHeadModel"])),
        [
            "'GPT2LMHeadModel' has no model family spec",
            "MistralForCausalLM (mistral)",
            "Qwen3MoeForCausalLM (qwen3_moe)",
        ],
    ),
    "layers": (
        _edit_source(lambda s: s["hf_config"].update(num_hidden_layers=4)),
        ["stacks 2 decoder layers", "num_hidden_layers=4"],
    ),
    "ffn": (
        _edit_source(lambda s: s["hf_config"].update(intermediate_size=96)),
        ["intermediate_size=96", "decoder.layers.0.mlp.linear_fc1.weight is (256, 64), expected (192, 64)"],
    ),
    "kv_heads": (
        _edit_source(lambda s: s["hf_config"].update(num_key_value_heads=4)),
        [
            "num_key_value_heads=4",
            "decoder.layers.0.self_attention.linear_qkv.weight is (128, 64), expected (192, 64)",
        ],
    ),
    "vocab": (
        _edit_source(lambda s: s["hf_config"].update(vocab_size=1000)),
        ["vocab_size=1000", "embedding.word_embeddings.weight is (512, 64), expected (1000, 64)"],
    ),
    "truncated_data": (
        lambda c: [_truncate(f) for f in c.glob("*.distcp")],
        ["missing, truncated or corrupt", "embedding.word_embeddings.weight"],
    ),
    "missing_data": (
        lambda c: [f.unlink() for f in c.glob("*.distcp")],
        ["missing, truncated or corrupt", "No such file", ".distcp"],
    ),
    "missing_index": (lambda c: (c / ".metadata").unlink(), ["cannot read the checkpoint index (.metadata)"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DAMAGED_CHECKPOINTS))
def test_damaged_checkpoint_is_rejected_naming_the_fault(converted, case, tmp_path):
    edit, words = DAMAGED_CHECKPOINTS[case]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted["mistral_pp2"][1], ckpt)
    edit(ckpt)
    with pytest.raises(InvalidMegatronCheckpoint) as error:
        export_to_hf(ckpt, tmp_path / "hf", progress=False)
    for word in words:
        assert word in str(error.value), str(error.value)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.tmp").exists()


@pytest.mark.slow
def test_export_tool_exits_with_the_error(converted, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted["mistral_pp2"][1], ckpt)
    DAMAGED_CHECKPOINTS["kv_heads"][0](ckpt)
    proc = subprocess.run(
        [sys.executable, TO_HF, "--megatron", ckpt, "--out", tmp_path / "hf", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "convert_megatron_to_hf: " in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and DAMAGED_CHECKPOINTS["kv_heads"][1][1] in proc.stderr
