"""Prompt datasets: parquet files in the common RL schema, validated, chat-templated and length-filtered.

One row of the schema (the one verl's and others' preprocessing scripts write):
    prompt:        list of chat messages [{"role": str, "content": str}, ...]   (column name: data.prompt_key)
    data_source:   str, e.g. "openai/gsm8k" (selects the scorer under reward.name=auto)
    reward_model:  {"style": str, "ground_truth": ...}
    extra_info:    dict, optional (passed to the scorer)
Files are parquet (.parquet), JSON lines (.jsonl) or a JSON array of rows (.json), with the same fields.
Every rank loads, validates and tokenizes all rows (cheap next to an RL step): the filter must give every rank
the same row list so that the epoch order and the partitions agree without communication.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)
_TOKENIZE_CHUNK = 1024


class DataError(ValueError):
    """A row or file that does not follow the schema; the message names file, row and field."""


@dataclass(frozen=True)
class Prompt:
    """One prompt, ready for rollout (`input_ids`) and scoring (`data_source`, `ground_truth`, `extra_info`).
    `index` is the row's position over all files of the split (before filtering): a stable id."""

    index: int
    input_ids: list[int]
    messages: list[dict]
    data_source: str
    ground_truth: Any
    extra_info: dict = field(default_factory=dict)


class PromptDataset(Sequence[Prompt]):
    """All valid rows of `files` whose templated prompt has at most `max_prompt_length` tokens.

    tokenizer: a Hugging Face tokenizer with a chat template (anything with `apply_chat_template` and
    `__call__`). A bad row raises DataError, or with `skip_bad_rows` is skipped and counted.
    `stats`: rows (read), kept, filtered_too_long, skipped_bad_rows.
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int | None = None,
        skip_bad_rows: bool = False,
    ):
        if not files:
            raise DataError("no data files given")
        self.files = [str(f) for f in files]
        rows, bad, index = [], [], 0
        for path in self.files:
            for row_in_file, row in enumerate(_read_rows(path, prompt_key)):
                try:
                    rows.append((index, *_validate(row, prompt_key)))
                except DataError as e:
                    if not skip_bad_rows:
                        raise DataError(
                            f"{path}: row {row_in_file}: {e} (set data.skip_bad_rows=true to skip bad rows)"
                        ) from None
                    bad.append(f"{path}: row {row_in_file}: {e}")
                index += 1
        if bad:
            logger.warning("data: skipped %d bad rows, first: %s", len(bad), bad[0])
        ids = _tokenize_prompts(tokenizer, [messages for _, messages, *_ in rows])
        self.prompts: list[Prompt] = []
        too_long = 0
        for (row_index, messages, data_source, ground_truth, extra_info), input_ids in zip(rows, ids):
            if max_prompt_length is not None and len(input_ids) > max_prompt_length:
                too_long += 1
                continue
            self.prompts.append(Prompt(row_index, input_ids, messages, data_source, ground_truth, extra_info))
        self.stats = {
            "rows": index,
            "kept": len(self.prompts),
            "filtered_too_long": too_long,
            "skipped_bad_rows": len(bad),
        }
        logger.info(
            "data: %d rows from %d file(s): kept %d, filtered %d longer than %s tokens, skipped %d bad",
            index,
            len(self.files),
            len(self.prompts),
            too_long,
            max_prompt_length,
            len(bad),
        )
        if not self.prompts:
            raise DataError(_why_empty(self.files, self.stats, [len(x) for x in ids], max_prompt_length))

    @classmethod
    def from_config(cls, data_cfg, tokenizer, split: str = "train") -> "PromptDataset":
        """The train or val split of a DataConfig (data.train_files / data.val_files)."""
        files = {"train": data_cfg.train_files, "val": data_cfg.val_files}[split]
        return cls(
            files,
            tokenizer,
            prompt_key=data_cfg.prompt_key,
            max_prompt_length=data_cfg.max_prompt_length,
            skip_bad_rows=data_cfg.skip_bad_rows,
        )

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i):
        return self.prompts[i]


def _why_empty(files: list[str], stats: dict, lengths: list[int], max_prompt_length: int | None) -> str:
    """The DataError message for a split with no usable prompt: which files, and what to change."""
    if stats["rows"] == 0:
        return f"no rows in {files}: the data files are empty"
    if stats["filtered_too_long"]:
        ordered = sorted(lengths)
        median, longest = ordered[len(ordered) // 2], ordered[-1]
        advice = (
            f"set data.max_prompt_length={longest} to keep all of them"
            if median == longest
            else f"set data.max_prompt_length={longest} to keep all of them, or {median} to keep half"
        )
        return (
            f"every prompt in {files} is longer than data.max_prompt_length={max_prompt_length} tokens "
            f"({stats}); the templated prompts have {ordered[0]} to {longest} tokens (median {median}): "
            f"{advice}"
        )
    return f"no prompts left in {files} ({stats}): every row was skipped as bad"


def _read_rows(path: str, prompt_key: str) -> list[dict]:
    """The rows of one data file; parquet reads only the schema's columns."""
    if not Path(path).is_file():
        raise DataError(
            f"data file {path} does not exist"
            + (" (it is a folder; list its files)" if Path(path).is_dir() else "")
        )
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return _read_json_rows(path)
    try:  # any other name is read as parquet
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as err:
        raise DataError(
            f"data file {path} cannot be read as parquet ({err}); data files are parquet, .jsonl or .json"
        ) from None
    for required in (prompt_key, "data_source", "reward_model"):
        if required not in schema.names:
            raise DataError(
                f"{path}: row 0: missing field {required!r} (the file has no such column; it has "
                f"{schema.names})"
            )
    columns = [prompt_key, "data_source", "reward_model"] + (
        ["extra_info"] if "extra_info" in schema.names else []
    )
    return pq.read_table(path, columns=columns).to_pylist()


def _read_json_rows(path: str) -> list[dict]:
    """Rows of a JSON-lines file (one object a line) or of a JSON file holding a list of objects."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"data file {path} cannot be read: {err}") from None
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"data file {path} is not valid JSON: {err}") from None
    else:
        rows = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(f"data file {path}: line {line_no} is not a JSON object: {err}") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(
                f"{path}: row {i}: expected a JSON object with prompt, data_source, reward_model; got "
                f"{type(row).__name__}"
            )
    return rows


def _validate(row: dict, prompt_key: str) -> tuple[list[dict], str, Any, dict]:
    """(messages, data_source, ground_truth, extra_info) of one row; DataError naming the field otherwise."""
    messages = row.get(prompt_key)
    if not isinstance(messages, list) or not messages:
        raise DataError(f"missing field {prompt_key!r} (a non-empty list of chat messages), got {messages!r}")
    for j, message in enumerate(messages):
        for key in ("role", "content"):
            if not isinstance(message, dict) or not isinstance(message.get(key), str):
                raise DataError(f"missing field '{prompt_key}[{j}].{key}' (a string)")
    data_source = row.get("data_source")
    if not isinstance(data_source, str):
        raise DataError(f"missing field 'data_source' (a string), got {data_source!r}")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DataError("missing field 'reward_model.ground_truth'")
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise DataError(f"field 'extra_info' must be a dict, got {type(extra_info).__name__}")
    # Parquet structs carry every key seen in the file; drop the ones this row never had.
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return messages, data_source, reward_model["ground_truth"], extra_info


def _tokenize_prompts(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    """Token ids of each conversation under the tokenizer's chat template, opened for the assistant's reply."""
    ids = []
    for start in range(0, len(conversations), _TOKENIZE_CHUNK):
        texts = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in conversations[start : start + _TOKENIZE_CHUNK]
        ]
        # The template already wrote the special tokens (bos, turn markers) as text.
        ids.extend(list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return ids
