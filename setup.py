"""DistFlow: a fully distributed, multi-controller RL post-training framework (Megatron-Core + SGLang)."""

from setuptools import find_packages, setup

setup(
    name="distflow",
    version="0.1.0",
    description="Fully distributed multi-controller RL post-training for LLMs (Megatron-Core + SGLang)",
    python_requires=">=3.11",
    packages=find_packages(include=["distflow", "distflow.*", "megatron_patches", "megatron_patches.*"]),
    package_data={"distflow": ["_cpu_env/**/*", "configs/*.yaml", "plan/hardware/*.json"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.6",
        "megatron-core==0.16.1",
        "psutil",
        "transformers>=4.51",
        "tokenizers",
        "safetensors",
        "pyyaml",
        "pyarrow",
        "tqdm",
    ],
    extras_require={
        # CPU rollout: sglang itself goes in with --no-deps (ci/setup.sh) because its wheel pins a CUDA torch.
        "tracking": ["wandb", "tensorboard"],
        "test": ["pytest", "pytest-timeout", "hypothesis"],
        # GPU only, never installed on CPU machines. Apex is built from source (docs/install.md).
        "gpu": ["transformer-engine[pytorch]", "sglang[all]==0.5.23"],
    },
    entry_points={"console_scripts": ["distflow-train=distflow.train:main"]},
)
