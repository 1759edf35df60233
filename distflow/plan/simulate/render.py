"""The simulation as text (a table of phase seconds, tokens/s, efficiency, multi/single ratio, then the
profile's sources and knobs) and as a PNG (throughput and step breakdown against GPUs)."""

from dataclasses import fields
from pathlib import Path

from distflow.plan.simulate.hardware_profile import Profile
from distflow.plan.simulate.step import PHASES
from distflow.plan.simulate.sweep import Row, efficiency


def render_table(rows: list[Row], profile: Profile, title: str = "") -> str:
    controllers = [c for c in ("multi", "single") if any(c in r.by_controller for r in rows)]
    eff = {c: efficiency(rows, c) for c in controllers}
    head = f"{'GPUs':>5} {'ctrl':<6} " + " ".join(f"{p:>8}" for p in PHASES)
    head += f" {'step s':>8} {'tokens/s':>11} {'eff':>6} {'multi/single':>12}"
    lines = [title] if title else []
    lines += [f"simulated step, profile: {profile.name}", head, "-" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"{r.gpus:>5} skipped: {r.skipped}")
            continue
        for c in controllers:
            s = r.by_controller[c]
            ratio = r.ratio()
            lines.append(
                f"{r.gpus:>5} {c:<6} "
                + " ".join(f"{s.phases[p]:>8.2f}" for p in PHASES)
                + f" {s.seconds:>8.1f} {s.tokens_per_s:>11,.0f} {eff[c][r.gpus]:>6.1%}"
                + (f" {ratio:>11.2f}x" if c == "multi" and ratio else "")
                + (f"  ({'; '.join(s.notes)})" if s.notes else "")
            )
    lines.append(
        "phases in seconds per step; eff: tokens/s per GPU against the smallest GPU count; "
        "multi/single: the multi-controller's throughput over the single controller's"
    )
    return "\n".join(lines)


def render_sources(profile: Profile) -> str:
    lines = ["constants (value: source):"]
    lines += [f"  {name} = {value:.4g}: {source}" for name, value, source in profile.sources()]
    lines.append("assumed knobs (--knob name=value; documented in distflow/plan/simulate/profile.py):")
    lines.append(
        "  " + ", ".join(f"{f.name}={getattr(profile.knobs, f.name)}" for f in fields(profile.knobs))
    )
    if profile.measured:
        lines.append(f"measured by --calibrate: {profile.measured}")
    return "\n".join(lines)


def plot(rows: list[Row], path: str, title: str = "") -> None:
    """Two panels: tokens/s against GPUs (both controllers, and linear scaling from the smallest), and the
    multi-controller's step time by phase."""
    import matplotlib  # noqa: PLC0415 - banned at module level (slow); only --plot needs it

    matplotlib.use("Agg")  # files only: no display on a cluster's login node
    import matplotlib.pyplot as plt  # noqa: PLC0415 - as above

    done = [r for r in rows if not r.skipped]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    gpus = [r.gpus for r in done]
    for c, style in (("multi", "o-"), ("single", "s--")):
        pts = [(r.gpus, r.by_controller[c].tokens_per_s) for r in done if c in r.by_controller]
        if pts:
            ax1.plot(*zip(*pts), style, label=f"{c}-controller")
    if done and "multi" in done[0].by_controller:
        base = done[0].by_controller["multi"].tokens_per_s / done[0].gpus
        ax1.plot(gpus, [base * g for g in gpus], ":", color="grey", label="linear (multi)")
    ax1.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens/s", title="throughput")
    ax1.set_xticks(gpus, [str(g) for g in gpus])
    ax1.minorticks_off()
    ax1.legend()
    bottom = [0.0] * len(done)
    for p in PHASES:
        vals = [r.by_controller["multi"].phases[p] for r in done if "multi" in r.by_controller]
        if len(vals) == len(done):
            ax2.bar([str(g) for g in gpus], vals, bottom=bottom, label=p)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set(xlabel="GPUs", ylabel="seconds", title="multi-controller step by phase")
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
