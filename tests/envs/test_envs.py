"""The environment API (distflow/envs): built-in environments, tool-call parsing, loading by name or dotted
path with named errors, and the chat template's tool turn as tokens. Pure: no engine."""

import pytest

from distflow.envs import Action, EnvError, Environment, StepResult, ToolCall, load_environment
from distflow.envs.builtin import Calculator, Lookup, Python, SingleTurn, evaluate
from distflow.envs.loading import load_tool_parser
from distflow.envs.observations import ObservationEncoder
from distflow.envs.tool_parsers import MALFORMED, HermesToolParser, Llama3JsonToolParser, template_mismatch
from distflow.models.tiny_tokenizer import train_tiny_tokenizer


def test_hermes_calls_are_read_and_malformed_ones_kept():
    text = (
        'Let me look. <tool_call>\n{"name": "lookup", "arguments": {"key": "k7"}}\n</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": 3}</tool_call>'
    )
    assert HermesToolParser().parse(text) == (
        ToolCall("lookup", {"key": "k7"}),
        ToolCall(MALFORMED, {"text": "{not json}"}),
        ToolCall(MALFORMED, {"text": '{"name": 3}'}),
    )
    assert HermesToolParser().parse("The answer is 42.") == ()


def test_llama3_json_calls():
    parser = Llama3JsonToolParser()
    assert parser.parse('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+1"}}') == (
        ToolCall("calculator", {"expression": "1+1"}),
    )
    assert parser.parse("plain answer") == ()


def test_a_parser_that_does_not_fit_the_chat_template_is_named():
    assert template_mismatch(HermesToolParser(), "{{ '<tool_call>' }}") is None
    assert template_mismatch(HermesToolParser(), "plain template") is None  # the format is learned
    assert "'llama3_json' format" in template_mismatch(HermesToolParser(), "{{ '<|python_tag|>' }}")


def test_tool_environments_answer_each_call_and_count_errors():
    calc = Calculator()
    calc.reset({})
    calls = (
        ToolCall("calculator", {"expression": "2 * (3 + 4) - 2 ** 3"}),
        ToolCall("calculator", {"expression": "__import__('os')"}),
        ToolCall("search", {"q": "x"}),
        ToolCall("calculator", {"expr": "1"}),
        ToolCall(MALFORMED, {"text": "{oops"}),
    )
    result = calc.step(Action("", calls))
    lines = result.observation.split("\n")
    assert lines[0] == "6" and not result.done
    assert lines[1].startswith("error: only numbers") and "no tool 'search'" in lines[2]
    assert "unexpected keyword argument 'expr'" in lines[3] and lines[4].startswith("error: not a tool call")
    assert result.info == {"tool_calls": 5, "tool_errors": 4}
    assert calc.step(Action("The answer is 6.")).done  # no call: the final answer


def test_calculator_refuses_what_would_not_finish():
    assert evaluate("7 // 2 + 7 % 2") == 4
    for bad in ("10 ** 10 ** 10", "1 / 0", "x + 1", "len('a')"):
        with pytest.raises(Exception, match="exponent|division|only numbers"):
            evaluate(bad)


def test_lookup_reads_its_prompts_table():
    env = Lookup()
    env.reset({"extra_info": {"table": {"k1": "red", "k2": "blue"}}})
    assert env.step(Action("", (ToolCall("lookup", {"key": "k2"}),))).observation == "blue"
    assert env.step(Action("", (ToolCall("lookup", {"key": "k9"}),))).observation == "error: no key 'k9'"
    assert SingleTurn().step(Action("anything")).done


class NoStep:
    def reset(self, sample):
        pass


class AbstractStep(Environment):
    pass


class NeedsArguments(Environment):
    def __init__(self, table):
        self.table = table

    def step(self, action):
        return StepResult(done=True)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "calculater",
            "rollout.env='calculater' is not a built-in (calculator, lookup, python, single_turn)",
        ),
        ("no_such_module_x:Env", "cannot import module 'no_such_module_x'"),
        ("tests.envs.test_envs:Missing", "has no function 'Missing'"),
        ("tests.envs.test_envs:NoStep", "the class NoStep lacks step"),
        ("tests.envs.test_envs:AbstractStep", "Environment.step is abstract"),
        ("tests.envs.test_envs:NeedsArguments", "NeedsArguments() must take no arguments"),
    ],
)
def test_a_bad_environment_is_named(spec, message):
    with pytest.raises(EnvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_environment(spec)


def test_environments_and_parsers_load_by_name_or_path():
    assert load_environment("lookup") is Lookup
    assert load_environment("distflow.envs.builtin:Calculator") is Calculator
    assert isinstance(load_tool_parser("hermes"), HermesToolParser)
    with pytest.raises(EnvError, match="rollout.tool_parser='xml' is not a built-in"):
        load_tool_parser("xml")


def test_the_environments_answer_is_the_templates_tool_turn():
    tokenizer = train_tiny_tokenizer(300)
    encoder = ObservationEncoder(tokenizer)
    text = tokenizer.decode(encoder.ids("42", turn_ended=True))
    assert text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # a turn cut short (no end token) is closed first
    assert encoder.ids("42", turn_ended=False) == [tokenizer.eos_token_id] + encoder.ids(
        "42", turn_ended=True
    )
    # what the policy generated (up to its end token) followed by these ids is the whole conversation
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    policy_part = tokenizer.apply_chat_template(conversation, tokenize=False).removesuffix("\n")
    whole = tokenizer.apply_chat_template(
        conversation + [{"role": "tool", "content": "42"}], add_generation_prompt=True, tokenize=False
    )
    assert policy_part + text == whole


def test_a_template_without_a_tool_turn_is_refused():
    tokenizer = train_tiny_tokenizer(300)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match="does not render a tool turn"):
        ObservationEncoder(tokenizer)


def test_a_released_qwen_template_renders_the_tool_turn_as_a_user_turn():
    qwen = (
        "{% for message in messages %}{% if message.role == 'tool' %}"
        "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tokenizer = train_tiny_tokenizer(300)
    tokenizer.chat_template = qwen
    text = tokenizer.decode(ObservationEncoder(tokenizer).ids("blue", turn_ended=True))
    assert (
        text
        == "\n<|im_start|>user\n<tool_response>\nblue\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_python_tool_answers_with_output_or_the_failure():
    env = Python()
    env.reset({})
    calls = (
        ToolCall("python", {"code": "print(sum(range(10)))"}),
        ToolCall("python", {"code": "import socket; socket.create_connection(('127.0.0.1', 9))"}),
        ToolCall("python", {"code": "1/0"}),
    )
    result = env.step(Action("", calls))
    lines = result.observation.split("\n")
    assert lines[0] == "45"
    assert lines[2].startswith("error: blocked:") and "ZeroDivisionError" in result.observation
    assert result.info == {"tool_calls": 3, "tool_errors": 2}
