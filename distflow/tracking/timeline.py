"""<output_dir>/timeline/rank<k>.jsonl: when each DAG node ran on this rank, one row per node run.

Rows: {"step": the step being run, "node": node id (or "hand_off"), "for_step": the step whose data the node
worked on (later than "step" for a rollout generated ahead: rollout.max_staleness), "start", "end": wall-clock
seconds (time.time(), comparable between the ranks of one machine, and across machines as far as their
clocks agree)}. The record behind the overlap of generation and training: tools/bench_async.py prints it.
"""

import json
from pathlib import Path


class Timeline:
    def __init__(self, output_dir: str | Path, rank: int):
        path = Path(output_dir) / "timeline" / f"rank{rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a")

    def write(self, step: int, spans: list[dict]) -> None:
        for span in spans:
            self.file.write(json.dumps({"step": step, **span}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
