"""PromptDataset: schema validation naming file/row/field, the chat template, the prompt-length filter."""

import pytest
from conftest import make_row, write_rows

from distflow.data import DataError, PromptDataset


def test_rows_become_prompts(tmp_path, char_tokenizer):
    a = write_rows(tmp_path / "a.parquet", [make_row(0), make_row(1)])
    b = write_rows(tmp_path / "b.parquet", [make_row(2, data_source="distflow/copy", truth="2222")])
    ds = PromptDataset([a, b], char_tokenizer)
    assert len(ds) == 3 and [p.index for p in ds] == [0, 1, 2]
    p = ds[2]
    assert p.data_source == "distflow/copy" and p.ground_truth == "2222" and p.extra_info == {"index": 2}
    assert p.messages == [{"role": "user", "content": "q2"}]
    assert "".join(map(chr, p.input_ids)) == "<user>q2<assistant>"


def test_real_chat_template(tmp_path):
    from distflow.models.tiny_tokenizer import train_tiny_tokenizer  # imports transformers (seconds)

    tokenizer = train_tiny_tokenizer(512)  # the tiny models' tokenizer: Qwen chat template
    path = write_rows(tmp_path / "t.parquet", [make_row(0, content="What is 2 + 3?")])
    prompt = PromptDataset([path], tokenizer)[0]
    text = tokenizer.decode(prompt.input_ids)
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.input_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_length_filter_is_counted(tmp_path, char_tokenizer):
    # "<user>" + content + "<assistant>" = 17 + len(content) tokens
    rows = [make_row(0, content="x" * 3), make_row(1, content="x" * 4), make_row(2, content="x" * 30)]
    ds = PromptDataset([write_rows(tmp_path / "a.parquet", rows)], char_tokenizer, max_prompt_length=20)
    assert [p.index for p in ds] == [0]
    assert ds.stats == {"rows": 3, "kept": 1, "filtered_too_long": 2, "skipped_bad_rows": 0}


@pytest.mark.parametrize(
    "broken, field",
    [
        (
            lambda r: r.update(reward_model={"style": "rule", "ground_truth": None}),
            "reward_model.ground_truth",
        ),
        (lambda r: r.update(data_source=None), "data_source"),
        (lambda r: r.update(prompt=[]), "prompt"),
        (lambda r: r["prompt"][0].update(content=None), "prompt[0].content"),
    ],
)
def test_bad_row_names_file_row_and_field(tmp_path, char_tokenizer, broken, field):
    rows = [make_row(i) for i in range(4)]
    broken(rows[2])
    path = write_rows(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError) as e:
        PromptDataset([path], char_tokenizer)
    assert f"{path}: row 2: missing field '{field}'" in str(e.value)
    ds = PromptDataset([path], char_tokenizer, skip_bad_rows=True)
    assert [p.index for p in ds] == [0, 1, 3] and ds.stats["skipped_bad_rows"] == 1


def test_missing_column_and_file(tmp_path, char_tokenizer):
    rows = [make_row(0)]
    del rows[0]["reward_model"]
    path = write_rows(tmp_path / "nocol.parquet", rows)
    with pytest.raises(DataError, match=f"{path}: row 0: missing field 'reward_model'"):
        PromptDataset([path], char_tokenizer)
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset([str(tmp_path / "nope.parquet")], char_tokenizer)


def test_custom_prompt_key_and_no_extra_info(tmp_path, char_tokenizer):
    rows = [
        {
            "messages": [{"role": "user", "content": "hi"}],
            "data_source": "s",
            "reward_model": {"ground_truth": 5},
        }
    ]
    ds = PromptDataset([write_rows(tmp_path / "a.parquet", rows)], char_tokenizer, prompt_key="messages")
    assert ds[0].ground_truth == 5 and ds[0].extra_info == {}


def test_jsonl_and_json_files_are_read_like_parquet(tmp_path, char_tokenizer):
    import json

    rows = [make_row(0), make_row(1)]
    lines = tmp_path / "a.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    array = tmp_path / "b.json"
    array.write_text(json.dumps(rows))
    ds = PromptDataset([lines, array], char_tokenizer)
    assert [p.ground_truth for p in ds] == ["0", "1", "0", "1"]
    broken = tmp_path / "c.jsonl"
    broken.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=f"{broken}: line 2 is not a JSON object"):
        PromptDataset([broken], char_tokenizer)


def test_all_too_long_suggests_the_length_to_set(tmp_path, char_tokenizer):
    # 17 + len(content) tokens each: 20, 21, 47
    rows = [make_row(0, content="x" * 3), make_row(1, content="x" * 4), make_row(2, content="x" * 30)]
    with pytest.raises(
        DataError, match=r"set data.max_prompt_length=47 to keep all of them, or 21 to keep half"
    ):
        PromptDataset([write_rows(tmp_path / "a.parquet", rows)], char_tokenizer, max_prompt_length=10)


def test_empty_file_is_named(tmp_path, char_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([make_row(0)]).slice(0, 0), path)
    with pytest.raises(DataError, match=r"no rows in .*empty.parquet.*empty"):
        PromptDataset([path], char_tokenizer)
