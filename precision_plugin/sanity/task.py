"""The sanity task: reverse a short string, an answer that can be checked exactly.

A prompt is ``"<letters>>"`` (e.g. ``"cabd>"``) and the answer is the letters reversed
(``"dbac"``), followed by end-of-sequence. The reward is 1.0 for the exact answer and 0.0
otherwise, a binary verifiable reward like the paper's math sanity set. Problems come from a
seeded generator, so the same seed gives the same problem set in every dtype.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Letters the strings are drawn from.
LETTERS = "abcdef"
#: Separator between the string and its answer.
SEP = ">"


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt the model sees and the answer it must produce."""

    prompt: str
    answer: str


def make_problem(letters: str) -> Problem:
    """The problem for ``letters``: prompt ``letters + SEP``, answer ``letters`` reversed."""
    if not letters or any(c not in LETTERS for c in letters):
        from precision_plugin.errors import PrecisionConfigError

        raise PrecisionConfigError(
            f"sanity task: {letters!r} is not a non-empty string over {LETTERS!r}; "
            f"use only those letters."
        )
    return Problem(prompt=letters + SEP, answer=letters[::-1])


def make_problems(count: int, seed: int, min_len: int = 3, max_len: int = 6) -> list[Problem]:
    """``count`` distinct problems with strings of ``min_len``..``max_len`` letters, seeded."""
    if count < 1 or not 1 <= min_len <= max_len:
        from precision_plugin.errors import PrecisionConfigError

        raise PrecisionConfigError(
            f"sanity task: count={count}, lengths {min_len}..{max_len}; pass count >= 1 and "
            f"1 <= min_len <= max_len."
        )
    space = sum(len(LETTERS) ** n for n in range(min_len, max_len + 1))
    if count > space:
        from precision_plugin.errors import PrecisionConfigError

        raise PrecisionConfigError(
            f"sanity task: {count} distinct problems asked, only {space} exist with lengths "
            f"{min_len}..{max_len}; ask for fewer."
        )
    rng = random.Random(seed)
    seen: dict[str, Problem] = {}
    while len(seen) < count:
        n = rng.randint(min_len, max_len)
        letters = "".join(rng.choice(LETTERS) for _ in range(n))
        seen.setdefault(letters, make_problem(letters))
    return list(seen.values())


def answer_of(prompt: str) -> str:
    """The correct answer to ``prompt`` (everything before ``SEP``, reversed)."""
    return prompt.split(SEP, 1)[0][::-1]


def score(prompt: str, completion: str) -> float:
    """1.0 when ``completion`` (whitespace ignored) is exactly the reversed string, else 0.0."""
    return 1.0 if "".join(completion.split()) == answer_of(prompt) else 0.0


def reward_exact(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
    """TRL reward function: the exact-match reward of each completion for its prompt."""
    return [score(_text(p), _text(c)) for p, c in zip(prompts, completions, strict=True)]


def _text(value: Any) -> str:
    # TRL passes plain strings for standard datasets, message lists for conversational ones.
    if isinstance(value, str):
        return value
    return "".join(m.get("content", "") for m in value if isinstance(m, dict))
