"""The sanity tasks: letter strings with answers that can be checked exactly.

The reward is 1.0 for the exact answer and 0.0 otherwise, a binary verifiable reward like the
paper's math sanity set. Problems come from a seeded generator, so the same seed gives the same
problem set in every dtype.

- [`ReverseTask`][precision_plugin.sanity.task.ReverseTask] (the default preset): a string of
  3-6 letters from ``abcdef`` and a separator, answered reversed, then end-of-sequence
  (``"cabd>"`` -> ``"dbac"``).
- [`ShiftTask`][precision_plugin.sanity.task.ShiftTask] (the ``long`` preset): a key of 8
  letters from ``a-z``, continued for 96 letters, each letter being the one 8 places back
  shifted 3 along the alphabet (``"abcdefgh"`` -> ``"defghijkghijklmn..."``): the key copied
  under a fixed shift, again and again, a long answer over a 26-letter alphabet. The answer
  fills the completion budget exactly (no end-of-sequence).
"""

from __future__ import annotations

import random
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from precision_plugin.errors import PrecisionConfigError

#: Separator between a reversal string and its answer.
SEP = ">"
#: TRL's log key for the mean of the reward (binary, so it is the accuracy).
ACCURACY_KEY = "rewards/reward_exact/mean"

RewardFn = Callable[..., list[float]]


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt the model sees and the answer it must produce."""

    prompt: str
    answer: str


@dataclass(frozen=True)
class Task(ABC):
    """A string task over ``letters``: how problems are drawn, answered and scored."""

    letters: str

    def __post_init__(self) -> None:
        if not self.letters or len(set(self.letters)) != len(self.letters) or SEP in self.letters:
            raise PrecisionConfigError(
                f"sanity task: letters {self.letters!r} must be distinct, non-empty and "
                f"without {SEP!r}."
            )

    @property
    def vocabulary(self) -> str:
        """Every character a prompt or answer may hold (one token each)."""
        return self.letters + SEP

    @property
    @abstractmethod
    def max_prompt_tokens(self) -> int:
        """Tokens of the longest prompt."""

    @property
    @abstractmethod
    def max_completion_tokens(self) -> int:
        """Tokens a completion may use (the trainer's ``max_completion_length``)."""

    @property
    @abstractmethod
    def ends_with_eos(self) -> bool:
        """Whether an answer is followed by end-of-sequence (else it fills the budget)."""

    @property
    @abstractmethod
    def space(self) -> int:
        """How many distinct problems exist."""

    @abstractmethod
    def draw(self, rng: random.Random) -> str:
        """The letters of one random problem."""

    @abstractmethod
    def prompt_of(self, letters: str) -> str:
        """The prompt for ``letters``."""

    @abstractmethod
    def answer_of(self, prompt: str) -> str:
        """A correct answer to ``prompt`` (the only one, unless the task allows several)."""

    def sample_answer(self, prompt: str, rng: random.Random) -> str:
        """A valid answer to ``prompt`` for supervised pretraining (tasks with several valid
        answers draw one with ``rng``)."""
        del rng
        return self.answer_of(prompt)

    @property
    def max_positions(self) -> int:
        """Positions a model needs: the longest prompt plus the longest completion."""
        return self.max_prompt_tokens + self.max_completion_tokens

    def make_problem(self, letters: str) -> Problem:
        """The problem whose prompt is built from ``letters``."""
        prompt = self.prompt_of(letters)
        return Problem(prompt=prompt, answer=self.answer_of(prompt))

    def make_problems(self, count: int, seed: int) -> list[Problem]:
        """``count`` distinct problems, seeded."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PrecisionConfigError(f"sanity task: count={count!r}; pass count >= 1.")
        if count > self.space:
            raise PrecisionConfigError(
                f"sanity task: {count} distinct problems asked, only {self.space} exist; "
                f"ask for fewer."
            )
        rng = random.Random(seed)
        seen: dict[str, Problem] = {}
        while len(seen) < count:
            letters = self.draw(rng)
            seen.setdefault(letters, self.make_problem(letters))
        return list(seen.values())

    def score(self, prompt: str, completion: str) -> float:
        """1.0 when ``completion`` (whitespace ignored) is exactly the answer, else 0.0."""
        return 1.0 if "".join(completion.split()) == self.answer_of(prompt) else 0.0

    def reward_function(self) -> RewardFn:
        """A TRL reward function for this task, logged as ``rewards/reward_exact/mean``."""

        def reward_exact(
            prompts: Sequence[Any], completions: Sequence[Any], **_: Any
        ) -> list[float]:
            """The exact-match reward of each completion for its prompt."""
            return [
                self.score(_text(p), _text(c)) for p, c in zip(prompts, completions, strict=True)
            ]

        return reward_exact

    def _check_letters(self, letters: str) -> None:
        if not letters or any(c not in self.letters for c in letters):
            raise PrecisionConfigError(
                f"sanity task: {letters!r} is not a non-empty string over {self.letters!r}; "
                f"use only those letters."
            )


@dataclass(frozen=True)
class ReverseTask(Task):
    """Reverse a string of ``min_len``..``max_len`` letters: prompt ``letters + SEP``."""

    min_len: int = 3
    max_len: int = 6

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.min_len <= self.max_len:
            raise PrecisionConfigError(
                f"sanity task: lengths {self.min_len}..{self.max_len}; pass "
                f"1 <= min_len <= max_len."
            )

    @property
    def max_prompt_tokens(self) -> int:
        """The longest string and its separator."""
        return self.max_len + 1

    @property
    def max_completion_tokens(self) -> int:
        """The longest answer, its EOS and one spare."""
        return self.max_len + 2

    @property
    def ends_with_eos(self) -> bool:
        """Answers end with EOS."""
        return True

    @property
    def space(self) -> int:
        """Strings of every allowed length."""
        return sum(len(self.letters) ** n for n in range(self.min_len, self.max_len + 1))

    def draw(self, rng: random.Random) -> str:
        """A string whose length is uniform in ``min_len..max_len``."""
        n = rng.randint(self.min_len, self.max_len)
        return "".join(rng.choice(self.letters) for _ in range(n))

    def prompt_of(self, letters: str) -> str:
        """``letters + SEP``."""
        self._check_letters(letters)
        return letters + SEP

    def answer_of(self, prompt: str) -> str:
        """Everything before ``SEP``, reversed."""
        return prompt.split(SEP, 1)[0][::-1]


@dataclass(frozen=True)
class ShiftTask(Task):
    """Continue a key of ``period`` letters for ``answer_len`` letters: each letter is the one
    ``period`` places back shifted along ``letters`` (wrapping) by any of ``shifts``.

    With one shift the answer is unique; with several, every letter is a free choice among
    ``len(shifts)`` valid ones (like the many valid wordings of a reasoning chain), the reward
    checks the rule, and a model that follows it samples with entropy at every position.
    """

    period: int = 8
    answer_len: int = 96
    shifts: tuple[int, ...] = (3,)

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(self.letters)
        distinct = len({s % n for s in self.shifts}) == len(self.shifts)
        if (
            self.period < 1
            or self.answer_len < 1
            or not self.shifts
            or not distinct
            or any(s % n == 0 for s in self.shifts)
        ):
            raise PrecisionConfigError(
                f"sanity task: period={self.period}, answer_len={self.answer_len}, "
                f"shifts={self.shifts}; pass period >= 1, answer_len >= 1 and distinct shifts "
                f"that are not multiples of {n}."
            )

    @property
    def max_prompt_tokens(self) -> int:
        """The key."""
        return self.period

    @property
    def max_completion_tokens(self) -> int:
        """The answer exactly: it fills the completion budget."""
        return self.answer_len

    @property
    def ends_with_eos(self) -> bool:
        """Answers fill the budget; no EOS."""
        return False

    @property
    def space(self) -> int:
        """Every key."""
        return len(self.letters) ** self.period

    def draw(self, rng: random.Random) -> str:
        """A random key."""
        return "".join(rng.choice(self.letters) for _ in range(self.period))

    def prompt_of(self, letters: str) -> str:
        """The key itself (``period`` letters)."""
        self._check_letters(letters)
        if len(letters) != self.period:
            raise PrecisionConfigError(
                f"sanity task: key {letters!r} has {len(letters)} letters; the task's period "
                f"is {self.period}."
            )
        return letters

    def answer_of(self, prompt: str) -> str:
        """The answer that always takes the first shift."""
        return self._continue(prompt, lambda: self.shifts[0])

    def sample_answer(self, prompt: str, rng: random.Random) -> str:
        """A valid answer whose shift at each letter is drawn uniformly from ``shifts``."""
        return self._continue(prompt, lambda: rng.choice(self.shifts))

    def score(self, prompt: str, completion: str) -> float:
        """1.0 when ``completion`` (whitespace ignored) has ``answer_len`` letters, each one the
        letter ``period`` places back shifted by one of ``shifts``; else 0.0."""
        text = "".join(completion.split())
        if len(text) != self.answer_len or any(c not in self.letters for c in text):
            return 0.0
        n = len(self.letters)
        allowed = {s % n for s in self.shifts}
        seq = [self.letters.index(c) for c in prompt[-self.period :] + text]
        ok = all(
            (seq[i] - seq[i - self.period]) % n in allowed for i in range(self.period, len(seq))
        )
        return 1.0 if ok else 0.0

    def _continue(self, prompt: str, shift: Callable[[], int]) -> str:
        n = len(self.letters)
        seq = [self.letters.index(c) for c in prompt[-self.period :]]
        for _ in range(self.answer_len):
            seq.append((seq[-self.period] + shift()) % n)
        return "".join(self.letters[i] for i in seq[self.period :])


#: The default preset's task.
REVERSE = ReverseTask(letters="abcdef", min_len=3, max_len=6)
#: The ``long`` preset's task: an 8-letter key of a-z continued for 96 letters, each shifted
#: by 3 or 4 (a free choice at every letter).
SHIFT = ShiftTask(letters=string.ascii_lowercase, period=8, answer_len=96, shifts=(3, 4))


def _text(value: Any) -> str:
    # TRL passes plain strings for standard datasets, message lists for conversational ones.
    if isinstance(value, str):
        return value
    return "".join(m.get("content", "") for m in value if isinstance(m, dict))
