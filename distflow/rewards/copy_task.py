"""The toy copy task's "seq" reward (shared/research/toy_grpo.md): dense and length-aware, so GRPO learns
both to copy the digits and to stop.

The output sequence is the response's characters, followed by an EOS symbol when generation ended with the
tokenizer's EOS (not when it was cut at max_new_tokens); the target is the ground truth's characters plus
EOS. The reward is the number of positions where the two agree, divided by max(len(output), len(target)):
  target "1234":  "1234"+EOS -> 5/5 = 1.0;  "1234" (cut, no EOS) -> 4/5;  "12345"+EOS -> 4/6;
                  "1243"+EOS -> 3/5;  ""+EOS -> 0/5.
Characters are compared exactly (no stripping): the response text is decoded without special tokens.
"""

_EOS = object()  # never equal to a character


def score(solution_str: str, ground_truth, extra_info=None, *, ended_with_eos: bool) -> float:
    """The seq reward in [0, 1]; `ended_with_eos` says whether the response stopped at the EOS token."""
    output = list(solution_str) + ([_EOS] if ended_with_eos else [])
    target = list(str(ground_truth)) + [_EOS]
    matches = sum(o == t for o, t in zip(output, target))
    return matches / max(len(output), len(target))
