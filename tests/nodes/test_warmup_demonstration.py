"""What the supervised warm-up imitates (nodes/warmup.demonstration): the ground truth and EOS, or a
multi-turn row's demonstration, held as a trajectory holds it (the tool's answer as the template's tool
turn, masked out)."""

from types import SimpleNamespace

from distflow.envs.observations import ObservationEncoder
from distflow.models.tiny_tokenizer import train_tiny_tokenizer
from distflow.nodes.warmup import demonstration


def test_a_single_answer_is_the_ground_truth_and_eos():
    tokenizer = train_tiny_tokenizer(300)
    ids, mask = demonstration(tokenizer, SimpleNamespace(extra_info={}, ground_truth="1234"))
    assert ids == tokenizer.encode("1234", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert mask == [1.0] * len(ids)


def test_a_tool_demonstration_masks_the_tools_answer():
    tokenizer = train_tiny_tokenizer(300)
    turns = [
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "lookup", "arguments": {"key": "k7"}}</tool_call>',
        },
        {"role": "tool", "content": "064"},
        {"role": "assistant", "content": "064"},
    ]
    ids, mask = demonstration(tokenizer, SimpleNamespace(extra_info={"sft_turns": turns}, ground_truth="064"))
    eos = tokenizer.eos_token_id
    call = tokenizer.encode(turns[0]["content"], add_special_tokens=False) + [eos]
    answer = ObservationEncoder(tokenizer).ids("064", turn_ended=True)
    final = tokenizer.encode("064", add_special_tokens=False) + [eos]
    assert ids == call + answer + final
    assert mask == [1.0] * len(call) + [0.0] * len(answer) + [1.0] * len(final)
