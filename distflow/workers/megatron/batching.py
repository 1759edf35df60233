"""How a worker's batch is cut: rows into mini-batches, mini-batches into micro-batches, micro-batches trimmed.

A batch is a dict of tensors whose first dimension is the row (one sequence each); per-token fields are
[rows, seq] and right-padded (`attention_mask` says where each row's tokens are). Everything here is pure
(no process groups), runs identically on every rank of a pipeline, and is unit-tested without processes.

Micro-batches are padded to their own longest row, so the cost of a micro-batch is rows x that length
("padded tokens"); the token budget (dynamic batching) bounds this number.
"""

import math

import torch


def sequence_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Length of each right-padded row: one past its last attended position (0 for an empty row)."""
    positions = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    return (attention_mask.bool() * positions).amax(dim=1).tolist()


def padded_cost(lengths: list[int], rows: list[int]) -> int:
    """Tokens a micro-batch of `rows` occupies once padded to its longest row."""
    return len(rows) * max((lengths[i] for i in rows), default=0)


def fixed_micro_batches(num_rows: int, micro_batch_size: int, multiple_of: int = 1) -> list[list[int]]:
    """Consecutive rows, at most micro_batch_size per micro-batch, in the fewest micro-batches whose count
    is a multiple of `multiple_of` (Megatron's interleaved schedule needs a multiple of pp)."""
    assert micro_batch_size >= 1, f"micro_batch_size={micro_batch_size} must be >= 1"
    count = _round_up(max(1, math.ceil(num_rows / micro_batch_size)), multiple_of)
    _check_enough_rows(num_rows, count, multiple_of)
    bounds = [round(i * num_rows / count) for i in range(count + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(count)]


def row_groups(lengths: list[int], role_cfg, multiple_of: int = 1) -> list[list[int]]:
    """The micro-batches of a role's rows: by its token budget (role_cfg.use_dynamic_batch,
    max_tokens_per_micro_batch) or its micro_batch_size, in a count that is a multiple of `multiple_of`."""
    if role_cfg.use_dynamic_batch:
        return token_budget_micro_batches(lengths, role_cfg.max_tokens_per_micro_batch, multiple_of)
    return fixed_micro_batches(len(lengths), role_cfg.micro_batch_size, multiple_of)


def token_budget_micro_batches(lengths: list[int], max_tokens: int, multiple_of: int = 1) -> list[list[int]]:
    """Partition rows into the fewest micro-batches whose padded cost is <= max_tokens, balanced by cost.

    The count is the minimum possible (rounded up to a multiple of `multiple_of`): filling micro-batches
    longest-first, each with as many of the next-longest rows as fit, is optimal for a padded budget.
    Rows are then dealt longest-first to the micro-batch whose padded cost grows to the smallest value
    (a budget-respecting LPT), which evens out the micro-batches' costs; if that greedy balancing cannot
    place every row, the longest-first filling is used as is. Rows keep their batch order inside each
    micro-batch; micro-batches come longest first.
    """
    longest = max(lengths, default=0)
    if longest > max_tokens or max_tokens < 1:
        raise ValueError(
            f"max_tokens_per_micro_batch={max_tokens} is smaller than the longest sequence "
            f"({longest} tokens); raise it to at least {longest}"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    filled, start = [], 0
    while start < len(order):
        capacity = max_tokens // max(lengths[order[start]], 1)
        filled.append(order[start : start + capacity])
        start += capacity
    count = _round_up(max(1, len(filled)), multiple_of)
    _check_enough_rows(len(lengths), count, multiple_of)
    balanced = _balance(lengths, order, count, max_tokens)
    groups = balanced if balanced is not None else filled
    while len(groups) < count:  # only when rounding up for the interleaved schedule and balancing failed
        groups = _split_largest(lengths, groups)
    return [sorted(g) for g in groups]


def _balance(lengths, order, count, max_tokens):
    groups = [[] for _ in range(count)]
    longest = [0] * count
    for row in order:
        best, best_cost = None, None
        for g in range(count):
            cost = (len(groups[g]) + 1) * max(longest[g], lengths[row])
            if cost <= max_tokens and (best_cost is None or cost < best_cost):
                best, best_cost = g, cost
        if best is None:
            return None
        groups[best].append(row)
        longest[best] = max(longest[best], lengths[row])
    return groups if all(groups) else None


def _split_largest(lengths, groups):
    largest = max(range(len(groups)), key=lambda g: (len(groups[g]) > 1, padded_cost(lengths, groups[g])))
    rows = groups[largest]
    return groups[:largest] + [rows[: len(rows) // 2], rows[len(rows) // 2 :]] + groups[largest + 1 :]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_enough_rows(num_rows: int, count: int, multiple_of: int) -> None:
    if num_rows < count:
        raise ValueError(
            f"{num_rows} rows cannot fill {count} micro-batches (the interleaved pipeline "
            f"schedule needs a multiple of {multiple_of}); give each data-parallel rank more rows"
        )


def select_rows(batch: dict, rows) -> dict:
    """The batch restricted to `rows` (a list of indices or a range), every field alike."""
    index = torch.as_tensor(list(rows), dtype=torch.long)
    return {k: v.index_select(0, index.to(v.device)) for k, v in batch.items()}


def trim_to(batch: dict, length: int) -> dict:
    """Per-token fields ([rows, seq, ...] with seq = the batch's) cut or right-padded with 0 to `length`."""
    seq = batch["input_ids"].shape[1]
    out = {}
    for key, value in batch.items():
        if value.dim() >= 2 and value.shape[1] == seq:
            if length <= seq:
                value = value[:, :length]
            else:
                pad = value.new_zeros(value.shape[0], length - seq, *value.shape[2:])
                value = torch.cat([value, pad], dim=1)
        out[key] = value.contiguous()
    return out


def micro_batch(
    batch: dict,
    rows: list[int],
    lengths: list[int],
    pad_multiple: int = 1,
    shape: tuple[int, int] | None = None,
) -> dict:
    """The rows of one micro-batch, trimmed to its longest row (rounded up to `pad_multiple`, e.g. the TP
    size under sequence parallelism, which splits the sequence over TP ranks).

    shape=(rows, length) pads to that fixed shape instead: extra rows are all zeros (no attended token,
    no response token), so they change no loss and no output row.
    """
    length = _round_up(max(1, max(lengths[i] for i in rows)), pad_multiple)
    mb = select_rows(batch, rows)
    if shape is not None:
        assert shape[0] >= len(rows) and shape[1] >= length, f"shape {shape} < ({len(rows)}, {length})"
        mb = {k: torch.cat([v, v.new_zeros(shape[0] - len(rows), *v.shape[1:])]) for k, v in mb.items()}
        length = shape[1]
    return trim_to(mb, length)


def uniform_shape(row_groups: list[list[int]], lengths: list[int], pad_multiple: int = 1) -> tuple[int, int]:
    """(rows, length) that holds every micro-batch of row_groups."""
    return (
        max(len(g) for g in row_groups),
        _round_up(max(1, max(lengths[i] for g in row_groups for i in g)), pad_multiple),
    )


def mini_batch_ranges(num_rows: int, rows_per_mini_batch: int) -> list[range]:
    """Consecutive row ranges of rows_per_mini_batch rows (0: one mini-batch of every row)."""
    size = rows_per_mini_batch or num_rows
    return [range(s, min(s + size, num_rows)) for s in range(0, num_rows, size)]


def scatter_rows(
    parts: list[torch.Tensor], row_groups: list[list[int]], num_rows: int, seq_len: int
) -> torch.Tensor:
    """Reassembles per-micro-batch [rows_i (+ padding rows), len_i] outputs into one [num_rows, seq_len] tensor
    (0-padded)."""
    out = torch.zeros(num_rows, seq_len, dtype=parts[0].dtype, device=parts[0].device)
    for part, rows in zip(parts, row_groups):
        width = min(part.shape[1], seq_len)
        out[torch.as_tensor(rows, device=out.device), :width] = part[: len(rows), :width]  # no padding rows
    return out
