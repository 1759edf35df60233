"""Converts a Hugging Face model directory into a Megatron distributed checkpoint (torch_dist format).

Example: python tools/convert_hf_to_megatron.py --hf /models/Qwen3-30B-A3B --out /ckpt/qwen3-moe --tp 2 --ep 4

The checkpoint is written from the given layout (one process per rank, started here with torchrun on
gloo, so it runs on CPU) and loads into any other layout; it holds GPTModel.sharded_state_dict() of the
local layer spec plus distflow_hf_source.json and hf_assets/ (config, tokenizer) for
tools/convert_megatron_to_hf.py. The HF directory is checked against its config first: a missing, extra or
misshapen tensor or an unsupported architecture stops the tool (exit code 2) with the names at fault.
"""

import argparse
import os
import signal
import subprocess
import sys

import torch.distributed as dist

from distflow.models.checkpoint_import import CheckpointLayout, convert_rank
from distflow.models.conversion import HFCheckpoint
from distflow.models.hf_validation import InvalidHFCheckpoint, check_hf_checkpoint


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", required=True, help="HF model directory (config.json + safetensors)")
    parser.add_argument("--out", required=True, help="output checkpoint directory")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    parser.add_argument("--ep", type=int, default=1, help="expert parallel size (MoE)")
    parser.add_argument("--etp", type=int, default=None, help="expert tensor parallel size (default: --tp)")
    parser.add_argument("--vpp", type=int, default=None, help="virtual pipeline stages per rank")
    parser.add_argument(
        "--timeout", type=float, default=24 * 3600, help="seconds before the ranks are killed"
    )
    return parser.parse_args(argv)


def check_input(args) -> CheckpointLayout:
    """Validates the HF directory and the layout in this process, before any rank starts."""
    layout = CheckpointLayout(tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp, vpp=args.vpp)
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise ValueError(f"--out {args.out} is not empty; a dist checkpoint needs a fresh directory")
    ckpt = HFCheckpoint(args.hf)
    check_hf_checkpoint(ckpt)
    layout.validate(ckpt.config)
    return layout


def run_rank(args, layout: CheckpointLayout) -> None:
    """One rank's work, under torchrun (or alone for a 1-process layout)."""
    import megatron_patches  # noqa: PLC0415 - patches Megatron-Core (heavy): only in the conversion ranks

    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    megatron_patches.apply()
    convert_rank(args.hf, args.out, layout)
    dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        layout = check_input(args)
    except (InvalidHFCheckpoint, ValueError, FileNotFoundError) as error:
        print(f"convert_hf_to_megatron: {error}", file=sys.stderr)
        sys.exit(2)
    world = layout.world_size()
    if "RANK" in os.environ or world == 1:
        run_rank(args, layout)
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"wrote {args.out} from {layout} ({world} rank(s))")
        return
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        os.path.abspath(__file__),
        *(argv if argv is not None else sys.argv[1:]),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        sys.exit(proc.wait(timeout=args.timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks (a hung writer would wait forever)
        sys.exit(f"convert_hf_to_megatron: the {world} ranks did not finish in {args.timeout:.0f} s")


if __name__ == "__main__":  # dist_checkpointing's writer starts processes by spawn, which re-imports __main__
    main()
