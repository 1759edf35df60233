"""Tiny model directories: every family builds, loads in transformers (and SGLang), and is reproducible."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distflow.models.tiny import FAMILIES, make_tiny_model

JOBS = Path(__file__).parent / "jobs"
TEXT = "Alice has 12 apples and buys 7 more. 12 + 7 = 19."

# What SGLang 0.5.23 does with each MoE family on CPU (no GPU kernels): measured, see test_sglang_generates.
SGLANG_CPU_MOE_FAILURES = {
    # sglang/srt/models/qwen2_moe.py adds the gated shared expert with fused_gate_sigmoid_mul_add, a Triton
    # kernel with no CPU fallback; the first forward fails in the scheduler with
    # "RuntimeError: 0 active drivers ([]). There should only be one." (mixtral and qwen3_moe work).
    "qwen2_moe": "0 active drivers",
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loads_in_transformers_and_runs_forward(tiny_model_dirs, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny_model_dirs[family]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == FAMILIES[family][1]
    assert model.config.vocab_size >= len(tokenizer)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.3, "random weights should give clearly non-uniform logits"


def test_architecture_details(tiny_model_dirs):
    """The features each family is chosen to exercise are really in the checkpoint."""
    keys = {family: set(load_file(tiny_model_dirs[family] / "model.safetensors")) for family in FAMILIES}
    configs = {
        family: json.loads((tiny_model_dirs[family] / "config.json").read_text()) for family in FAMILIES
    }
    assert "model.layers.0.self_attn.q_proj.bias" in keys["qwen2"]
    assert configs["qwen2"]["tie_word_embeddings"] and "lm_head.weight" not in keys["qwen2"]
    assert "model.layers.0.self_attn.q_norm.weight" in keys["qwen3"]
    assert (
        configs["qwen3"]["head_dim"] * configs["qwen3"]["num_attention_heads"]
        != configs["qwen3"]["hidden_size"]
    )
    assert "model.layers.0.self_attn.q_proj.bias" not in keys["llama"]
    assert "model.layers.1.block_sparse_moe.experts.3.w1.weight" in keys["mixtral"]
    assert "model.layers.0.mlp.shared_expert_gate.weight" in keys["qwen2_moe"]
    assert "model.layers.0.mlp.shared_expert.gate_proj.weight" in keys["qwen2_moe"]
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in keys["qwen3_moe"]
    assert configs["qwen3_moe"]["num_experts"] == 4 and "rope_theta" in configs["llama"]


def test_same_seed_gives_identical_files(tmp_path, tiny_model_dirs):
    again = make_tiny_model("qwen3", tmp_path / "again")
    other_seed = make_tiny_model("qwen3", tmp_path / "seed1", seed=1)
    first, second = (
        load_file(tiny_model_dirs["qwen3"] / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert (tiny_model_dirs["qwen3"] / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
    third = load_file(other_seed / "model.safetensors")
    assert not torch.equal(first["model.embed_tokens.weight"], third["model.embed_tokens.weight"])


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # AutoTokenizer picks a different class for each
def test_tokenizer_round_trips_and_applies_chat_template(tiny_model_dirs, family):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs[family])
    raw = Tokenizer.from_file(str(tiny_model_dirs[family] / "tokenizer.json"))
    for text in [TEXT, "What is 345 * 2? The answer is 690.", "  spaces\nand lines\t\u00e9!"]:
        ids = tokenizer(text).input_ids
        assert tokenizer.decode(ids) == text
        assert ids == raw.encode(text).ids, "transformers must tokenize exactly like the trained tokenizer"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token and tokenizer.bos_token
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") != tokenizer.unk_token_id
    assert len(tokenizer(chat).input_ids) < len(chat) / 2, "special tokens must be single tokens"


def test_cli_writes_a_model_dir(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import make_tiny_model as cli

    cli.main(["--family", "mistral", "--out", str(tmp_path / "m"), "--layers", "1", "--vocab", "300"])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["vocab_size"] == 300


@pytest.mark.slow
def test_sglang_generates(tiny_model_dirs, tmp_path):
    """SGLang's CPU engine loads every dense family and greedy-decodes like transformers; MoE as measured."""
    # Families known to crash the engine go last, so that their crash needs no restart of the job.
    order = sorted(FAMILIES, key=lambda f: f in SGLANG_CPU_MOE_FAILURES)
    results = run_sglang_generation([tiny_model_dirs[f] for f in order], tmp_path / "results.jsonl")
    for family in FAMILIES:
        result = results[str(tiny_model_dirs[family])]
        if family in SGLANG_CPU_MOE_FAILURES:
            assert not result["ok"] and SGLANG_CPU_MOE_FAILURES[family] in result["error"], result
            continue
        assert result["ok"], f"{family}: {result['error']}"
        assert result["tokens"] == hf_greedy(
            tiny_model_dirs[family], result["prompt_ids"], len(result["tokens"])
        ), f"{family}: SGLang greedy tokens differ from transformers'"


def run_sglang_generation(model_dirs, results_path: Path) -> dict:
    """Runs the generation job over model_dirs, restarting it after a model that crashes the engine."""
    from distflow.cpu_support import sglang_cpu_env
    from distflow.testing.launch import JobFailed, run

    remaining = [str(d) for d in model_dirs]
    results = {}
    while remaining:
        cmd = [sys.executable, str(JOBS / "sglang_generate_tiny.py"), str(results_path), *remaining]
        try:
            run(cmd, timeout_s=120 + 60 * len(remaining), env=sglang_cpu_env(dict(os.environ), engine_tp=1))
            failure = None
        except JobFailed as exc:
            failure = str(exc)
        if results_path.exists():
            for line in results_path.read_text().splitlines():
                results[json.loads(line)["model"]] = json.loads(line)
        remaining = [d for d in remaining if d not in results]
        if remaining:
            assert failure, f"job exited cleanly without results for {remaining}"
            if "timed out" in failure.splitlines()[0]:
                raise AssertionError(failure)
            results[remaining[0]] = {"model": remaining[0], "ok": False, "error": _last_error(failure)}
            remaining = remaining[1:]
    return results


def _last_error(output: str) -> str:
    errors = [line for line in output.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return errors[-1] if errors else output[-2000:]


def hf_greedy(model_dir: Path, prompt_ids: list, new_tokens: int) -> list:
    from transformers import AutoModelForCausalLM

    # A plain argmax loop: like SGLang's ignore_eos, it keeps going through an eos token.
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def test_a_tool_call_tokenizer_spends_few_tokens_on_a_call_and_keeps_the_rest():
    from distflow.models.tiny_tokenizer import train_tiny_tokenizer

    call = '<tool_call>{"name": "lookup", "arguments": {"key": "7"}}</tool_call>'
    plain, tools = train_tiny_tokenizer(400), train_tiny_tokenizer(400, tool_calls=True)
    assert (
        len(tools.encode(call, add_special_tokens=False))
        <= 24
        < len(plain.encode(call, add_special_tokens=False))
    )
    assert len(tools) == len(plain) == 400
    for tokenizer in (plain, tools):  # byte-level: any text round-trips, the call's too
        assert tokenizer.decode(tokenizer.encode(call, add_special_tokens=False)) == call
