"""trainer.profile_steps: a Chrome trace (JSON) per profiled step and rank, nothing for the other steps."""

import json

import torch

from distflow.tracking.profiling import StepProfiler


def test_profiles_only_the_listed_steps(tmp_path):
    profiler = StepProfiler([2, 4], tmp_path, rank=1)
    for step in range(1, 5):
        with profiler.step(step):
            x = torch.randn(32, 32, requires_grad=True)
            (x @ x).sum().backward()
    traces = profiler.traces()
    assert [t.name.split(".")[0] for t in traces] == ["rank1_step2", "rank1_step4"]
    assert all(t.parent == tmp_path / "profile" / "rank1" for t in traces)
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("name") in ("aten::mm", "aten::matmul") for e in events), sorted(
        {e.get("name") for e in events}
    )


def test_no_steps_no_folder(tmp_path):
    profiler = StepProfiler([], tmp_path, rank=0)
    with profiler.step(1):
        torch.ones(2).sum()
    assert not (tmp_path / "profile").exists()
