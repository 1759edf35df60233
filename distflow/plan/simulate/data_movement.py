"""Data movement of one step, from the real data plan: bytes per DAG edge and per rank, and the time to
move them with a multi-controller (every rank sends its shards peer-to-peer, all at once) or a single
controller (one driver gathers every node's outputs and scatters every node's inputs, serially).

Multi-controller: an edge whose producer and consumer layouts differ moves as
distflow.coordination.data.plan_redistribution plans it (the same function the DataCoordinator runs),
on a sample table drawn from the simulated lengths. Its time: the metadata all-gather, then the busiest
rank's bytes over its links (intra-node and inter-node separately), one message per peer and field.
Single controller: for every DAG node the driver receives its outputs and sends its inputs, each byte
serialized once and crossing the driver's NIC once, each sample a Python object, each worker a call.
"""

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from distflow.batch.packed import FieldSchema
from distflow.coordination.data.layouts import FieldPlacement, PlacedLayout
from distflow.coordination.data.plan import RedistributionPlan, SampleTable, plan_redistribution

# Bytes of one row of each field the built-in pipelines move (distflow/workers/rollout/sample_packing.py: int64
# token ids, float32 masks and log-probs); per-sample fields hold one row a sample.
ROW_BYTES = {"input_ids": 8}
DEFAULT_ROW_BYTES = 4
PER_SAMPLE_FIELDS = {"rewards", "advantages"}
TORCH_DTYPE = {8: torch.int64, 4: torch.float32}


def row_bytes(field: str) -> int:
    return ROW_BYTES.get(field, DEFAULT_ROW_BYTES)


def output_bytes(fields: dict, lengths: np.ndarray) -> float:
    """Bytes of one DAG output of `fields` for samples of `lengths` tokens."""
    tokens, samples = float(lengths.sum()), len(lengths)
    return sum(row_bytes(f) * (samples if f in PER_SAMPLE_FIELDS else tokens) for f in fields)


def sample_table(lengths: np.ndarray, samples_per_prompt: int, holders: np.ndarray, fields) -> SampleTable:
    """The table the metadata all-gather would assemble: sample i of prompt i // n held by holders[i]."""
    ids = np.arange(len(lengths), dtype=np.int64)
    schema = {f: FieldSchema(TORCH_DTYPE[row_bytes(f)], ragged=f not in PER_SAMPLE_FIELDS) for f in fields}
    return SampleTable(
        sample_ids=ids,
        groups=ids // samples_per_prompt,
        lengths=lengths.astype(np.int64),
        holders=holders.astype(np.int64),
        rows={f: lengths.astype(np.int64) for f in fields if f not in PER_SAMPLE_FIELDS},
        schemas={int(r): schema for r in np.unique(holders)},
    )


def plan_edge(
    producer: PlacedLayout,
    consumer: PlacedLayout,
    lengths: np.ndarray,
    samples_per_prompt: int,
    fields: dict,
    keep_groups: bool = True,
) -> tuple[RedistributionPlan, float]:
    """Plans one edge for a batch whose prompts are spread over the producer's DP ranks in blocks (as
    the partitioned dataloader gives them) and held by each DP group's first rank. Returns the plan and
    the seconds planning took here: every rank of a multi-controller computes the same plan, so this is
    a cost of each transfer (measured on this machine's CPU, like the ranks' own)."""
    prompts = len(lengths) // samples_per_prompt
    dp_of_prompt = np.arange(prompts) * producer.layout.dp // max(1, prompts)
    holder_of_dp = np.array([producer.dp_ranks(d)[0] for d in range(producer.layout.dp)])
    holders = np.repeat(holder_of_dp[dp_of_prompt], samples_per_prompt)
    table = sample_table(lengths, samples_per_prompt, holders, fields)
    start = time.perf_counter()
    plan = plan_redistribution(producer, consumer, table, FieldPlacement(fields), keep_groups=keep_groups)
    return plan, time.perf_counter() - start


@dataclass(frozen=True)
class Link:
    bandwidth: float
    """Bytes/s one rank moves each way."""
    latency: float
    """Seconds per message."""

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        return nbytes / self.bandwidth + messages * self.latency if nbytes or messages else 0.0


def multi_controller_seconds(
    plan: RedistributionPlan, ranks_per_node: int, intra: Link, inter: Link, allgather_latency: float
) -> float:
    """The busiest rank: its larger direction (sends and receives overlap) over each kind of link, plus
    one metadata all-gather. Nothing moves: 0."""
    if plan.identity or not plan.transfers:
        return 0.0
    # [rank][direction][near/far] -> (bytes, messages); a message per field of each transfer
    load = defaultdict(lambda: np.zeros((2, 2, 2)))
    for t in plan.transfers:
        far = int(t.src // ranks_per_node != t.dst // ranks_per_node)
        for rank, direction in ((t.src, 0), (t.dst, 1)):
            load[rank][direction, far] += (t.nbytes, len(t.segments))
    worst = max(
        max(
            intra.seconds(a[d, 0, 0], int(a[d, 0, 1])) + inter.seconds(a[d, 1, 0], int(a[d, 1, 1]))
            for d in (0, 1)
        )
        for a in load.values()
    )
    return worst + allgather_latency


@dataclass(frozen=True)
class Driver:
    """The single controller's costs per byte, object and call.

    What a byte costs the driver depends on how the modeled implementation turns its workers' data into
    messages, and pack_bandwidth is the rate of that packing. A Ray-based single controller (verl's,
    the paper's baseline) pickles every payload into Ray's object store and unpickles it on the other side
    (step.driver_of: the profile's serialize_bandwidth, pickle.dumps + loads). A driver that moves whole
    tensors packs them with copies instead: tools/validate_simulator.py models the data-plane bench's
    torch.cat baseline by its own copies, not by this class."""

    pack_bandwidth: float
    """Bytes/s the driver packs (and a worker unpacks) a payload."""
    nic_bandwidth: float
    """Bytes/s into or out of the driver's process (its NIC; gloo one way into one process on a CPU)."""
    per_object_s: float
    """Seconds per sample object the driver handles (0 where it moves whole tensors)."""
    rpc_s: float
    """Seconds per call or message to one worker."""

    def move_seconds(self, nbytes: float, objects: int, workers: int) -> float:
        """One gather or one scatter through the driver: serial in the driver's one process."""
        return (
            nbytes / self.pack_bandwidth
            + nbytes / self.nic_bandwidth
            + objects * self.per_object_s
            + workers * self.rpc_s
        )


def pipelined_sends(shares: list[tuple[float, float]]) -> float:
    """One process that makes shares one after the other and posts each share's sends (asynchronous) before
    making the next, so the sends of one share fly while the next is made: a two-stage pipeline. shares:
    (seconds to make it, seconds to send it), in order. A share's sends start once it is made and the
    previous share's sends are done; returns when the last send is done."""
    made = sent = 0.0
    for make_s, send_s in shares:
        made += make_s
        sent = max(sent, made) + send_s
    return sent
