"""Every launch script in examples/ passes its dry run at its intended world size, and the memory it prints
for the 7B and 70B runs agrees with a hand calculation; the SLURM wrapper and the torchrun command line."""

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GiB = 2**30

# script -> (world size, lines its plan must print, warnings it is expected to print)
SCRIPTS = {
    "grpo_qwen2.5_0.5b_1gpu.sh": (
        1,
        [
            "colocated: every rank (0-0)",
            "actor: tp=1 pp=1 dp=1",
            "rollout: 1 SGLang engine(s) x TP 1",
            "pipeline grpo",
        ],
        [],
    ),
    "grpo_qwen2.5_7b_1node.sh": (
        8,
        [
            "colocated: every rank (0-7)",
            "actor: tp=2 pp=1 dp=4",
            "rollout: 4 SGLang engine(s) x TP 2",
            "pipeline grpo",
        ],
        [],
    ),
    "grpo_qwen2.5_7b_disaggregated.sh": (
        16,
        [
            "disaggregated: training ranks 0-7 (node 0), engine ranks 8-15 (node 1)",
            "actor: tp=2 pp=1 dp=4",
            "rollout: 8 SGLang engine(s) x TP 1",
        ],
        [],
    ),
    "dapo_qwen2.5_32b_4nodes.sh": (
        32,
        ["actor: tp=4 pp=2 dp=4", "ref: off", "pipeline dapo", "rollout: 8 SGLang engine(s) x TP 4"],
        [],
    ),
    "grpo_qwen2.5_72b_8nodes.sh": (
        64,
        ["actor: tp=8 pp=2 dp=4", "ref: tp=8 pp=2 dp=4", "rollout: 8 SGLang engine(s) x TP 8"],
        [],
    ),
    "ppo_llama3.1_70b_16nodes.sh": (
        128,
        [
            "actor: tp=8 pp=4 dp=4",
            "critic: tp=8 pp=4 dp=4",
            "pipeline ppo",
            "phase train_critic",
            "rollout: 16 SGLang engine(s) x TP 8",
        ],
        [],
    ),
    "grpo_qwen3_30b_a3b_2nodes.sh": (
        16,
        ["actor: tp=4 pp=1 dp=4 cp=1 ep=8 etp=1", "expert DP 2", "rollout: 4 SGLang engine(s) x TP 4"],
        [],
    ),
    "grpo_qwen3_235b_a22b_16nodes.sh": (
        128,
        [
            "actor: tp=4 pp=2 dp=16 cp=1 ep=64 etp=1",
            "rollout: 8 SGLang engine(s) x TP 16",
            "an engine spans 2 nodes",
        ],
        [],
    ),
}
GPUS_PER_NODE = {"grpo_qwen2.5_0.5b_1gpu.sh": 1}  # the scripts' default GPUS_PER_NODE where it is not 8


def run_script(script: str, extra_env=None, args=(), timeout=300) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DRY_RUN": "1",
        "MODEL_PATH": "/nonexistent/model",
        **(extra_env or {}),
    }
    for key in ("NNODES", "NODE_RANK", "GPUS_PER_NODE", "GPU_MEMORY_GB"):
        if key not in (extra_env or {}):
            env.pop(key, None)
    return subprocess.run(
        ["bash", str(EXAMPLES / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


@pytest.fixture(scope="module")
def plans() -> dict[str, str]:
    out = {}
    for script in SCRIPTS:
        result = run_script(script)
        assert result.returncode == 0, f"{script}: exit {result.returncode}\n{result.stderr}\n{result.stdout}"
        out[script] = result.stdout
    return out


def test_every_script_is_shipped():
    shipped = {p.name for p in EXAMPLES.glob("*.sh")}
    assert shipped == set(SCRIPTS), "add new scripts to SCRIPTS (with their world size and key lines)"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_dry_run_at_the_intended_world_size(plans, script):
    world, lines, expected_warnings = SCRIPTS[script]
    out = plans[script]
    gpus = GPUS_PER_NODE.get(script, 8)
    assert f"DistFlow plan: world size {world} ({world // gpus} node(s) x {gpus} GPUs)" in out
    for section in (
        "== placement and layouts",
        "== memory per GPU",
        "phase generate",
        "phase train_actor",
        "== data plan",
        "== weight sync",
        "lower bound",
    ):
        assert section in out, f"{script}: no {section!r}"
    for line in lines:
        assert line in out, f"{script}: no {line!r}\n{out}"
    warnings = [w for w in out.splitlines() if w.startswith("WARNING")]
    assert len(warnings) == len(expected_warnings), "\n".join(warnings)
    for w, expected in zip(warnings, expected_warnings):
        assert expected in w
    assert " OVER" not in out, f"{script} runs out of memory:\n{out}"


def printed_gib(out: str, role: str) -> dict[str, float]:
    line = next(line for line in out.splitlines() if re.match(rf"{role}\s+stage \d+:", line))
    return {k: float(v) for k, v in re.findall(r"(weights|grads|optimizer|activations) ([\d.]+)", line)}


def test_7b_memory_matches_a_hand_calculation(plans):
    """grpo_qwen2.5_7b_1node.sh: Qwen2.5-7B, actor TP 2 x DP 4, 16384-token micro-batches, full recompute, SP."""
    h, L, a, g, d, f, V = 3584, 28, 28, 4, 128, 18944, 152064
    per_layer = (
        h * a * d
        + 2 * h * g * d
        + a * d * h  # q, k, v, o projections
        + (a * d + 2 * g * d)  # q/k/v biases (Qwen2)
        + 3 * h * f  # SwiGLU MLP: gate, up, down
        + 2 * h
    )  # two RMSNorms
    P = L * per_layer + 2 * V * h + h  # untied embeddings + output layer, final norm
    assert P == pytest.approx(7.62e9, rel=0.005)  # the published 7.61 B
    tp, dp = 2, 4
    per_gpu = P / tp
    hand = {
        "weights": 2 * per_gpu,  # bf16
        "grads": 4 * per_gpu,  # fp32 gradient buffer
        "optimizer": 12 * per_gpu / dp,
    }  # fp32 master + Adam m, v, sharded over DP
    tokens, s = 16384, 1024 + 3072  # token budget; longest sequence (prompt + response)
    stored = L * 2 * tokens * h / tp  # full recompute: each layer's input (SP: / tp)
    # the layer being recomputed: norm/linear inputs, q k v and attention output, SwiGLU, and the softmax
    # that unfused attention (Megatron's local spec, what the worker builds today) keeps: a*s per token
    one_layer = 2 * tokens * (4 * h + 2 * a * d + 2 * g * d + 3 * f + a * s) / tp
    logits = 6 * tokens * V / tp  # bf16 logits + their fp32 copy
    hand["activations"] = stored + one_layer + logits
    printed = printed_gib(plans["grpo_qwen2.5_7b_1node.sh"], "actor")
    for key, value in hand.items():
        assert printed[key] == pytest.approx(value / GiB, rel=0.15), (key, printed[key], value / GiB)
    ref = printed_gib(plans["grpo_qwen2.5_7b_1node.sh"], "ref")
    assert ref["weights"] == pytest.approx(2 * P / tp / GiB, rel=0.15)


def test_70b_memory_matches_a_hand_calculation(plans):
    """ppo_llama3.1_70b_16nodes.sh: Llama-3.1-70B actor and critic at TP 8 x PP 4 x DP 4, reference at TP 8 x PP 4."""
    h, L, a, g, d, f, V = 8192, 80, 64, 8, 128, 28672, 128256
    per_layer = h * a * d + 2 * h * g * d + a * d * h + 3 * h * f + 2 * h  # no biases in Llama
    P = L * per_layer + 2 * V * h + h
    assert P == pytest.approx(70.55e9, rel=0.005)
    tp, pp, dp = 8, 4, 4
    per_gpu = P / (tp * pp)  # embeddings sit on the first/last stage: a few % more there
    states = 2 * per_gpu + 4 * per_gpu + 12 * per_gpu / dp
    out = plans["ppo_llama3.1_70b_16nodes.sh"]
    for role in ("actor", "critic"):
        printed = printed_gib(out, role)
        total = printed["weights"] + printed["grads"] + printed["optimizer"]
        assert total == pytest.approx(states / GiB, rel=0.15), (role, total, states / GiB)
    assert printed_gib(out, "ref")["weights"] == pytest.approx(2 * per_gpu / GiB, rel=0.15)


def test_environment_changes_the_world_size():
    result = run_script("grpo_qwen3_235b_a22b_16nodes.sh", {"NNODES": "32"})
    assert result.returncode == 0, result.stderr
    assert "world size 256 (32 node(s) x 8 GPUs)" in result.stdout
    assert "actor: tp=4 pp=2 dp=32 cp=1 ep=64 etp=1" in result.stdout and "expert DP 2" in result.stdout


def test_extra_overrides_reach_the_plan_and_bad_layouts_fail():
    result = run_script("grpo_qwen2.5_72b_8nodes.sh", args=["actor.tp=3"])
    assert result.returncode == 2
    assert "LayoutError" in result.stderr and "not divisible by tp*pp*cp" in result.stderr


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_torchrun_command_line(tmp_path):
    _stub(tmp_path, "torchrun", 'printf "%s\\n" "$@"\n')
    env = {
        "DRY_RUN": "0",
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "NNODES": "8",
        "NODE_RANK": "3",
        "MASTER_ADDR": "node-0",
        "MASTER_PORT": "29555",
        "MODEL_PATH": "/models/Qwen2.5-72B",
        "CKPT_DIR": "/ckpt/run1",
        "WANDB_RUN": "try1",
    }
    result = run_script("grpo_qwen2.5_72b_8nodes.sh", env, args=["trainer.total_steps=5"])
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    assert argv[:12] == [
        "--nnodes",
        "8",
        "--node-rank",
        "3",
        "--master-addr",
        "node-0",
        "--master-port",
        "29555",
        "--nproc-per-node",
        "8",
        "--max-restarts",  # a lost rank restarts the job, which resumes from its last checkpoint
        "2",
    ]
    assert argv[12:14] == ["-m", "distflow.train"] and argv[14].endswith("examples/configs/gpu_base.yaml")
    for item in (
        "model.path=/models/Qwen2.5-72B",
        "actor.tp=8",
        "actor.pp=2",
        "rollout.engine_tp=8",
        "trainer.output_dir=/ckpt/run1",
        "tracking.run_name=try1",
        "checkpoint.resume=auto",
    ):
        assert item in argv
    assert argv[-1] == "trainer.total_steps=5"  # the user's overrides come last and win


def test_slurm_wrapper_runs_the_script_once_per_node(tmp_path):
    _stub(tmp_path, "scontrol", 'printf "gpu-a\\ngpu-b\\n"\n')
    # srun: drop its options, then run the command once per node with that node's SLURM_NODEID.
    _stub(
        tmp_path,
        "srun",
        'while [[ "$1" == --* ]]; do shift; done\n'
        'for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" || exit 1; done\n',
    )
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "DRY_RUN": "1",
        "MODEL_PATH": "/nonexistent/model",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu-[a-b]",
        "SLURM_JOB_ID": "4242",
        "SLURM_GPUS_ON_NODE": "8",
    }
    for key in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "GPUS_PER_NODE"):
        env.pop(key, None)
    result = subprocess.run(
        [
            "bash",
            str(EXAMPLES / "slurm" / "sbatch_distflow.sh"),
            str(EXAMPLES / "grpo_qwen2.5_7b_disaggregated.sh"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "on 2 node(s) x 8 GPUs, rendezvous gpu-a:24242" in result.stdout
    assert result.stdout.count("DistFlow plan: world size 16 (2 node(s) x 8 GPUs)") == 2


def _slurm_stubs(tmp_path: Path, srun_body: str) -> dict:
    """scontrol (hostnames; `requeue` recorded in requeued.txt) and srun stubs, and the batch environment."""
    _stub(
        tmp_path,
        "scontrol",
        f'if [[ "$1" == requeue ]]; then echo "$2" >> {tmp_path}/requeued.txt; exit 0; fi\n'
        'printf "gpu-a\\n"\n',
    )
    _stub(tmp_path, "srun", srun_body)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "gpu-a",
        "SLURM_JOB_ID": "4242",
        "SLURM_GPUS_ON_NODE": "8",
    }
    for key in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "GPUS_PER_NODE", "SLURM_RESTART_COUNT"):
        env.pop(key, None)
    return env


def _wrapper(env: dict, **popen) -> subprocess.Popen:
    script = EXAMPLES / "grpo_qwen2.5_7b_disaggregated.sh"
    cmd = ["bash", str(EXAMPLES / "slurm" / "sbatch_distflow.sh"), str(script)]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


@pytest.mark.parametrize("requeues, expected", [("0", ["4242"]), ("2", ["4242"]), ("3", None)])
def test_slurm_wrapper_requeues_a_failed_run_up_to_max_requeues(tmp_path, requeues, expected):
    env = {**_slurm_stubs(tmp_path, "exit 3\n"), "SLURM_RESTART_COUNT": requeues, "MAX_REQUEUES": "3"}
    proc = _wrapper(env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    requeued = tmp_path / "requeued.txt"
    if expected is None:
        assert not requeued.exists() and "not requeued: 3 requeue(s) already (MAX_REQUEUES=3)" in out, out
    else:
        assert requeued.read_text().split() == expected
        assert f"requeue {int(requeues) + 1} of MAX_REQUEUES=3" in out, out


def test_slurm_wrapper_leaves_a_finished_run_alone(tmp_path):
    proc = _wrapper(_slurm_stubs(tmp_path, "exit 0\n"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not (tmp_path / "requeued.txt").exists(), out


def test_slurm_wrapper_stops_the_ranks_and_requeues_before_the_time_limit(tmp_path):
    """SLURM's USR1 (--signal=B:USR1@300) to the batch shell: srun gets SIGTERM, then the job is requeued."""
    # srun stand-in: runs until SIGTERM (its sleep keeps no pipe of ours open), which it records.
    srun = f'trap "kill $!; echo terminated > {tmp_path}/srun.txt; exit 143" TERM\n'
    srun += f"echo started > {tmp_path}/srun.txt\nsleep 60 > /dev/null 2>&1 &\nwait\n"
    proc = _wrapper(_slurm_stubs(tmp_path, srun))
    deadline = time.monotonic() + 30
    while not (tmp_path / "srun.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert (tmp_path / "srun.txt").read_text().strip() == "terminated", out
    assert (tmp_path / "requeued.txt").read_text().split() == ["4242"], out
    assert "stopped before the time limit: requeueing job 4242" in out, out
