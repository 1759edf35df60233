"""Starts one SGLang CPU engine per tiny model directory, in turn, and generates greedily from each.

Usage: python sglang_generate_tiny.py RESULTS_JSONL DIR [DIR ...]
(run with the env of distflow.cpu_support.sglang_cpu_env). Appends one JSON line per model to RESULTS_JSONL:
{"model": ..., "ok": bool, "prompt_ids": [...], "tokens": [...], "error": ...}. A model the engine cannot
load gives ok=false with the error, and the script goes on with the next one. A model whose engine crashes
at run time takes this script down with it (SGLang kills its whole process tree when a scheduler dies): the
caller sees which model has no result line and restarts the script with the models after it.
"""

import json
import sys
import traceback

PROMPT_MESSAGES = [{"role": "user", "content": "What is 12 + 7?"}]
MAX_NEW_TOKENS = 8


def generate_once(model_dir: str) -> dict:
    import sglang
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = tokenizer.apply_chat_template(PROMPT_MESSAGES, add_generation_prompt=True, tokenize=True)
    prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    engine = None
    try:
        engine = sglang.Engine(
            model_path=model_dir,
            device="cpu",
            dtype="float32",
            mem_fraction_static=0.05,
            max_total_tokens=8192,
            disable_cuda_graph=True,
            skip_server_warmup=True,
            random_seed=0,
            log_level="error",
        )
        out = engine.generate(
            input_ids=prompt_ids,
            sampling_params={"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
        )
        return {"ok": True, "prompt_ids": prompt_ids, "tokens": out["output_ids"], "error": None}
    except BaseException as exc:  # noqa: BLE001 - report any failure of the engine as data
        return {
            "ok": False,
            "prompt_ids": prompt_ids,
            "tokens": None,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    finally:
        if engine is not None:
            engine.shutdown()
        _kill_own_children()


def _kill_own_children() -> None:
    """Ends the engine's processes that a failed start leaves behind (only this script's children)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def main() -> None:
    results_path, model_dirs = sys.argv[1], sys.argv[2:]
    for model_dir in model_dirs:
        print(f"STARTING {model_dir}", flush=True)
        result = {"model": model_dir, **generate_once(model_dir)}
        with open(results_path, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{model_dir}: ok={result['ok']} error={result['error']}", flush=True)


if __name__ == "__main__":
    main()
