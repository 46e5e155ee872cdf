"""yolo9kit.extras.claims: a claim's verdict follows the measurement (true, false, undecided, not checked) and the
summary sentence states the measured numbers and the rule."""

from __future__ import annotations

import math

import pytest

from yolo9kit.extras.claims import FALSE, NOT_CHECKED, TRUE, UNDECIDED, Claim, judge

FASTER = Claim("gradient accumulation is faster than a large batch",
               quantity="time per update, accumulated / one batch", rule="<", threshold=1.0, unit="x")
HALVES = Claim("AMP halves memory", quantity="peak memory of the fp16 step / the fp32 step", rule="between",
               threshold=(0.4, 0.6), unit="x")


@pytest.mark.parametrize("values, verdict", [
    ([0.71, 0.75, 0.8], TRUE),
    ([1.31, 1.35, 1.42], FALSE),
    ([0.95, 1.02, 1.1], UNDECIDED),  # the spread straddles 1
])
def test_the_verdict_follows_the_measured_values(values, verdict):
    assert judge(FASTER, values).verdict == verdict


def test_the_summary_states_the_numbers_the_rule_and_the_outcome():
    result = judge(FASTER, [1.31, 1.35, 1.42])
    assert result.summary == ("Measured time per update, accumulated / one batch: median 1.35 x (1.31 to 1.42, "
                              "3 values); the claim needs < 1 x: the claim does not hold.")
    assert result.measured == "median 1.35 x (1.31 to 1.42, 3 values)"
    undecided = judge(FASTER, [0.95, 1.02, 1.1])
    assert "1 of 3 values meet it" in undecided.summary and undecided.holding == 1
    assert "median 1.02 x (0.95 to 1.1, 3 values)" in undecided.summary


def test_between_includes_both_ends_and_flips_outside_them():
    assert judge(HALVES, [0.4]).verdict == TRUE and judge(HALVES, [0.6]).verdict == TRUE
    assert judge(HALVES, [0.61]).verdict == FALSE and judge(HALVES, [0.39]).verdict == FALSE
    assert judge(HALVES, [0.55]).summary == ("Measured peak memory of the fp16 step / the fp32 step: 0.55 x; the "
                                             "claim needs between 0.4 and 0.6 x: the claim holds.")


@pytest.mark.parametrize("rule, threshold, holds, fails", [
    ("<=", 0, [0, 0.0], [0.02]),
    (">", 1, [4, 1.5], [1, 0.5]),
    (">=", 1, [1, 2], [0]),
    ("==", "SGD", ["SGD"], ["AdamW"]),
    ("==", True, [True], [False]),
])
def test_every_rule_can_come_out_either_way(rule, threshold, holds, fails):
    claim = Claim("a claim", quantity="a quantity", rule=rule, threshold=threshold)
    assert judge(claim, holds).verdict == TRUE
    assert judge(claim, fails).verdict == FALSE
    assert judge(claim, holds + fails).verdict == UNDECIDED


def test_a_flag_count_and_a_categorical_value_are_stated_in_the_summary():
    flag = Claim("the official training script has an --accumulate flag",
                 quantity="long options named --accumulate in train_dual.py", rule=">=", threshold=1, unit="options")
    flags = {"flags": ["--batch-size", "--epochs", "--imgsz"]}  # as the official flags file lists them
    absent = judge(flag, [flags["flags"].count("--accumulate")])
    assert absent.verdict == FALSE and "in train_dual.py: 0 options; the claim needs >= 1 options" in absent.summary
    assert judge(flag, [(flags["flags"] + ["--accumulate"]).count("--accumulate")]).verdict == TRUE
    optimizer = Claim("the default optimizer is AdamW", quantity="train_dual.py's default --optimizer", rule="==",
                      threshold="AdamW")
    assert judge(optimizer, ["SGD"]).summary == ("Measured train_dual.py's default --optimizer: SGD; the claim "
                                                 "needs == AdamW: the claim does not hold.")


def test_nothing_measured_is_not_checked():
    result = judge(FASTER, [])
    assert result.verdict == NOT_CHECKED and result.holding == 0
    assert result.summary == ("Not measured: time per update, accumulated / one batch; the claim is not checked (it "
                              "holds when the quantity is < 1 x).")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_value_is_an_error_naming_the_claim(bad):
    with pytest.raises(ValueError, match=r"AMP halves memory.*value 1 is (nan|inf)"):
        judge(HALVES, [0.5, bad])


def test_an_ordering_rule_refuses_text():
    with pytest.raises(ValueError, match="value 0 is 'fast'; rule '<' compares numbers"):
        judge(FASTER, ["fast"])


@pytest.mark.parametrize("rule, threshold, message", [
    ("~", 1.0, "rule '~' is not one of"),
    ("between", 0.5, "needs threshold=\\(low, high\\)"),
    ("between", (0.6, 0.4), "low <= high"),
    (">", "1", "needs a number as threshold"),
])
def test_a_badly_stated_claim_is_refused(rule, threshold, message):
    with pytest.raises(ValueError, match=message):
        Claim("a claim", quantity="q", rule=rule, threshold=threshold)


def test_a_claim_is_frozen():
    with pytest.raises(AttributeError):
        FASTER.threshold = 2.0
