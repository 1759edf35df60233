"""The CPU environment's start-up hook (distflow/cpu_support/startup), which every interpreter of the venv
loads: SGLang's host buffers (the MoE routes buffer among them) are plain CPU memory on a torch without
CUDA, where pinning them with cudaHostRegister fails. Checked in a fresh interpreter, where the hook ran."""

import subprocess
import sys

import pytest
import torch

CHECK = """
import torch
from sglang.srt.mem_cache.pool_host.common import ALLOC_MEMORY_FUNCS, HostTensorAllocator
buffer = ALLOC_MEMORY_FUNCS["cpu"]((4, 2, 2), dtype=torch.int32, device="cpu", pin_memory=True, allocator=HostTensorAllocator())
print(tuple(buffer.shape), buffer.dtype, buffer.device)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the hook changes nothing where CUDA pins memory")
def test_sglang_host_buffers_allocate_without_cuda():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "(4, 2, 2) torch.int32 cpu", out.stdout
