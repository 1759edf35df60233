"""Rows in the common RL schema for the datasets tools/prepare_data.py writes (see prompts.py for the schema).

Sources: GSM8K-style problems generated offline by reasoning-gym's gsm_symbolic, GSM8K / MATH files the user
already has (jsonl, or a dataset saved with `datasets.save_to_disk`), and the toy copy task. Instructions and
data_source names follow the common conventions (those of verl's preprocessing scripts), so that the files
also work elsewhere and reward.name=auto picks the right scorer.
"""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from distflow.rewards.gsm8k import normalize_number

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GSM8K_SOURCE = "openai/gsm8k"
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
COPY_SOURCE = "distflow/copy"
LOOKUP_SOURCE = "distflow/lookup"


def schema_row(
    prompt_text: str, ground_truth: str, data_source: str, split: str, index: int, ability: str, **extra
) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt_text}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **extra},
    }


def gsm_symbolic_rows(train: int, test: int, seed: int, difficulty: float = 1.0) -> dict[str, list[dict]]:
    """train/test rows of distinct generated problems (a question is never in both splits). data_source is
    "openai/gsm8k": the answers are integers scored like GSM8K's; extra_info.generator says where they
    came from."""
    import reasoning_gym  # imported here: ~5 s, only this source needs it

    want = train + test
    generated = reasoning_gym.create_dataset(
        "gsm_symbolic", size=4 * want + 100, seed=seed, difficulty=difficulty
    )
    seen, items = set(), []
    for item in generated:
        if item["question"] not in seen:
            seen.add(item["question"])
            items.append(item)
            if len(items) == want:
                break
    if len(items) < want:
        raise ValueError(
            f"gsm_symbolic gave only {len(items)} distinct problems for seed {seed}; ask for fewer"
        )
    rows = {"train": [], "test": []}
    for i, item in enumerate(items):
        split = "train" if i < train else "test"
        # reasoning-gym asks for the bare answer; we ask for GSM8K's "#### answer" instead.
        question = item["question"].replace(" Give the result as your final answer.", "").strip()
        rows[split].append(
            schema_row(
                f"{question} {GSM8K_INSTRUCTION}",
                normalize_number(item["answer"]),
                GSM8K_SOURCE,
                split,
                len(rows[split]),
                "math",
                question=question,
                answer=item["metadata"].get("answer_cot", ""),
                generator="reasoning_gym/gsm_symbolic",
            )
        )
    return rows


def gsm8k_rows(records: list[dict], split: str, data_source: str = GSM8K_SOURCE) -> list[dict]:
    """GSM8K records ({"question", "answer": "...reasoning...#### 72"}) -> rows; ground truth after "####"."""
    rows = []
    for i, r in enumerate(records):
        answer = _field(r, ("answer",), i)
        if "####" not in answer:
            raise ValueError(f"record {i}: answer has no '#### <number>' final answer: {answer[-80:]!r}")
        question = _field(r, ("question",), i)
        rows.append(
            schema_row(
                f"{question} {GSM8K_INSTRUCTION}",
                normalize_number(answer.split("####")[-1]),
                data_source,
                split,
                i,
                "math",
                question=question,
                answer=answer,
            )
        )
    return rows


def math_rows(records: list[dict], split: str, data_source: str = MATH_SOURCE) -> list[dict]:
    """MATH records ({"problem", "solution"} and/or "answer") -> rows; ground truth = "answer" if present, else
    the last \\boxed{} of the solution."""
    rows = []
    for i, r in enumerate(records):
        problem = _field(r, ("problem", "question"), i)
        answer = r.get("answer")
        if answer is None:
            from distflow.rewards.math_answer import last_boxed  # noqa: PLC0415 - imports math-verify (~1 s): only here

            answer = last_boxed(_field(r, ("solution",), i))
            if answer is None:
                raise ValueError(f"record {i}: no 'answer' field and no \\boxed{{}} answer in its solution")
        rows.append(
            schema_row(
                f"{problem} {MATH_INSTRUCTION}",
                str(answer),
                data_source,
                split,
                i,
                "math",
                question=problem,
                solution=str(r.get("solution", "")),
            )
        )
    return rows


def copy_rows(
    digits: int, train: int, test: int, seed: int, min_digits: int | None = None
) -> dict[str, list[dict]]:
    """The toy copy task: the prompt is a digit string, the answer the same string. Distinct strings, drawn
    without replacement, so train and test never share one. min_digits < digits: each string's length is
    drawn uniformly from [min_digits, digits] (responses of many lengths, as reasoning tasks have)."""
    if min_digits is None or min_digits == digits:
        space = 10**digits
        if train + test > space:
            raise ValueError(
                f"only {space} strings of {digits} digits; cannot draw {train} + {test} distinct ones"
            )
        texts = [str(n).zfill(digits) for n in random.Random(seed).sample(range(space), train + test)]
    else:
        texts = _copy_texts_of_lengths(min_digits, digits, train + test, seed)
    rows = {"train": [], "test": []}
    for i, text in enumerate(texts):
        split = "train" if i < train else "test"
        rows[split].append(schema_row(text, text, COPY_SOURCE, split, len(rows[split]), "copy"))
    return rows


def lookup_rows(train: int, test: int, seed: int, digits: int = 3, keys: int = 10) -> dict[str, list[dict]]:
    """The toy task that needs its tool (rollout.env=lookup): the prompt names a key, the prompt's own table
    (extra_info.table: [{key, value}] entries, which only the `lookup` tool reads) holds its value, a random `digits`-digit string,
    and the answer is that value: no policy can know it without the call. extra_info.sft_turns is the
    demonstration a supervised warm-up imitates: the call, the tool's answer, the value. Keys are 0..keys-1:
    ten one-character keys keep the tiny byte-level model's call short enough to learn on CPU in minutes; the
    values are what makes the tool necessary, and there are 10**digits of them."""
    if keys < 1 or digits < 1:
        raise ValueError(f"keys={keys} and digits={digits} must both be >= 1")
    rng = random.Random(seed)
    rows = {"train": [], "test": []}
    for i in range(train + test):
        split = "train" if i < train else "test"
        key, value = str(rng.randrange(keys)), str(rng.randrange(10**digits)).zfill(digits)
        call = json.dumps({"name": "lookup", "arguments": {"key": key}})
        turns = [
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": value},
            {"role": "assistant", "content": value},
        ]
        rows[split].append(
            schema_row(
                f"lookup {key}",
                value,
                LOOKUP_SOURCE,
                split,
                len(rows[split]),
                "tool",
                table=[{"key": key, "value": value}],
                sft_turns=turns,
            )
        )
    return rows


def _copy_texts_of_lengths(low: int, high: int, count: int, seed: int) -> list[str]:
    if not 1 <= low < high:
        raise ValueError(f"min_digits={low} must be >= 1 and below digits={high}")
    space = sum(10**length for length in range(low, high + 1))
    if count > space // 2:  # drawing distinct strings by rejection needs room
        raise ValueError(f"only {space} strings of {low}-{high} digits; cannot draw {count} distinct ones")
    rng, seen, texts = random.Random(seed), set(), []
    while len(texts) < count:
        length = rng.randint(low, high)
        text = str(rng.randrange(10**length)).zfill(length)
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts


def read_records(path: str | Path) -> dict[str, list[dict]]:
    """{split: records} from a jsonl file (split from its name: train/test, else the file stem) or a dataset
    directory saved with `datasets.save_to_disk` (a DatasetDict gives each of its splits)."""
    path = Path(path)
    if path.is_dir():
        import datasets  # optional: only for saved Hugging Face datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            return {name: list(split) for name, split in loaded.items()}
        return {_split_from_name(path.name): list(loaded)}
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {_split_from_name(path.stem): records}


def write_splits(rows: dict[str, list[dict]], out_dir: str | Path) -> dict[str, Path]:
    """Writes OUT/<split>.parquet for each split; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_rows in rows.items():
        paths[split] = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(split_rows), paths[split])
    return paths


def _split_from_name(name: str) -> str:
    for split in ("train", "test", "validation", "val"):
        if split in name.lower():
            return split
    return name


def _field(record: dict, names: tuple[str, ...], i: int) -> str:
    for name in names:
        if record.get(name) is not None:
            return str(record[name])
    raise ValueError(f"record {i}: missing field {' or '.join(map(repr, names))} (has {sorted(record)})")
