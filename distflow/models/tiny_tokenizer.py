"""A small byte-level BPE tokenizer trained in code, for tiny test models (no hub, no files of the machine).

The corpus is generated from a fixed seed (numbers, arithmetic, short English sentences), so the same
arguments always give the same vocabulary and merges: tests and rollouts stay reproducible across machines.
"""

import json
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Qwen-style special tokens: pad/end-of-text, chat turn markers. bos is its own token so that models which
# prepend one (Llama-style) have a dedicated id, even though this tokenizer never adds it by itself.
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, IM_START, IM_END]

# Qwen chat format: every turn is "<|im_start|>role\ncontent<|im_end|>\n"; the generation prompt opens an
# assistant turn. The model's eos is <|im_end|>, so generation stops at the end of the turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2-style pre-tokenization: NFC, then split words, single digits, punctuation runs and whitespace before
# byte-level mapping. It must match transformers' Qwen2Tokenizer exactly: AutoTokenizer rebuilds every
# model_type "qwen2" tokenizer with that pipeline, and a different split would tokenize the same text
# differently per family (e.g. "23" as one token here and two there).
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_ARITHMETIC = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}

_WORDS = (
    "the a an one two three four five six seven eight nine ten cat dog bird fish tree house car ball book "
    "apple orange water sun moon star red blue green big small old new happy sad fast slow runs sees eats "
    "has is are was were and or but with on in at to from of for answer question what how many much total "
    "sum plus minus times divided equals number left right yes no please think step first then so because "
    "Alice Bob Carol Tom Anna has buys gives sells each more less than apples candies coins students "
    "user assistant system"
).split()


def synthetic_corpus(seed: int, lines: int = 4000, tool_calls: bool = False) -> list[str]:
    """Lines of arithmetic, word problems and simple English, drawn from `random.Random(seed)`; with
    `tool_calls`, Hermes tool calls after them (the same lines first: the rest of the vocabulary stays close)."""
    if tool_calls:
        return synthetic_corpus(seed, lines) + _tool_call_lines(seed, lines // 4)
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.randrange(5)
        a, b = rng.randrange(100), rng.randrange(1, 100)
        if kind == 0:
            op = rng.choice("+-*")
            out.append(f"{a} {op} {b} = {_ARITHMETIC[op](a, b)}")
        elif kind == 1:
            name = rng.choice(["Alice", "Bob", "Carol", "Tom", "Anna"])
            out.append(f"{name} has {a} apples and buys {b} more. How many apples? The answer is {a + b}.")
        elif kind == 2:
            out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 14))).capitalize() + ".")
        elif kind == 3:
            # Chat turns put the role right after <|im_start|>, with no space: learn those words bare.
            out.append(rng.choice(["user", "assistant", "system"]) + "\n" + rng.choice(_WORDS).capitalize())
        else:
            out.append(f"Question: what is {a} plus {b}? Let me think step by step. {a} + {b} = {a + b}.")
    return out


def _tool_call_lines(seed: int, lines: int) -> list[str]:
    """Hermes-format calls of the built-in tools (distflow/envs/builtin.py), as Qwen2.5's template writes them.
    Why: a real tokenizer spends ~20 tokens on such a call; a byte-level vocabulary that never saw one spends
    ~70, and every one of them is a decode step on the CPU engine and a token the tiny policy must learn."""
    rng = random.Random(seed + 1)
    out = []
    for _ in range(lines):
        a, b = rng.randrange(100), rng.randrange(1, 100)
        name, arguments = rng.choice(
            [("lookup", {"key": str(rng.randrange(100))}), ("calculator", {"expression": f"{a} * {b}"})]
        )
        out.append(f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>')
    return out


def train_tiny_tokenizer(vocab_size: int, seed: int = 0, tool_calls: bool = False) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE with exactly `vocab_size` entries (specials included) on the seeded corpus
    (with `tool_calls`: and on tool calls, see _tool_call_lines)."""
    min_size = 256 + len(SPECIAL_TOKENS)  # the byte alphabet plus the specials, before any merge
    assert vocab_size >= min_size, f"vocab_size {vocab_size} too small: a byte-level BPE needs >= {min_size}"
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_corpus(seed, tool_calls=tool_calls), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
