"""Built-in environments (rollout.env=<name>).

single_turn: the trajectory ends after the first model turn (today's rollout, as an environment).
calculator: a tool `calculator(expression)` evaluating +, -, *, /, //, %, ** and parentheses on numbers.
python: a tool `python(code)` running the code in a sandboxed interpreter (python_sandbox.py: CPU time,
memory, wall-clock and output limits, no processes, no network, a scratch directory); it answers with the
code's output, or with how it failed.
lookup: a tool `lookup(key)` reading the prompt's own table (extra_info["table"]: a dict, or [{key, value}]
entries): the toy task whose
answer can only be known through the tool (tools/prepare_data.py lookup).
With a tool environment, a turn without a tool call is the final answer and ends the trajectory.
"""

import ast
import operator

from distflow.envs.base import Action, Environment, StepResult, ToolCall
from distflow.envs.python_sandbox import SandboxLimits, run_python
from distflow.envs.tool_parsers import MALFORMED


class ToolError(Exception):
    """A tool call that cannot be answered (unknown tool, bad arguments): the model reads the message."""


class SingleTurn(Environment):
    def step(self, action: Action) -> StepResult:
        return StepResult(done=True)


class ToolEnvironment(Environment):
    """Answers every tool call of a turn with its tool's output (one line each); errors become the line
    `error: ...` and are counted, so a malformed call costs the policy a turn, not the run."""

    def tools(self) -> dict:
        """tool name -> callable(**arguments) -> text."""
        raise NotImplementedError

    def step(self, action: Action) -> StepResult:
        if not action.tool_calls:
            return StepResult(done=True)
        lines, errors = [], 0
        for call in action.tool_calls:
            try:
                lines.append(str(self._call(call)))
            except ToolError as err:
                lines.append(f"error: {err}")
                errors += 1
        return StepResult(
            "\n".join(lines), info={"tool_calls": len(action.tool_calls), "tool_errors": errors}
        )

    def _call(self, call: ToolCall):
        if call.name == MALFORMED:
            raise ToolError(f"not a tool call: {call.arguments['text'][:80]!r}")
        tool = self.tools().get(call.name)
        if tool is None:
            raise ToolError(f"no tool {call.name!r}; tools: {', '.join(sorted(self.tools()))}")
        try:
            return tool(**call.arguments)
        except TypeError as err:  # missing or unexpected arguments
            raise ToolError(f"{call.name}: {err}") from None


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(expression: str) -> float | int:
    """Arithmetic only (no names, calls or attributes): the expression is parsed, never executed."""
    try:
        tree = ast.parse(str(expression), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:  # 10**10**10 would not finish
            raise ToolError("exponent too large")
        try:
            return _OPERATORS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.operand))
    raise ToolError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


class Calculator(ToolEnvironment):
    def tools(self) -> dict:
        return {"calculator": lambda expression: evaluate(expression)}


class Python(ToolEnvironment):
    LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_mb=512, output_bytes=4096)

    def tools(self) -> dict:
        return {"python": self._run}

    def _run(self, code):
        result = run_python(str(code), self.LIMITS)
        if result.status != "ok":  # the policy reads why (a traceback's last lines, the limit it hit)
            raise ToolError(f"{result.status}: {result.stderr.strip()[-500:]}")
        return result.stdout


class Lookup(ToolEnvironment):
    def reset(self, sample) -> None:
        table = (sample.get("extra_info") or {}).get("table") or {}
        if isinstance(table, list):  # [{key, value}] entries: how a parquet row keeps a table of any keys
            table = {entry["key"]: entry["value"] for entry in table}
        self.table = {str(k): str(v) for k, v in table.items()}

    def tools(self) -> dict:
        return {"lookup": self._lookup}

    def _lookup(self, key):
        if str(key) not in self.table:
            raise ToolError(f"no key {key!r}")
        return self.table[str(key)]


BUILTIN = {"single_turn": SingleTurn, "calculator": Calculator, "python": Python, "lookup": Lookup}
