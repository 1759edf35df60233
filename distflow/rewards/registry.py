"""Which scorer scores a sample: built-in rule-based scorers by name, selection by data_source, custom
scorers by dotted path, and the signature contract every scorer is checked against when it is loaded.

The scorer contract:
    fn(solution_str: str, ground_truth, extra_info: dict | None = None) -> float
called with keyword arguments. Optional keyword parameters, passed only to scorers that declare them (or
take **kwargs): `data_source: str` (so verl-style `compute_score(data_source, solution_str, ...)`
functions work unchanged) and `ended_with_eos: bool` (the response stopped at EOS rather than at the length
limit). A scorer may also return a dict with a "score" entry. Built-in scorers return values in [0, 1],
except math_dapo: +1 / -1, DAPO's values (math_dapo.py).

Scorers are named by "module:function" strings rather than passed as objects so that the scoring worker
processes import them themselves (nothing to pickle, custom modules included).
"""

import functools
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Callable

from distflow.config.dotted_path import load_callable

# name -> "module:function"
BUILTIN_SCORERS = {
    "gsm8k": "distflow.rewards.gsm8k:score_strict",
    "gsm8k_flexible": "distflow.rewards.gsm8k:score_flexible",
    "gsm8k_verl": "distflow.rewards.gsm8k_verl:score",  # verl's exact rule, for comparable numbers
    "math": "distflow.rewards.math_answer:score",
    "math_dapo": "distflow.rewards.math_dapo:score",
    "copy": "distflow.rewards.copy_task:score",
}
# reward.name=auto: data_source -> built-in name. The names are the ones common RL datasets (and verl's
# preprocessing scripts) write, so existing parquet files score without configuration.
DATA_SOURCE_SCORERS = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math": "math",
    "math_dapo": "math_dapo",  # BytedTsinghua-SIA/DAPO-Math-17k and AIME-2024 (DAPO's own files)
    "distflow/copy": "copy",
    "distflow/lookup": "copy",  # the answer is the looked-up value, copied exactly
}
# reward.name=auto, after an exact match failed: data_source prefix (compared in lower case) -> built-in name.
# AIME files name themselves "aime24", "aime_2025", "AIME2024", ...; verl routes "aime*" to DAPO's scorer too.
DATA_SOURCE_PREFIX_SCORERS = {
    "aime": "math_dapo",
}
OPTIONAL_KWARGS = ("data_source", "ended_with_eos")
EXPECTED_SIGNATURE = (
    "fn(solution_str: str, ground_truth, extra_info: dict | None = None) -> float "
    f"(optional keyword parameters: {', '.join(OPTIONAL_KWARGS)})"
)


class ScorerError(ValueError):
    """A scorer that cannot be found, imported or called with the scorer contract."""


@dataclass(frozen=True)
class Scorer:
    """A loaded scorer: the function, where it came from, and which optional keywords it takes."""

    path: str
    fn: Callable
    optional_kwargs: tuple[str, ...]

    def __call__(
        self,
        solution_str: str,
        ground_truth,
        extra_info=None,
        *,
        data_source: str = "",
        ended_with_eos: bool = True,
    ) -> float:
        given = {"data_source": data_source, "ended_with_eos": ended_with_eos}
        kwargs = {k: given[k] for k in self.optional_kwargs}
        value = self.fn(solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info, **kwargs)
        if isinstance(value, dict):
            if "score" not in value:
                raise ScorerError(
                    f"scorer {self.path} returned a dict without a 'score' entry: {sorted(value)}"
                )
            value = value["score"]
        if not isinstance(value, numbers.Real) or not math.isfinite(value):  # numpy scalars are Real
            raise ScorerError(f"scorer {self.path} returned {value!r}; expected a finite float")
        return float(value)


@functools.cache
def load_scorer(path: str) -> Scorer:
    """Imports "module:function" (or "module.function") and checks it against the scorer contract."""
    try:
        fn = load_callable(path, f"scorer {path!r}")
    except ValueError as err:
        raise ScorerError(str(err)) from None
    return Scorer(path, fn, _check_signature(path, fn))


def _check_signature(path: str, fn: Callable) -> tuple[str, ...]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()  # builtins without a signature: trust them
    params = sig.parameters
    takes_var_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    optional = tuple(k for k in OPTIONAL_KWARGS if k in params or takes_var_kwargs)
    try:
        sig.bind(solution_str="", ground_truth="", extra_info=None, **{k: None for k in optional})
    except TypeError as e:
        raise ScorerError(
            f"scorer {path!r} has signature {fn.__name__}{sig}, which cannot be called as the "
            f"scorer contract requires ({e}); expected {EXPECTED_SIGNATURE}"
        ) from None
    return optional


def auto_scorer_name(data_source: str) -> str | None:
    """The built-in scorer reward.name=auto uses for `data_source`, or None when there is none."""
    if data_source in DATA_SOURCE_SCORERS:
        return DATA_SOURCE_SCORERS[data_source]
    lowered = str(data_source).lower()
    return next(
        (name for prefix, name in DATA_SOURCE_PREFIX_SCORERS.items() if lowered.startswith(prefix)), None
    )


def scorer_path(name: str, custom: str | None, data_source: str) -> str:
    """The scorer path for one sample under reward.name=`name` / reward.custom=`custom`."""
    if custom:
        return custom
    if name == "auto":
        name = auto_scorer_name(data_source)
        if name is None:
            raise ScorerError(
                f"reward.name=auto has no scorer for data_source {data_source!r}; known: "
                f"{sorted(DATA_SOURCE_SCORERS)} and names starting with "
                f"{sorted(DATA_SOURCE_PREFIX_SCORERS)}. Set reward.name or reward.custom."
            )
    if name not in BUILTIN_SCORERS:
        raise ScorerError(
            f"unknown reward.name {name!r}; choose 'auto' or one of {sorted(BUILTIN_SCORERS)}, "
            "or set reward.custom='module:function'"
        )
    return BUILTIN_SCORERS[name]
