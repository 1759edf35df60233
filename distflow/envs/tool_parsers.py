"""Tool calls in a model turn's text, in the chat template's format (rollout.tool_parser).

`hermes` (Qwen2.5 / Qwen3 / Hermes templates): each call is a JSON object {"name": ..., "arguments": {...}}
between <tool_call> and </tool_call>. A call that does not parse is kept as a call to the tool named
"<malformed>" with the raw text, so the environment can answer it as a tool error (the policy learns from
it) instead of the text passing for a final answer. A user's parser is a class loaded by dotted path with
`parse(text) -> tuple[ToolCall, ...]` and `MARKERS` (the strings its format uses in a chat template).
"""

import json
import re

from distflow.envs.base import ToolCall

MALFORMED = "<malformed>"


class HermesToolParser:
    MARKERS = ("<tool_call>",)
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        return tuple(self._call(body.strip()) for body in self._CALL.findall(text))

    @staticmethod
    def _call(body: str) -> ToolCall:
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return ToolCall(MALFORMED, {"text": body})
        name, arguments = (
            (call.get("name"), call.get("arguments", {})) if isinstance(call, dict) else (None, None)
        )
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return ToolCall(MALFORMED, {"text": body})
        return ToolCall(name, arguments)


class Llama3JsonToolParser:
    """Llama 3.1+ templates: a call is a JSON object {"name": ..., "parameters": {...}} after <|python_tag|>
    (or the whole turn)."""

    MARKERS = ("<|python_tag|>",)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        body = text.split("<|python_tag|>", 1)[-1].strip()
        if not body.startswith("{"):
            return ()
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return (ToolCall(MALFORMED, {"text": body}),)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return (ToolCall(MALFORMED, {"text": body}),)
        return (ToolCall(call["name"], dict(call.get("parameters") or call.get("arguments") or {})),)


PARSERS = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}


def template_mismatch(parser, chat_template: str | None) -> str | None:
    """Why `parser` does not fit a tokenizer's chat template (None: it may). A template that names another
    known format's tool-call marker and none of the parser's was written for that other format; a template
    without any marker (a base model's, a tiny test model's) leaves the format to be learned."""
    template = chat_template or ""
    if any(marker in template for marker in parser.MARKERS):
        return None
    others = [name for name, cls in PARSERS.items() if any(m in template for m in cls.MARKERS)]
    if others:
        return f"the chat template writes tool calls in the {others[0]!r} format ({PARSERS[others[0]].MARKERS[0]})"
    return None
