"""The multi-turn toy task the end-to-end tests train on: the lookup task (tools/prepare_data.py
lookup: the answer is a value only the `lookup` tool knows) and a tiny qwen2 model whose tokenizer learned
Hermes tool calls (a call is ~20 tokens), both made locally, and the job's arguments."""

from pathlib import Path

from distflow.data.preparation import lookup_rows, write_splits
from distflow.models.tiny import make_tiny_model

# The example config's model (examples/configs/grpo_lookup_cpu.yaml): its header makes the same one.
LOOKUP_MODEL_SIZES = dict(vocab=400, hidden=128, ffn=512)


def lookup_task(root, *, train: int = 4000, test: int = 64, seed: int = 1) -> tuple[Path, Path]:
    """(model dir, data dir) under `root`."""
    root = Path(root)
    model = make_tiny_model("qwen2", root / "tiny-qwen2-tools", tool_calls=True, **LOOKUP_MODEL_SIZES)
    data = root / "lookup"
    write_splits(lookup_rows(train, test, seed), data)
    return model, data


def lookup_job_args(model, data, out_dir) -> list[str]:
    """distflow.train's arguments for the example lookup job on `data`, writing to `out_dir`."""
    return [
        "examples/configs/grpo_lookup_cpu.yaml",
        f"model.path={model}",
        f"data.train_files=[{data}/train.parquet]",
        f"data.val_files=[{data}/test.parquet]",
        f"trainer.output_dir={out_dir}",
    ]
