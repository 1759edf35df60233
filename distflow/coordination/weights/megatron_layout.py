"""Where each Hugging Face tensor's data lives in a Megatron model trained in a given parallel layout (pure).

`TrainedModelLayout.parts(hf_name, region)` answers: which Megatron parameter (by its global name, i.e.
with global layer indices), on which pipeline stage and TP rank, holds which region of its local shard,
for a region of a full HF tensor. It composes two exact index maps, one dimension at a time:
- HF -> full Megatron tensor (weight_mapping): q/k/v rows go to Megatron's per-query-group interleave
  [q heads of group g, k_g, v_g], gate/up rows to the two halves of linear_fc1, everything else is a copy;
- full -> TP shard (tp_sharding): rows split for linear_qkv and the (padded) vocabulary, each half of
  linear_fc1 split separately, columns split for linear_proj/linear_fc2, norms replicated.
Layers are assigned to stages as Megatron does by default (even split; with virtual stages, chunk c holds
layers c*L/(pp*vpp)...; chunk c lives on stage c % pp). MoE: routed expert e lives on expert-parallel rank
e // (E / ep), split over the expert-TP group (ETP) like a dense MLP over TP; Megatron names it by its local
index there, these global names by e (`mlp.experts.local_experts.<e>`, as in an EP=1 model). Within a
stage, expert ranks are ordered etp fastest, then ep, then expert-DP (Megatron's expert rank generator).
"""

from dataclasses import dataclass

from distflow.coordination.weights.regions import Region
from distflow.coordination.weights.sglang_layout import Dims, hf_tensor_shape
from distflow.layout import ParallelLayout
from distflow.models import tp_sharding, weight_mapping
from distflow.models.moe import num_experts
from distflow.models.spec import as_config_dict

_EXPERT = tp_sharding.LOCAL_EXPERT


@dataclass(frozen=True)
class MegatronPart:
    """`extent` elements at `offset` (relative to the HF region's start) come from `src` of the local shard of
    Megatron parameter `name` on pipeline stage `stage`, TP rank `tp_rank` (None: every TP rank holds it).
    Routed experts: `ep_rank` holds it, and tp_rank is the rank in the expert-TP group."""

    stage: int
    tp_rank: int | None
    name: str
    src: Region
    offset: tuple[int, ...]
    extent: tuple[int, ...]
    ep_rank: int | None = None


@dataclass(frozen=True)
class _Source:
    name: str  # global Megatron name
    kind: str  # weight_mapping COPY / QKV / GATE_UP
    index: int  # position of the HF tensor in the rule's HF list
    stage: int
    expert: int | None = None  # global routed-expert index


class TrainedModelLayout:
    """The trained model's parameters in `layout` (TP/PP/VPP), indexed by the HF tensors they hold.

    padded_vocab: Megatron's vocabulary rows (GPTModel.vocab_size); default: the worker's padding rule.
    """

    def __init__(
        self,
        spec,
        hf_config,
        layout: ParallelLayout,
        padded_vocab: int | None = None,
        hf_shapes: dict[str, tuple] | None = None,
    ):
        self.spec, self.cfg, self.layout = spec, as_config_dict(hf_config), layout
        self.dims = Dims.of(self.cfg)
        chunks = layout.pp * layout.vpp
        if self.dims.layers % chunks:
            raise ValueError(
                f"{self.dims.layers} layers do not split evenly over pp*vpp = {chunks} model chunks"
            )
        self.layers_per_chunk = self.dims.layers // chunks
        self.num_experts = num_experts(self.cfg) if spec.moe else 0
        if self.num_experts % layout.ep:
            raise ValueError(f"{self.num_experts} experts do not split over ep={layout.ep}")
        self.padded_vocab = padded_vocab or tp_sharding.padded_vocab_size(self.dims.vocab, layout.tp)
        self._hf_shapes = hf_shapes or {}
        self.sources: dict[str, _Source] = {}
        self.stage_names: dict[int, set[str]] = {s: set() for s in range(layout.pp)}
        """Global Megatron names of the parameters each pipeline stage holds."""
        self._index_rules()

    def stage_of_layer(self, layer: int) -> int:
        return (layer // self.layers_per_chunk) % self.layout.pp

    def _index_rules(self) -> None:
        last = self.layout.pp - 1
        rules = [
            (0, r) for r in weight_mapping.param_rules(self.spec, self.cfg, num_layers=0, post_process=False)
        ]
        for layer in range(self.dims.layers):
            stage = self.stage_of_layer(layer)
            for rule in weight_mapping.param_rules(
                self.spec, self.cfg, layer_offset=layer, num_layers=1, pre_process=False, post_process=False
            ):
                rules.append(
                    (
                        stage,
                        weight_mapping.ParamRule(
                            rule.megatron.replace("decoder.layers.0.", f"decoder.layers.{layer}.", 1),
                            rule.hf,
                            rule.kind,
                        ),
                    )
                )
        rules += [
            (last, r)
            for r in weight_mapping.param_rules(
                self.spec, self.cfg, num_layers=0, pre_process=last == 0, post_process=True
            )
            if not r.megatron.startswith("embedding.")
        ]
        for stage, rule in rules:
            self.stage_names[stage].add(rule.megatron)
            if not rule.exported:
                continue  # the last stage's copy of a tied embedding: the first stage's is the source
            expert = _EXPERT.search(rule.megatron)
            for index, hf in enumerate(rule.hf):
                self.sources.setdefault(
                    hf,
                    _Source(rule.megatron, rule.kind, index, stage, int(expert.group(1)) if expert else None),
                )

    def hf_shape(self, hf_name: str) -> tuple[int, ...]:
        return tuple(self._hf_shapes.get(hf_name) or hf_tensor_shape(self.spec, self.cfg, hf_name))

    def ep_rank_of(self, expert: int) -> int:
        return expert // (self.num_experts // self.layout.ep)

    def parts(self, hf_name: str, region: Region) -> list[MegatronPart]:
        """The Megatron shard regions that make up `region` of the full HF tensor `hf_name`."""
        source = self.sources.get(hf_name)
        assert source is not None, f"{self.spec.family}: no Megatron parameter holds HF tensor {hf_name!r}"
        per_dim = [
            self._dim_runs(source, hf_name, dim, start, length) for dim, (start, length) in enumerate(region)
        ]
        parts = [[]]
        for runs in per_dim:  # cartesian product: at most one dimension is split over TP ranks
            parts = [done + [run] for done in parts for run in runs]
        out = []
        for runs in parts:
            ranks = {t for t, *_ in runs if t is not None}
            assert len(ranks) <= 1, f"{source.name}: split over TP in two dimensions"
            out.append(
                MegatronPart(
                    stage=source.stage,
                    tp_rank=ranks.pop() if ranks else None,
                    name=source.name,
                    src=tuple((local, n) for _, local, _, n in runs),
                    offset=tuple(off for _, _, off, _ in runs),
                    extent=tuple(n for *_, n in runs),
                    ep_rank=None if source.expert is None else self.ep_rank_of(source.expert),
                )
            )
        return out

    def _dim_runs(self, source: _Source, hf_name: str, dim: int, start: int, length: int) -> list[tuple]:
        """[(tp rank or None, local start, offset in the region, length)] along one dimension."""
        full_runs = self._hf_to_full(source, hf_name, start, length) if dim == 0 else [(start, 0, length)]
        layout = tp_sharding.tp_layout(source.name)
        tp = self.layout.etp if source.expert is not None else self.layout.tp
        split = {
            (tp_sharding.COLUMN, 0),
            (tp_sharding.GATED_COLUMN, 0),
            (tp_sharding.VOCAB, 0),
            (tp_sharding.ROW, 1),
        }
        if (layout, dim) not in split or tp == 1:
            return [(None, m, off, n) for m, off, n in full_runs]  # None: any TP rank holds these
        out = []
        for m, off, n in full_runs:
            if layout == tp_sharding.GATED_COLUMN:
                ffn = self.hf_shape(hf_name)[0]  # rows of gate (= up)
                half, m = (0, m) if m < ffn else (1, m - ffn)
                out += [
                    (t, half * (ffn // tp) + local, o, k) for t, local, o, k in _split(m, off, n, ffn // tp)
                ]
            else:
                whole = self._full_size(source, hf_name, dim)
                out += _split(m, off, n, whole // tp)
        return out

    def _full_size(self, source: _Source, hf_name: str, dim: int) -> int:
        """The full Megatron tensor's size along `dim` (vocabulary: padded)."""
        if tp_sharding.tp_layout(source.name) == tp_sharding.VOCAB:
            return self.padded_vocab
        if source.kind == weight_mapping.QKV:
            return (self.dims.heads + 2 * self.dims.kv_heads) * self.dims.head_dim
        return self.hf_shape(hf_name)[dim]

    def _hf_to_full(
        self, source: _Source, hf_name: str, start: int, length: int
    ) -> list[tuple[int, int, int]]:
        """HF rows [start, start+length) -> [(full Megatron row, offset, length)] runs."""
        if source.kind == weight_mapping.GATE_UP:
            return [(source.index * self.hf_shape(hf_name)[0] + start, 0, length)]
        if source.kind != weight_mapping.QKV:
            return [(start, 0, length)]
        d = self.dims.head_dim
        per_group = self.dims.heads // self.dims.kv_heads
        block = per_group * d if source.index == 0 else d  # rows of one group in q, of one head in k/v
        within_group = (0, per_group * d, (per_group + 1) * d)[source.index]
        runs, off = [], 0
        while off < length:
            row = start + off
            group, inside = divmod(row, block)
            n = min(length - off, block - inside)
            runs.append((group * (per_group + 2) * d + within_group + inside, off, n))
            off += n
        return runs


def expert_rank(layout: ParallelLayout, stage: int, ep: int, etp: int, edp: int) -> int:
    """The layout-local rank holding expert-TP rank etp of expert-parallel rank ep in expert-DP replica edp."""
    return stage * (layout.world_size // layout.pp) + etp + layout.etp * (ep + layout.ep * edp)


def expert_data_parallel_size(layout: ParallelLayout) -> int:
    return layout.world_size // (layout.pp * layout.ep * layout.etp)


def _split(m: int, off: int, n: int, per: int) -> list[tuple[int, int, int, int]]:
    """A run [m, m+n) of a tensor split into chunks of `per` -> [(chunk, local start, offset, length)]."""
    out = []
    while n > 0:
        chunk, local = divmod(m, per)
        take = min(n, per - local)
        out.append((chunk, local, off, take))
        m, off, n = m + take, off + take, n - take
    return out
