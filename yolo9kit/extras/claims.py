"""Verdicts on claims about training (notebook 07): a ``Claim`` states what is measured, the rule a value must meet,
its threshold and unit before anything runs; ``judge`` reads the measured values and says True, False, or Undecided
(the spread straddles the threshold), e.g. ``judge(Claim("...", "time per update", "<", 1.0, "x"), [1.3, 1.4])``."""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TRUE, FALSE, UNDECIDED, NOT_CHECKED = "True", "False", "Undecided", "Not checked"
# "between": (low, high), both ends included; "==" compares exactly (a tolerance on a float is a "between")
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
RULES = (*_COMPARE, "between")


@dataclass(frozen=True)
class Claim:
    """A claim (``text``, "AMP halves memory") and how a measurement decides it, written down before measuring:
    the ``quantity`` measured, in words; the ``rule`` one value must meet (``RULES``) against ``threshold`` (a
    number, ``(low, high)`` for "between", also a string or bool for "=="); the ``unit`` ("x", "s", or "")."""

    text: str
    quantity: str
    rule: str
    threshold: Any
    unit: str = ""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"Claim {self.text!r}: rule {self.rule!r} is not one of {RULES}")
        if self.rule == "between":
            if not (isinstance(self.threshold, tuple) and len(self.threshold) == 2
                    and all(_is_number(t) for t in self.threshold) and self.threshold[0] <= self.threshold[1]):
                raise ValueError(f"Claim {self.text!r}: rule 'between' needs threshold=(low, high) numbers with "
                                 f"low <= high, got {self.threshold!r}")
        elif self.rule != "==" and not _is_number(self.threshold):
            raise ValueError(f"Claim {self.text!r}: rule {self.rule!r} needs a number as threshold, got "
                             f"{self.threshold!r}")

    def holds(self, value: Any) -> bool:
        """Whether one measured value meets the rule."""
        if self.rule == "between":
            return self.threshold[0] <= value <= self.threshold[1]
        return _COMPARE[self.rule](value, self.threshold)

    @property
    def condition(self) -> str:
        """The rule in words with its threshold and unit: ``"< 1 x"``, ``"between 0.4 and 0.6"``."""
        text = (f"between {_fmt(self.threshold[0])} and {_fmt(self.threshold[1])}" if self.rule == "between"
                else f"{self.rule} {_fmt(self.threshold)}")
        return f"{text} {self.unit}".rstrip()


@dataclass(frozen=True)
class Verdict:
    """What ``judge`` decided about ``claim``: ``verdict`` "True" (every value meets the rule), "False" (none
    does), "Undecided" (some do) or "Not checked" (nothing measured); ``summary``, one sentence with the numbers,
    the rule and the verdict; the ``values`` as given and how many are ``holding``."""

    claim: Claim
    verdict: str
    summary: str
    values: tuple
    holding: int

    @property
    def measured(self) -> str:
        """The median and range of numbers, or the distinct values."""
        return _describe(self.values, self.claim.unit)


def judge(claim: Claim, measured_values: Iterable[Any]) -> Verdict:
    """Decide ``claim`` from its measured values (repeats of one measurement, or one value).

    Args:
        claim: the claim with its rule, stated before measuring.
        measured_values: the values of ``claim.quantity`` (finite numbers); none: "Not checked".

    Returns:
        A ``Verdict``: true when every value meets the rule, false when none does, undecided otherwise.

    Raises:
        ValueError: a number not finite, or not a number for an ordering rule (naming the claim and the value).
    """
    values = tuple(measured_values)
    for i, value in enumerate(values):
        if _is_number(value) and not math.isfinite(value):
            raise ValueError(f"judge({claim.text!r}): measured value {i} is {value}; every value must be finite "
                             "(check the measurement that produced it)")
        if claim.rule != "==" and not _is_number(value):
            raise ValueError(f"judge({claim.text!r}): measured value {i} is {value!r}; rule {claim.rule!r} "
                             "compares numbers")
    if not values:
        return Verdict(claim, NOT_CHECKED, f"Not measured: {claim.quantity}; the claim is not checked (it "
                       f"holds when the quantity is {claim.condition}).", values, 0)
    holding = sum(bool(claim.holds(v)) for v in values)
    verdict = TRUE if holding == len(values) else FALSE if holding == 0 else UNDECIDED
    outcome = {TRUE: "the claim holds", FALSE: "the claim does not hold",
               UNDECIDED: f"undecided: {holding} of {len(values)} values meet it, the spread straddles the "
                          "threshold"}[verdict]
    summary = (f"Measured {claim.quantity}: {_describe(values, claim.unit)}; the claim needs "
               f"{claim.condition}: {outcome}.")
    return Verdict(claim, verdict, summary, values, holding)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    """Numbers to 3 significant digits (integers whole), anything else as text."""
    if isinstance(value, float):
        return f"{value:.3g}" if value != int(value) or abs(value) >= 1e4 else f"{int(value)}"
    return str(value)


def _describe(values: tuple, unit: str) -> str:
    """``"median 1.35 x (1.31 to 1.42, 3 values)"``, ``"0 options"``, or the distinct values (strings, booleans)."""
    suffix = f" {unit}" if unit else ""
    if not values:
        return "nothing measured"
    if not all(_is_number(v) for v in values):
        distinct = list(dict.fromkeys(_fmt(v) for v in values))
        counts = f" ({len(values)} values)" if len(values) > 1 else ""
        return ", ".join(distinct) + suffix + counts
    if len(values) == 1:
        return f"{_fmt(values[0])}{suffix}"
    return (f"median {_fmt(float(statistics.median(values)))}{suffix} ({_fmt(min(values))} to {_fmt(max(values))}, "
            f"{len(values)} values)")
