"""Measures the resident memory that tools/convert_hf_to_megatron.py's import adds, in a fresh process.

    python import_peak_memory.py HF_DIR OUT_DIR RESULT.json
Runs the tool's one-rank work (layout TP1 PP1: the whole model on this rank) in this process and writes
{"baseline_rss", "peak_rss", "added_peak"} in bytes: RSS after imports and process-group setup, the
high-water mark (VmHWM) after the checkpoint is written, and their difference. Rank processes of larger
layouts each hold their stage's share, so one rank holding everything is the worst case.
"""

import json
import sys


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def main() -> None:
    hf_dir, out, result = sys.argv[1], sys.argv[2], sys.argv[3]
    import torch.distributed as dist
    from megatron.core import dist_checkpointing  # noqa: F401  (all imports before the baseline)
    from megatron.core.models.gpt import GPTModel  # noqa: F401

    import megatron_patches
    from distflow.models.checkpoint_import import CheckpointLayout, convert_rank

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    megatron_patches.apply()
    baseline = status_bytes("VmRSS")
    convert_rank(hf_dir, out, CheckpointLayout())
    peak = status_bytes("VmHWM")
    dist.destroy_process_group()
    with open(result, "w") as f:
        json.dump({"baseline_rss": baseline, "peak_rss": peak, "added_peak": peak - baseline}, f)


if __name__ == "__main__":  # dist_checkpointing may start processes by spawn, which re-imports __main__
    main()
