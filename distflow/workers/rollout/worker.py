"""RolloutWorker: this rank's share of rollout: the SGLang engine it owns (if any), and the step's samples.

Colocated placement: an engine spans engine_tp consecutive ranks and its first rank owns the
sglang.Engine object; only owners generate. Samples leave as a PackedBatch (token runs, no padding) with
globally unique sample ids and prompt-group ids, so the data coordinator can move them by plan; each
sample's SampleInfo (in the batch's `infos`) records what scoring needs and the weight version that generated it.
Engines start with the weight sync's engine-side loaders (passed in as weight_loaders), so the weight sync
can push shards into them; weight_version is the version of the last completed sync, on every rank.
Several engines balance the training rollout (generate(balance=True)): each owner's prompts are split into
chunks that any owner may claim through the job's c10d store (rollout.balance=steal; work_stealing.py,
chunked_generation.py); stolen chunks' samples come back to their home owner and are sampled with the home
engine's seeds, so the returned batch is the same whichever engine generated a prompt.
Each engine's processes log to <trainer.output_dir>/engine_logs/engine<i>.log; errors about an engine (a
failed start, a death during generation or a sync) end with that log's last lines. A dead engine restarts in
place (engine_restarts.py); sample_packing.py packs the samples into the batch that leaves.
"""

import contextlib
import functools
from pathlib import Path

from torch.distributed import distributed_c10d

from distflow.batch import PackedBatch
from distflow.distributed import resolve_device
from distflow.distributed.store_client import own_store_client
from distflow.workers.rollout import (
    chunked_generation,
    engine_health,
    multi_node_engine,
    multi_turn,
    partial_generation,
    sglang_engine,
    work_stealing,
)
from distflow.workers.rollout.engine_health import EngineDiedError
from distflow.workers.rollout.engine_restarts import EngineRestarts
from distflow.workers.rollout.engine_state import state_of
from distflow.workers.rollout.sample_packing import pack_samples, routes_width

ID_STRIDE = 1_000_000  # sample id = engine * ID_STRIDE + local index: unique over the job without talking


def placement_device(cfg) -> str:
    return resolve_device(cfg.trainer.device)


class RolloutWorker:
    def __init__(
        self,
        cfg,
        placement,
        rank: int,
        model_path: str,
        weight_loaders: tuple[str, ...] = (),
        trajectories: multi_turn.TrajectoryRunner | None = None,
    ):
        """weight_loaders: the engine-side weight loaders (SGLang custom_weight_loader names) that the run's
        weight sync loads through (nodes/sync.WeightSync.engine_loaders); added to rollout.sglang's.
        trajectories (rollout.env): every generation is multi-turn, through this runner."""
        self.cfg, self.rank, self.trajectories = cfg, rank, trajectories
        self.engine_index = placement.engine_of(rank)
        self.owner = placement.owns_engine(rank)
        self.engine = None
        self.weight_version = 0
        self.released: set[str] = set()  # colocated: engine memory (ENGINE_MEMORY tags) lent to training
        # Releasing memory frees GPU memory for training; on CPU SGLang has nothing to release (its calls
        # are no-ops there) and asserts if a finishing request is still in flight, so it is skipped.
        # Disaggregated engines have their devices to themselves: nothing to release.
        self.release_between_steps = (
            cfg.rollout.release_memory_in_training
            and placement_device(cfg) == "cuda"
            and placement.kind == "colocated"
        )
        self.num_engines = placement.num_engines
        self.in_flight: dict[int, partial_generation.InFlightGeneration] = {}  # step -> its submitted rollout
        self._balance_round = 0  # balanced generate calls so far: namespaces their store keys
        self.balance_stats: dict | None = None  # the last balanced call's totals (generate(balance=True))
        self.node_engine = None  # a later node's share of a multi-node engine (its SGLang processes only)
        self.restarts = EngineRestarts(self)  # of this rank's engine when it dies (rollout.engine_restarts)
        self.engine_nnodes = placement.engine_nnodes
        self.placement = placement
        self.node_rank = placement.engine_node_rank(rank)  # None on ranks that start no SGLang processes
        self._start = None  # starts this rank's engine (processes), the same way every time
        self._engine_starts = 0  # starts of it so far in this attempt (each rendezvouses anew over nodes)
        # MoE routing replay: the engine returns each token's experts, which the samples carry to the actor
        self.routes_width = routes_width(model_path) if cfg.actor.moe_routing_replay else None
        if self.node_rank is not None:
            self._engine_args = engine_args(cfg.rollout.sglang, weight_loaders)
            if self.routes_width is not None:
                self._engine_args["enable_return_routed_experts"] = True
            self._start = functools.partial(
                sglang_engine.start_engine,
                model_path,
                tp=placement.engine_tp,
                dtype=cfg.rollout.dtype or cfg.model.dtype,
                seed=cfg.trainer.seed + self.engine_index,
                mem_fraction_static=cfg.rollout.mem_fraction_static,
                log_path=engine_log_path(cfg, self.engine_index, self.node_rank),
                call_timeout_s=cfg.rollout.call_timeout_s or cfg.trainer.dist_timeout_s,
            )
            engine = self.start_engine()
            if self.owner:
                self.engine = engine
            else:
                self.node_engine = engine

    def start_engine(self):
        """This rank's engine (its node's share of it, for an engine over nodes), started as at the first
        start (at init, and by EngineRestarts after a death). An engine over nodes rendezvouses anew each time (its starts so far name the store key):
        the last start's address belongs to processes that are gone."""
        args = dict(self._engine_args)
        if self.engine_nnodes > 1:
            args.update(
                multi_node_engine.node_args(
                    self.placement,
                    self.engine_index,
                    self.node_rank,
                    timeout_s=self.cfg.trainer.dist_timeout_s,
                    start=self._engine_starts,
                )
            )
        self._engine_starts += 1
        return self._start(extra_args=args)

    def generate(
        self,
        prompts,
        eos_token_id: int,
        step: int,
        greedy: bool = False,
        n: int | None = None,
        balance: bool = False,
        on_group=None,
        on_sample=None,
    ) -> PackedBatch | None:
        """Samples rollout.n responses per prompt on this rank's engine; None on ranks without an engine.
        The batch's `infos` hold each sample's SampleInfo. `step` (the RL step) is part of every sampling
        seed, so a resumed run samples what the uninterrupted one would have.

        balance (the training rollout; every owner must pass the same, the same number of times): with several
        engines, the prompts are generated in chunks, under rollout.balance=steal by whichever engine is free
        (see work_stealing), and each sample returns here; ids, groups, seeds and the returned batch do not
        depend on which engine generated a prompt. `balance_stats` then holds the step's stolen_groups and
        per-engine generated tokens.

        on_group(group, prompt) (streaming): called with each prompt group this engine generated for its own
        partition as soon as the group's last sample finishes, while the rest still generate; `group` is
        those samples as the returned batch will hold them (ids, fields, infos). Groups another engine
        generated for this partition, and rollouts submitted ahead (rollout.partial), are not streamed.
        on_sample(batch) (streaming): likewise with each sample of this engine's own partition, as soon as it
        finishes (with several engines balancing the rollout: with its prompt group, when that finishes)."""
        if not self.owner:
            return None

        self.make_resident()
        sampling = self._sampling(eos_token_id, greedy, n)
        base = self.engine_index * ID_STRIDE
        chunked = balance and self.num_engines > 1
        n = sampling["n"]  # sample ids as below: prompt-major, n per prompt
        group_done = sample_done = None
        if on_group is not None or (on_sample is not None and chunked):

            def group_done(prompt_index, samples):
                first = base + prompt_index * n
                batch = pack_samples(
                    prompts, [(first + j, s) for j, s in enumerate(samples)], base, self.routes_width
                )
                if on_group is not None:
                    on_group(batch, prompts[prompt_index])
                if on_sample is not None and chunked:  # chunks report whole groups
                    on_sample(batch)

        if on_sample is not None and not chunked:

            def sample_done(prompt_index, j, sample):
                on_sample(
                    pack_samples(prompts, [(base + prompt_index * n + j, sample)], base, self.routes_width)
                )

        # The training rollout submitted earlier (partial rollouts), also when it is generated again after its
        # engine died (then unbalanced: nodes/rollout.generate_samples); never a greedy validation's.
        in_flight = None if greedy else self.in_flight.pop(step, None)
        if in_flight is not None:  # what is left of it, then all of it
            try:
                outs = in_flight.result()
            except EngineDiedError:  # its restart re-issues its requests (EngineRestarts.restart_engine)
                self.in_flight[step] = in_flight
                raise
        elif chunked:
            outs = self._generate_chunks(prompts, step, greedy, sampling, group_done)
        elif self.trajectories is not None:  # multi-turn: not streamed (a trajectory ends when its env says)
            outs = self.trajectories.generate(
                self.engine,
                trajectory_prompts(prompts),
                seed=self.sampling_seed(self.engine_index, step, greedy),
                **sampling,
            )
        else:
            outs = sglang_engine.generate(
                self.engine,
                [p.input_ids for p in prompts],
                seed=self.sampling_seed(self.engine_index, step, greedy),
                on_group=group_done,
                on_sample=sample_done,
                **sampling,
            )
        if self.release_between_steps:
            sglang_engine.release_memory(self.engine)
            self.released = set(sglang_engine.ENGINE_MEMORY)
        return pack_samples(prompts, [(base + i, s) for i, s in enumerate(outs)], base, self.routes_width)

    def submit(self, prompts, eos_token_id: int, step: int) -> None:
        """Partial rollouts (rollout.partial): sends step `step`'s training rollout to this rank's engine and
        returns once the engine has it; generate(prompts, ..., step, balance=True) later collects it. Weight
        syncs in between interrupt it and continue it under their weights (partial_generation). One engine's
        own prompts (rollout.balance=partition, or a single engine); no-op on ranks without an engine."""
        if not self.owner:
            return
        what = f"submitting step {step}'s rollout"
        self.restarts.revive_dead_engine(what)  # its requests then wait for the next sync, as those in flight
        if self.restarts.dead_until_a_sync(step):
            return
        self.make_resident()
        submit = functools.partial(
            partial_generation.submit,
            prompt_ids=[p.input_ids for p in prompts],
            seed=self.sampling_seed(self.engine_index, step),
            timeout_s=self.cfg.trainer.dist_timeout_s,
            **self._sampling(eos_token_id, greedy=False, n=None),
        )
        try:
            self.in_flight[step] = submit(self.engine)
        except EngineDiedError:  # died since the check above
            self.restarts.revive_dead_engine(what)
            if not self.restarts.dead_until_a_sync(step):
                self.in_flight[step] = submit(self.engine)

    def cancel(self, step: int) -> None:
        """Drops step `step`'s submitted rollout, if any (a rollout gone stale is generated again)."""
        in_flight = self.in_flight.pop(step, None)
        if in_flight is not None:
            in_flight.cancel()

    def _sampling(self, eos_token_id: int, greedy: bool, n: int | None) -> dict:
        r = self.cfg.rollout
        return dict(
            n=n or (1 if greedy else r.n),
            temperature=0.0 if greedy else r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=r.max_new_tokens,
            stop_token_ids=sorted({eos_token_id, *r.stop_token_ids}),
            stop=list(r.stop),
        )

    def sampling_seed(self, home_engine: int, step: int, greedy: bool = False) -> int | None:
        """The call seed of `home_engine`'s partition at `step`: a function of (trainer.seed, step, home
        engine) [+ prompt, sample in sglang_engine.generate], so a resumed run samples what the uninterrupted
        one would have, whatever engine generated a prompt and whatever it generated before."""
        return None if greedy else (self.cfg.trainer.seed * 1_000_003 + step) * 4099 + home_engine

    def _generate_chunks(self, prompts, step: int, greedy: bool, sampling: dict, on_group=None) -> list:
        """This partition's samples (prompt-major, as sglang_engine.generate) through claimed chunks;
        on_group(prompt_index, samples) for each prompt of the chunks of its own this engine generates."""
        r = self.cfg.rollout
        # what the board hands to whichever engine claims a chunk: ids, or what a trajectory starts from
        prompt_ids = (
            [list(p.input_ids) for p in prompts] if self.trajectories is None else trajectory_prompts(prompts)
        )
        chunks = work_stealing.split_into_chunks(
            self.engine_index,
            [len(p.input_ids) for p in prompts],
            sampling["n"],
            r.max_new_tokens,
            r.balance_chunk_prompts,
        )

        timeout_s = r.balance_timeout_s or self.cfg.trainer.dist_timeout_s
        # a client of the board's own: its waits for the round's end hold no other user of the store
        store = own_store_client("rollout_balance", timeout_s) or distributed_c10d._get_default_store()
        board = work_stealing.StoreBoard(
            store,
            self._balance_round,
            self.engine_index,
            self.num_engines,
            timeout_s,
            steal=r.balance == "steal",
        )
        board.publish(chunks, prompt_ids)
        self._balance_round += 1
        run = chunked_generation.generate_claimed_chunks(
            self.engine,
            board,
            None if greedy else lambda home: self.sampling_seed(home, step),
            r.balance_outstanding_tokens,
            on_chunk=None if on_group is None else _per_prompt(self.engine_index, sampling["n"], on_group),
            adopt_orphans=r.engine_restarts > 0,
            generate_fn=sglang_engine.generate_async
            if self.trajectories is None
            else self.trajectories.generate_async,
            **sampling,
        )
        if run.died is not None:  # the live engines generate what it had left; it restarts meanwhile
            self.restarts.raise_unless_restartable(run.died)
            given = board.abandon(run.unfinished)
            cause = f"died in step {step}'s rollout; {given} of its chunks go to the other engines"
            if self.restarts.at_syncs:
                print(
                    f"[rollout] engine {self.engine_index} {cause}; it restarts at the next weight sync",
                    flush=True,
                )
            else:
                self.restarts.restart_engine(cause)
            board.wait_for_adopters()
        mine, self.balance_stats = board.finish(run.generated, run.tokens)
        return [s for c in chunks for s in mine[c.index]]

    def needs_weights(self) -> bool:
        """Whether this rank's engine serves no complete weights until a sync: restarted since the last one,
        or dead (for an engine over nodes, this rank's share)."""
        if self.owner:
            return engine_health.is_dead(self.engine) or not state_of(self.engine).fresh
        return self.node_engine is not None and engine_health.is_dead(self.node_engine)

    def load_weights(self, named_tensors) -> None:
        """Full HF-named tensors into the engine through SGLang's own loader (the fallback sync path)."""
        if self.owner:
            self.make_resident(only=("weights",))
            sglang_engine.update_weights_from_tensors(
                self.engine, named_tensors, version=self.weight_version + 1
            )
        self.weight_version += 1

    def make_resident(self, only: tuple[str, ...] | None = None) -> None:
        """Owners: brings released engine memory back (all of it, or the tags in `only`). Weights can only be
        written into resident memory; a sync resumes only them, so that the KV cache returns after the sync's
        staging buffers are gone. SGLang refuses to resume what it never released."""
        tags = self.released if only is None else self.released & set(only)
        if self.owner and tags:
            sglang_engine.resume_memory(self.engine, sorted(tags))
            self.released -= tags

    def weights_synced(self, version: int) -> None:
        """Called on every rank after a completed sync (the resharder versions the engine itself)."""
        self.weight_version = version

    def continue_versions_from(self, version: int) -> None:
        """On resume: count weight versions on from `version` (the next completed sync is version + 1), as
        the resumed run did, so samples carry the versions they had there."""
        self.weight_version = version
        if self.engine is not None:
            state_of(self.engine).version = version

    def close(self) -> None:
        for step in list(self.in_flight):
            with contextlib.suppress(Exception):  # the engine may be dead: it stops below either way
                self.cancel(step)
        for engine in (self.engine, self.node_engine):
            if engine is not None:
                sglang_engine.shutdown_engine(engine)
        self.engine = self.node_engine = None


def _per_prompt(engine_index: int, n: int, on_group):
    """on_chunk(chunk, samples) -> on_group(prompt_index, samples of that prompt), for this engine's own
    chunks (a stolen chunk's samples belong to another engine's partition)."""

    def on_chunk(chunk, samples):
        if chunk.home != engine_index:
            return
        for at in range(0, len(samples), n):
            on_group(samples[at].prompt_index, samples[at : at + n])

    return on_chunk


def engine_log_path(cfg, engine_index: int, node_rank: int = 0) -> Path:
    """Where engine `engine_index` writes its processes' output: <trainer.output_dir>/engine_logs/
    (a multi-node engine's later nodes: engine<i>.node<k>.log)."""
    suffix = f".node{node_rank}" if node_rank else ""
    return Path(cfg.trainer.output_dir) / "engine_logs" / f"engine{engine_index}{suffix}.log"


def trajectory_prompts(prompts) -> list:
    """What each prompt's trajectory starts from: its ids, and the row its environment resets with."""
    return [
        multi_turn.TrajectoryPrompt(
            list(p.input_ids),
            {"ground_truth": p.ground_truth, "data_source": p.data_source, "extra_info": p.extra_info},
        )
        for p in prompts
    ]


def engine_args(user_args: dict, weight_loaders=()) -> dict:
    """The user's rollout.sglang ServerArgs plus the weight sync's engine-side loaders."""
    args = dict(user_args)
    loaders = list(args.get("custom_weight_loader") or [])
    args["custom_weight_loader"] = loaders + [n for n in weight_loaders if n not in loaders]
    return args
