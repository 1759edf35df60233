"""The machine a step is simulated on: a hardware profile (JSON, every number with its source) and the
assumed efficiencies (named knobs, documented here), loaded into one `Profile`.

A profile JSON has sections of {"value", "unit", "source"} entries: "device" (flops, hbm_bandwidth,
memory), "intra_node" and "inter_node" (bandwidth, latency), "gpus_per_node", and "host" (memcpy,
serialization, RPC latency, reward cost, cores). Shipped profiles live in distflow/plan/hardware/
(h100, h200, a100 from the public datasheets; host_default for the host side); `--calibrate OUT.json`
writes one measured on the machine it runs on (calibrate.py). A profile that lacks the host section takes
it from host_default.json.
"""

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

HARDWARE_DIR = Path(__file__).resolve().parent.parent / "hardware"
HOST_DEFAULT = HARDWARE_DIR / "host_default.json"


@dataclass(frozen=True)
class Knobs:
    """Assumed efficiencies and data statistics: not measurable from a datasheet, so named and overridable
    (`--knob name=value`). Each default says where it comes from."""

    train_mfu: float = 0.4
    """Achieved / peak FLOP/s of Megatron training passes (dense bf16 models of 7-70B on H100 reach
    40-50% MFU in Megatron-LM's published runs; RL's variable-length micro-batches sit at the low end)."""
    forward_mfu: float = 0.4
    """The same for forward-only passes (old and reference log-probs)."""
    prefill_mfu: float = 0.5
    """Achieved / peak FLOP/s of the engine's prefill (large dense GEMMs)."""
    decode_bandwidth_efficiency: float = 0.6
    """Achieved / peak HBM bandwidth of a decode iteration (weights + KV cache read once per token;
    SGLang with CUDA graphs reaches 60-80% on H100 at batch sizes of tens to hundreds)."""
    decode_iteration_overhead_s: float = 0.0
    """Fixed cost of one decode iteration (scheduler, sampling, launch): 0 on a GPU profile (CUDA graphs
    hide it); a calibrated CPU profile measures it."""
    max_running_requests: int = 512
    """Concurrent sequences of one engine, the cap besides the KV pool (SGLang's --max-running-requests
    for an 80 GB GPU is in the hundreds)."""
    response_length_fraction: float = 0.35
    """Median response length / rollout.max_new_tokens. Reasoning RL on math answers in a few hundred to a
    couple of thousand tokens at max_new_tokens 4-8k."""
    response_length_sigma: float = 0.7
    """Log-normal spread of the response lengths (the straggler tail); clipped at max_new_tokens."""
    prompt_length_fraction: float = 0.3
    """Mean prompt length / data.max_prompt_length (math prompts are a few hundred tokens)."""
    reward_workers_per_rank: float = 1.0
    """Processes that score samples in parallel on each rank (reward.num_workers)."""
    weak_scaling: bool = True
    """True: prompts per step grow with the GPU count (the config's batch at its world size); False: the
    config's batch at every GPU count."""
    seed: int = 0


@dataclass(frozen=True)
class Entry:
    value: float
    source: str
    unit: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    flops: Entry
    hbm_bandwidth: Entry
    memory: Entry
    intra_bandwidth: Entry
    intra_latency: Entry
    inter_bandwidth: Entry
    inter_latency: Entry
    gpus_per_node: Entry
    memcpy_bandwidth: Entry
    serialize_bandwidth: Entry
    serialize_per_object: Entry
    rpc_latency: Entry
    driver_nic_bandwidth: Entry
    reward_seconds_per_sample: Entry
    cores: Entry
    knobs: Knobs = field(default_factory=Knobs)
    measured: dict = field(default_factory=dict)
    """Extra measurements of a calibrated profile (e.g. the engine's per-request cost), by name."""

    def sources(self) -> list[tuple[str, float, str]]:
        return [
            (f.name, getattr(self, f.name).value, getattr(self, f.name).source)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Entry)
        ]

    def with_knobs(self, **changes) -> "Profile":
        return replace(self, knobs=replace(self.knobs, **changes))

    def with_entry(self, name: str, value: float, source: str) -> "Profile":
        return replace(self, **{name: Entry(value, source, getattr(self, name).unit)})


# JSON section/key -> Profile field
_LAYOUT = {
    ("device", "flops"): "flops",
    ("device", "hbm_bandwidth"): "hbm_bandwidth",
    ("device", "memory"): "memory",
    ("intra_node", "bandwidth"): "intra_bandwidth",
    ("intra_node", "latency"): "intra_latency",
    ("inter_node", "bandwidth"): "inter_bandwidth",
    ("inter_node", "latency"): "inter_latency",
    ("gpus_per_node", None): "gpus_per_node",
    ("host", "memcpy_bandwidth"): "memcpy_bandwidth",
    ("host", "serialize_bandwidth"): "serialize_bandwidth",
    ("host", "serialize_per_object"): "serialize_per_object",
    ("host", "rpc_latency"): "rpc_latency",
    ("host", "driver_nic_bandwidth"): "driver_nic_bandwidth",
    ("host", "reward_seconds_per_sample"): "reward_seconds_per_sample",
    ("host", "cores"): "cores",
}


def profile_path(name_or_path: str) -> Path:
    """A shipped profile by name (h100, h200, a100) or a JSON path."""
    shipped = HARDWARE_DIR / f"{name_or_path}.json"
    if shipped.is_file():
        return shipped
    path = Path(name_or_path)
    if not path.is_file():
        names = sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))
        raise FileNotFoundError(f"no hardware profile {name_or_path!r}: a JSON path or one of {names}")
    return path


def load_profile(name_or_path: str, knobs: Knobs = Knobs()) -> Profile:
    data = json.loads(profile_path(name_or_path).read_text())
    if "host" not in data:
        data["host"] = json.loads(HOST_DEFAULT.read_text())["host"]
    values = {}
    for (section, key), name in _LAYOUT.items():
        raw = data.get(section) if key is None else data.get(section, {}).get(key)
        if raw is None:
            raise ValueError(f"hardware profile {name_or_path}: missing {section}.{key}")
        values[name] = Entry(float(raw["value"]), raw.get("source", ""), raw.get("unit", ""))
    knob_values = {k: v for k, v in data.get("knobs", {}).items()}
    knobs = replace(knobs, **{k: v for k, v in knob_values.items() if k not in _explicit(knobs)})
    return Profile(
        name=data.get("name", str(name_or_path)), knobs=knobs, measured=data.get("measured", {}), **values
    )


def _explicit(knobs: Knobs) -> set:
    """Knobs changed from their defaults by the caller: they win over the profile's own."""
    default = Knobs()
    return {f.name for f in fields(Knobs) if getattr(knobs, f.name) != getattr(default, f.name)}


def parse_knobs(pairs: list[str]) -> Knobs:
    """["train_mfu=0.35", ...] -> Knobs; unknown names fail with the list of known ones."""
    known = {f.name: f.type for f in fields(Knobs)}
    changes = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in known:
            raise ValueError(f"unknown knob {name!r}; known: {sorted(known)}")
        default = getattr(Knobs(), name)
        changes[name] = (
            (value.lower() in ("1", "true", "yes")) if isinstance(default, bool) else type(default)(value)
        )
    return Knobs(**changes)
