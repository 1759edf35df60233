"""Checks of what an engine holds against what the weight sync meant it to hold (on the engine's owner).

- First sync: the plan's tensor names and shapes must be exactly the engine's parameters (a name the engine
  lacks would kill its scheduler mid-load).
- sync.verify: the owner asks every engine rank for the checksum of each parameter (engine_side.probe) and
  compares, per bucket, with the sum of the shares the senders computed from their own shards.
- Counted loads (engine_side.load_counted): what a loader could not load is recorded in the engine (raising
  there would kill the scheduler) and reported here.
"""

import os
import tempfile

import torch

from distflow.coordination.weights import checksum as wsum
from distflow.coordination.weights import engine_side
from distflow.coordination.weights.rank_errors import WeightSyncError


class WeightVerifyError(WeightSyncError):
    """sync.verify found engine weights that differ from what the trainer sent."""


class EngineVerifier:
    """The checks for the engine `engine_index` of `plan`, on its owner. call(what, method, *args, **kwargs):
    the resharder's engine call (raises on a failed or dead engine)."""

    def __init__(self, plan, engine_index: int, call):
        self.plan, self.engine_index, self.call = plan, engine_index, call
        self.last_reports: list[dict] | None = None
        """Each engine rank's report from the last verify() (set before its checks, so also after a failure)."""

    def probe(self, checksums: bool) -> list[dict]:
        """Every engine rank's report (engine_side.probe): parameters, received bytes, errors."""
        with tempfile.TemporaryDirectory(prefix="distflow-probe-") as tmp:
            out = os.path.join(tmp, "report.pt")
            self.call("begin_weight_update (probe)", "begin_weight_update")
            try:
                self.call(
                    "probe",
                    "update_weights_from_tensor",
                    engine_side.probe_request(out, checksums),
                    load_format=engine_side.PROBE,
                    flush_cache=False,
                )
            finally:
                self.call("end_weight_update (probe)", "end_weight_update")
            return torch.load(out)

    def check_layout(self) -> None:
        """The plan's tensor names and shapes are exactly the engine's parameters, or ValueError naming one."""
        if self.plan.shared:
            return
        reports = self.probe(checksums=False)
        for rp, report in zip(self.plan.engines[self.engine_index], reports):
            engine_params = {n: tuple(p["shape"]) for n, p in report["params"].items()}
            planned = {name: tuple(shape) for name, shape in rp.param_shapes.items()}
            for name in sorted(set(engine_params) | set(planned)):
                if engine_params.get(name) != planned.get(name):
                    raise ValueError(
                        f"engine rank {rp.rank}: parameter {name!r} has shape {engine_params.get(name)} "
                        f"in the engine but {planned.get(name)} in the weight plan "
                        "(None: absent); the family's SGLang layout does not match this engine"
                    )

    def raise_load_errors(self, reports: list[dict]) -> None:
        for rp, report in zip(self.plan.engines[self.engine_index], reports):
            if report["errors"]:
                raise WeightVerifyError(f"engine rank {rp.rank} rejected tensors: {report['errors'][:3]}")

    def verify(self, expected: dict) -> None:
        """Compares every engine rank's parameter checksums with the senders' shares (expected: (engine, engine
        rank, parameter) -> [shares]); raises WeightVerifyError naming the parameters that differ."""
        e = self.engine_index
        reports = self.last_reports = self.probe(checksums=True)
        self.raise_load_errors(reports)
        if self.plan.shared:
            return  # HF names: SGLang's loader fused them; the outputs are compared by tests
        for rp in self.plan.engines[e]:
            report = reports[rp.rank]
            for b, names in enumerate(self.plan.buckets):
                # A parameter sent in row ranges is checked whole, at its last range's bucket.
                params = [
                    t.param_name
                    for t in map(rp.by_name.get, names)
                    if t.param is None or t.row_offset + t.shape[0] == t.param_rows
                ]
                want = {n: wsum.combine(expected.get((e, rp.rank, n), [])) for n in params}
                got = {n: report["params"][n]["checksum"] for n in params}
                if want != got:
                    bad = [n for n in params if want[n] != got[n]]
                    raise WeightVerifyError(
                        f"bucket {b}: engine {e} rank {rp.rank} holds different weights than "
                        f"the trainer sent for {bad}"
                    )
