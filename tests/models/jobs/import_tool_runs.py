"""Runs the rank work of tools/convert_hf_to_megatron.py for several conversions in one torchrun launch.

    torchrun --nproc-per-node N import_tool_runs.py RUNS.json      (RUNS.json: a list of argument lists)

Why one launch: a run of the tool starts torchrun and N ranks that each import torch and Megatron-Core, the
same for every conversion; tests that import several models at the same world size pay that once here.
Every rank does for each argument list what a rank of the tool does under torchrun: the tool's
parse_args and check_input (the HF directory, the layout, an empty --out), then the tool's rank work
(megatron_patches.apply() and convert_rank, which creates and destroys Megatron's groups of that layout).
Only the process group lives across conversions. Every layout must cover the N ranks.
"""

import importlib.util
import json
import sys
from pathlib import Path

import torch.distributed as dist

TOOL = Path(__file__).resolve().parents[3] / "tools" / "convert_hf_to_megatron.py"


def load_tool():
    """The tool's module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("convert_hf_to_megatron", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    runs = json.loads(Path(sys.argv[1]).read_text())
    tool = load_tool()
    # Heavy imports here, not at the top: dist_checkpointing's writer spawns processes that re-import __main__
    import megatron_patches
    from distflow.models.checkpoint_import import convert_rank

    dist.init_process_group("gloo")
    megatron_patches.apply()
    for argv in runs:
        args = tool.parse_args([str(a) for a in argv])
        layout = tool.check_input(args)
        if layout.world_size() != dist.get_world_size():
            sys.exit(
                f"{argv}: the layout {layout} has {layout.world_size()} ranks, this launch "
                f"{dist.get_world_size()}"
            )
        dist.barrier()  # every rank has seen --out empty before rank 0 creates it
        convert_rank(args.hf, args.out, layout)
        if dist.get_rank() == 0:
            print(f"wrote {args.out} from {layout} ({layout.world_size()} rank(s))", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":  # dist_checkpointing's writer starts processes by spawn, which re-imports __main__
    main()
