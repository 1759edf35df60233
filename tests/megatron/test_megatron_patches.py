"""megatron_patches.apply(): which patches it reports, that a second call changes nothing, and that the
patches stay inside Megatron. Runs in a fresh interpreter (jobs/apply_patches_twice_job.py) so that this
test process is never patched."""

import json
import sys
from pathlib import Path

import pytest

from distflow.testing.launch import run

JOB = Path(__file__).parent / "jobs" / "apply_patches_twice_job.py"
CUDA_PATCHES = {
    "cuda_device",
    "cuda_tensor_placement",
    "cuda_tensor_methods",
    "cuda_streams",
    "cuda_rng_tracker",
    "moe_alltoall_split_sizes",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("patches") / "report.json"
    run([sys.executable, str(JOB), str(out)], timeout_s=120)
    return json.loads(out.read_text())


def test_apply_is_idempotent_and_reports_its_patches(report):
    assert report["second"] == report["first"], "a second apply() must report the same patches"
    assert report["changed_by_second_call"] == [], "a second apply() must not replace anything"
    names = report["first"]
    assert len(set(names)) == len(names)
    if report["cuda_available"]:
        assert not set(names) & CUDA_PATCHES
    else:
        assert CUDA_PATCHES <= set(names)
    # This environment has neither Transformer Engine nor Apex (shared/ENVIRONMENT.md).
    assert {"moe_te_general_gemm", "sequence_parallel_torch_norm"} <= set(names)


def test_patches_stay_inside_megatron(report):
    if report["cuda_available"]:
        pytest.skip("the CUDA patches are not applied where CUDA works")
    probes = report["probes"]
    assert probes["current_device"] == "device(type='cpu')"
    assert probes["causal_mask_device"] == "'cpu'"  # a factory inside a patched Megatron module
    assert probes["plain_torch_cuda_factory"].startswith("AssertionError")  # torch itself is untouched
    assert probes["tensor_type_outside_megatron"] == "'torch.FloatTensor'"
