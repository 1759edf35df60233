"""Does learning hold under bounded staleness? The README main job, disaggregated, at max_staleness 0 and 1.

Example: python tools/bench_async_learning.py            (about 5 minutes per job on 2 CPU cores)

Each job is the main job's GRPO run (examples/configs/grpo_copy_cpu.yaml: the copy task, the hidden-128
tiny model, 80 steps, held-out validation every 10) in the disaggregated placement: rank 0 trains (TP=1),
rank 1 hosts the engine. It makes the model and data the way ci/quickstart.sh does, under outputs/, if
they are not there. Printed per job: the reward curve every 10 steps, the mean reward of the last 5 steps,
the held-out reward and exact-match rate at the last step, and steps/s. Last line: the differences of k > 0
from k = 0 (the target: the last-5 reward within 0.05).
"""

import argparse
import json
import statistics
from pathlib import Path

from main_job_inputs import DATA, MODEL, prepare_main_job_inputs  # tools/, beside this script

from distflow.testing.launch import torchrun


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staleness", default="0,1", help="the max_staleness values; 0 is always run")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", default="outputs/bench_async_learning", help="where the jobs write")
    args = parser.parse_args(argv)
    levels = sorted({0, *(int(k) for k in args.staleness.split(","))})
    prepare_main_job_inputs()
    results = {}
    for k in levels:
        out = Path(args.out).resolve() / f"staleness_{k}"
        print(f"[bench_async_learning] max_staleness={k}: {args.steps} steps ...", flush=True)
        torchrun(
            "distflow.train",
            nproc=2,
            module=True,
            timeout_s=3600,
            args=[
                "examples/configs/grpo_copy_cpu.yaml",
                f"model.path={MODEL}",
                f"data.train_files=[{DATA}/train.parquet]",
                f"data.val_files=[{DATA}/test.parquet]",
                "rollout.placement=disaggregated",
                "rollout.num_ranks=1",
                "actor.tp=1",
                f"rollout.max_staleness={k}",
                f"trainer.total_steps={args.steps}",
                "trainer.val_every=10",
                "checkpoint.resume=never",
                "checkpoint.export_hf=false",
                "tracking.backends=[jsonl]",
                f"trainer.output_dir={out}",
            ],
        )
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        last_val = [r for r in rows if "val/reward/mean" in r][-1]
        results[k] = {
            "last5": statistics.mean(r["reward/mean"] for r in rows[-5:]),
            "val_reward": last_val["val/reward/mean"],
            "val_exact": last_val["val/accuracy"],
            "steps_per_s": (len(rows) - 1) / sum(r["timing_s/step"] for r in rows[1:]),
        }
        curve = " ".join(f"{r['reward/mean']:.2f}" for r in rows[9::10])
        s = results[k]
        print(
            f"  max_staleness={k}: reward every 10 steps {curve}; last 5 steps {s['last5']:.3f}; held-out at "
            f"step {last_val['step']}: reward {s['val_reward']:.3f}, exact {s['val_exact']:.3f}; "
            f"{s['steps_per_s']:.3f} steps/s",
            flush=True,
        )
    base = results[0]
    print(
        "differences from max_staleness=0: "
        + ", ".join(
            f"k={k}: last-5 reward {results[k]['last5'] - base['last5']:+.3f}, held-out reward "
            f"{results[k]['val_reward'] - base['val_reward']:+.3f}, steps/s x"
            f"{results[k]['steps_per_s'] / base['steps_per_s']:.2f}"
            for k in levels
            if k
        )
    )


if __name__ == "__main__":
    main()
