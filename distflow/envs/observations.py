"""An environment's answer as tokens: the chat template's tool turn after the policy's turn."""

_MARK = "\x00OBSERVATION\x00"


class ObservationEncoder:
    """The token ids of an environment's answer as the chat template writes a tool turn after the policy's
    turn, e.g. Qwen's "\\n<|im_start|>tool\\n{text}<|im_end|>\\n<|im_start|>assistant\\n": what closes the
    policy's turn after its end token, the tool turn, and the opening of the next policy turn."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        before = tokenizer.apply_chat_template(base, tokenize=False)
        after = tokenizer.apply_chat_template(
            base + [{"role": "tool", "content": _MARK}], add_generation_prompt=True, tokenize=False
        )
        if not after.startswith(before) or _MARK not in after:
            raise ValueError("the chat template does not render a tool turn after an assistant turn")
        eos = tokenizer.eos_token
        closing = before[before.rindex(eos) + len(eos) :] if eos and eos in before else ""
        head, tail = after[len(before) :].split(_MARK)
        self.head, self.tail = closing + head, tail
        self.eos_id = tokenizer.eos_token_id

    def ids(self, text: str, turn_ended: bool) -> list[int]:
        """turn_ended: the policy's turn ended with its end token; otherwise it is closed here first."""
        ids = self.tokenizer.encode(self.head + text + self.tail, add_special_tokens=False)
        return ids if turn_ended else [self.eos_id] + ids
