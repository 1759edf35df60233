"""Runs tools/convert_megatron_to_hf.py's main once per argument list, all in this one process.

    python export_tool_runs.py RESULTS.json RUNS.json      (RUNS.json: a list of argument lists)

Why one process: a run of the tool spends most of its time starting Python, torch and the checkpoint
readers, the same for every run; tests that export several checkpoints pay that once here. Each run is
what a user's `python tools/convert_megatron_to_hf.py ARGS` does after start-up: its stdout and stderr
are captured, an exit through sys.exit gives its code, and an uncaught exception gives exit code 1 with
the traceback on stderr, as the interpreter would; a warning shown once per location shows again in each
run, as in a fresh process. Writes a list of {"args", "returncode", "stdout",
"stderr"}, one per run, in order.
"""

import contextlib
import importlib.util
import io
import json
import sys
import traceback
import warnings
from pathlib import Path

TOOL = Path(__file__).resolve().parents[3] / "tools" / "convert_megatron_to_hf.py"


def load_tool():
    """The tool's module (tools/ is not a package): its main(argv) is what its command line runs."""
    spec = importlib.util.spec_from_file_location("convert_megatron_to_hf", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(main, argv: list[str]) -> dict:
    """One command-line run of the tool's main(argv), in this process."""
    stdout, stderr = io.StringIO(), io.StringIO()
    # catch_warnings resets the once-per-location registries on entry and restores the filters on exit
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), warnings.catch_warnings():
        try:
            main(argv)
            returncode = 0
        except SystemExit as exit_:
            # sys.exit(None) is 0, sys.exit(int) that int, sys.exit(str) prints the text and gives 1
            if exit_.code is None or isinstance(exit_.code, int):
                returncode = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                returncode = 1
        except Exception:  # noqa: BLE001 - the interpreter's behaviour for an uncaught exception
            traceback.print_exc()
            returncode = 1
    return {"args": argv, "returncode": returncode, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def main() -> None:
    results_path, runs_path = sys.argv[1:3]
    runs = json.loads(Path(runs_path).read_text())
    if not isinstance(runs, list) or not all(isinstance(r, list) for r in runs):
        sys.exit(f"{runs_path}: expected a JSON list of argument lists, got {type(runs).__name__}")
    tool = load_tool()
    results = [run_tool(tool.main, [str(a) for a in argv]) for argv in runs]
    Path(results_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
