"""Runs config validation + pre-flight for many override sets in one process (imports are paid once) and
reports each outcome and the heavy modules imported by the end.

    python preflight_cases.py CONFIG.yaml CASES.json RESULT.json
CASES.json: {case name: [override, ...]}. RESULT.json: {"results": {case: error message or null},
"kept": {case: {split: prompts}}, "heavy_modules": [...]}.
"""

import json
import sys

from distflow.config import ConfigError, resolve
from distflow.preflight import preflight

HEAVY = ("megatron", "sglang", "transformers.models.qwen2.modeling_qwen2", "transformers.modeling_utils")


def main(config: str, cases_file: str, result_file: str) -> None:
    results, kept = {}, {}
    for name, overrides in json.loads(open(cases_file).read()).items():
        try:
            kept[name] = preflight(resolve(config, overrides)).prompts
            results[name] = None
        except ConfigError as err:
            results[name] = str(err)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "sglang") or m in HEAVY)
    open(result_file, "w").write(json.dumps({"results": results, "kept": kept, "heavy_modules": heavy}))


if __name__ == "__main__":
    main(*sys.argv[1:])
