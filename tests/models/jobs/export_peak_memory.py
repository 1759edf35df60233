"""Measures the resident memory that tools/convert_megatron_to_hf.py's export adds, in a fresh process.

    python export_peak_memory.py CKPT OUT_DIR MAX_SHARD_BYTES RESULT.json
Writes {"baseline_rss", "peak_rss", "added_peak", "written_bytes"} in bytes: RSS after imports and before
the export, the process's high-water mark (VmHWM) after it, and their difference.
"""

import json
import sys


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def main() -> None:
    ckpt, out, max_shard, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    from distflow.models import checkpoint_export  # noqa: F401  (all imports before the baseline)

    baseline = status_bytes("VmRSS")
    summary = checkpoint_export.export_to_hf(ckpt, out, max_shard_bytes=max_shard, progress=False)
    peak = status_bytes("VmHWM")
    with open(result, "w") as f:
        json.dump(
            {
                "baseline_rss": baseline,
                "peak_rss": peak,
                "added_peak": peak - baseline,
                "written_bytes": summary["bytes"],
                "files": len(summary["files"]),
            },
            f,
        )


if __name__ == "__main__":
    main()
