"""Shared helpers: parquet files written from row dicts, and a fast stand-in tokenizer."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


class CharTokenizer:
    """One token per character of a simple chat rendering: fast, and prompt lengths are easy to compute."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def __call__(self, texts, add_special_tokens=True):
        assert not add_special_tokens
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def make_row(i, content=None, data_source="openai/gsm8k", truth=None):
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content or f"q{i}"}],
        "reward_model": {"style": "rule", "ground_truth": truth or str(i)},
        "extra_info": {"index": i},
    }


def write_rows(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture
def char_tokenizer():
    return CharTokenizer()
