"""tools/summarize_run.py, what the main job prints after training: the curve of any run, and a clear line
(not an IndexError) for a run that logged no step, such as a finished run resumed with nothing to train."""

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).parents[2] / "tools" / "summarize_run.py"


def _summarize(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), str(run_dir), "--every", "2"], capture_output=True, text=True, timeout=60
    )


def test_prints_reward_held_out_and_entropy(tmp_path):
    rows = [{"step": s, "reward/mean": 0.1 * s, "actor/entropy": 3.0 - s} for s in range(1, 6)]
    rows[0].update({"val/reward/mean": 0.2, "val/accuracy": 0.0})
    rows[3].update({"val/reward/mean": 0.6, "val/accuracy": 0.5})
    rows.append({"step": 5, "reward/mean": 0.9, "actor/entropy": 0.5})  # a step logged twice: the later wins
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _summarize(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("  step")] == ["1", "3", "5"]
    assert "held-out 0.20 (exact 0.00)" in lines[1]  # step 1
    assert "held-out 0.20 (exact 0.00)" in lines[2]  # step 3: the latest validation at or before it
    assert "0.900" in lines[3] and "held-out 0.60 (exact 0.50)" in lines[3]
    assert lines[-1] == "entropy 2.00 (step 1) -> 0.50 (step 5)"


def test_a_run_without_steps_is_a_sentence_not_a_traceback(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    result = _summarize(tmp_path)
    assert result.returncode == 0 and "no RL step was logged" in result.stdout, result
    missing = _summarize(tmp_path / "absent")
    assert missing.returncode == 0 and "no metrics at" in missing.stdout, missing
