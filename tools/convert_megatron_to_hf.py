"""Converts a Megatron distributed checkpoint (the import tool's, or an RL run's actor) to Hugging Face.

Examples: python tools/convert_megatron_to_hf.py --megatron /ckpt/qwen3-moe --out /models/qwen3-moe-hf --verify
          python tools/convert_megatron_to_hf.py --megatron outputs/grpo/checkpoints/latest --out /models/step-hf

--megatron takes a folder written by tools/convert_hf_to_megatron.py, or an RL checkpoint: a role folder
(<output_dir>/checkpoints/step_N/actor), a step folder (step_N: its --role, default actor), the run's
checkpoints/ folder or its `latest` file (the newest step). The export of an RL step holds the same tensors
as what the trainer writes to <output_dir>/hf (checkpoint.export_hf) when that step is the last, and the same
bytes when the model fits one --max-shard-size file (the trainer writes one model.safetensors).

Streams one decoder layer at a time from the checkpoint (any layout it was saved from) into sharded
safetensors (model-0000X-of-0000Y.safetensors + model.safetensors.index.json), so memory stays near
--max-shard-size plus the largest layer. config.json, tokenizer and generation config come from the copy
recorded next to the checkpoint (at import, or at each RL save); an RL checkpoint of an older DistFlow has
none: pass --hf-config with the run's model.path. --verify re-reads what was written and compares every
tensor with the checkpoint.
A checkpoint that cannot be exported (missing or unreadable files, a recorded config its tensors disagree
with, an unsupported architecture) stops the tool with exit code 2 and the key, file or field at fault.
"""

import argparse
import sys

from distflow.checkpointing.errors import CheckpointError
from distflow.checkpointing.model_folder import resolve_model_folder
from distflow.config.dtypes import DTYPE_NAMES  # torch-free: --help stays instant
from distflow.models.checkpoint_export import InvalidMegatronCheckpoint, export_to_hf, verify_export


def parse_size(text: str) -> int:
    """'5GB', '500MB', '64KB' or a byte count."""
    units = {"KB": 2**10, "MB": 2**20, "GB": 2**30}
    for unit, factor in units.items():
        if text.upper().endswith(unit):
            return int(float(text[:-2]) * factor)
    return int(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--megatron",
        required=True,
        help="dist checkpoint directory, or an RL checkpoint: step_N[/ROLE], checkpoints/[latest]",
    )
    parser.add_argument(
        "--role", default="actor", help="the role folder to export from an RL step (default actor)"
    )
    parser.add_argument(
        "--hf-config",
        default=None,
        help="HF model directory to take config.json and tokenizer from (default: the copy recorded "
        "with the checkpoint); needed for RL checkpoints of DistFlow before the record",
    )
    parser.add_argument("--out", required=True, help="HF model directory to write (replaced if present)")
    parser.add_argument(
        "--max-shard-size",
        type=parse_size,
        default="5GB",
        help="largest safetensors file, e.g. 5GB, 500MB (bounds memory too)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default=None,
        help="tensor dtype to write (default: the source HF checkpoint's)",
    )
    parser.add_argument("--verify", action="store_true", help="compare the written files with the checkpoint")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    try:
        folder = resolve_model_folder(args.megatron, args.role)
        summary = export_to_hf(
            folder,
            args.out,
            args.max_shard_size,
            args.dtype,
            progress=not args.no_progress,
            hf_source=args.hf_config,
        )
    except (InvalidMegatronCheckpoint, CheckpointError) as error:
        print(f"convert_megatron_to_hf: {error}", file=sys.stderr)
        sys.exit(2)
    print(
        f"wrote {args.out} from {folder}: {summary['tensors']} tensors, {summary['bytes'] / 2**20:.1f} MiB "
        f"in {len(summary['files'])} file(s)"
    )
    if args.verify:
        problems = verify_export(folder, args.out, progress=not args.no_progress, hf_source=args.hf_config)
        if problems:
            print("verify FAILED:\n  " + "\n  ".join(problems[:50]), file=sys.stderr)
            sys.exit(1)
        print("verify: every tensor equals the checkpoint's")


if __name__ == "__main__":
    main()
