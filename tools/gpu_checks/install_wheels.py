"""Installs carried wheels into a folder for PYTHONPATH, without shadowing what the machine already has.

    python tools/gpu_checks/install_wheels.py WHEELS_DIR TARGET_DIR

Standard library only: it runs before any carried package is importable. A wheel whose top-level modules all
import already is skipped (the machine's numpy, built for its own Python, stays in charge). Otherwise pip
installs it (--no-deps, --no-index); if pip refuses it for being tagged for another Python, its files are
unpacked as they are: their pure-Python modules work on any Python 3 (megatron-core's one compiled module
builds dataset indices, which DistFlow does not use). Prints one line per wheel.
"""

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path


def top_level_modules(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
    modules = {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}
    return sorted(m for m in modules if m.isidentifier())


def install(wheels_dir: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels_dir.glob("*.whl")):
        modules = top_level_modules(wheel)
        if modules and all(importlib.util.find_spec(m) is not None for m in modules):
            print(f"{wheel.name}: skipped, {', '.join(modules)} already importable", flush=True)
            continue
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target"]
        if subprocess.run([*pip, str(target), str(wheel)], capture_output=True).returncode == 0:
            print(f"{wheel.name}: installed", flush=True)
            continue
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        print(f"{wheel.name}: unpacked (pip refused it for this Python)", flush=True)


if __name__ == "__main__":
    install(Path(sys.argv[1]), Path(sys.argv[2]))
