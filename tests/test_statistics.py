"""caco_tf.evaluation.statistics: the intervals against closed forms on fixed numbers, and the
verdicts a paired comparison allows."""

import math

import pytest

from caco_tf.evaluation import statistics

# Student's t quantiles t(p; df) in closed form for df 1 (Cauchy) and 2, and df 4 from the
# tables.
P = 0.975
T_975 = {1: math.tan(math.pi * (P - 0.5)), 2: (2 * P - 1) / math.sqrt(2 * P * (1 - P)),
         4: 2.7764451051977987}


def test_the_mean_interval_is_students_t_on_fixed_numbers():
    values = [97.1, 97.9, 97.5]  # mean 97.5, sample sd 0.4
    interval = statistics.mean_interval(values)
    half = T_975[2] * 0.4 / math.sqrt(3)
    assert interval.mean == pytest.approx(97.5)
    assert (interval.low, interval.high) == pytest.approx((97.5 - half, 97.5 + half), rel=1e-9)
    assert interval.count == 3
    five = statistics.mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # sd sqrt(2.5)
    assert five.high - 3.0 == pytest.approx(T_975[4] * math.sqrt(2.5) / math.sqrt(5), rel=1e-9)


def test_one_value_leaves_the_interval_unbounded_and_none_is_refused():
    interval = statistics.mean_interval([97.0])
    assert interval.mean == 97.0 and interval.low == -math.inf and interval.high == math.inf
    with pytest.raises(ValueError, match="at least one value"):
        statistics.mean_interval([])


def test_a_paired_comparison_claims_only_what_its_interval_excludes():
    # B is below A by 0.2 to 0.4 on every seed: the paired interval excludes 0.
    a, b = [97.9, 98.1, 97.6], [97.6, 97.9, 97.2]
    beats = statistics.paired_comparison(a, b, names=("vicreg", "caco"))
    assert beats.verdict == "vicreg above caco" and beats.difference.low > 0
    assert statistics.paired_comparison(b, a, names=("caco", "vicreg")).verdict == (
        "vicreg above caco")
    # The same means with the differences' signs mixed: no difference measured, although the
    # means differ by as much.
    mixed = statistics.paired_comparison([98.4, 97.2, 98.0], [97.6, 97.9, 97.2])
    assert mixed.difference.mean == pytest.approx(0.3) and mixed.verdict == (
        statistics.NO_DIFFERENCE)
    # Two seeds, df 1: even a steady gap of ±0.1 spread stays unresolved.
    two = statistics.paired_comparison([98.0, 98.4], [97.9, 98.1])
    assert two.difference.high - two.difference.mean == pytest.approx(
        T_975[1] * math.sqrt(0.02) / math.sqrt(2), rel=1e-9)
    assert two.verdict == statistics.NO_DIFFERENCE
    with pytest.raises(ValueError, match="one of each per seed: 3 against 2"):
        statistics.paired_comparison([1, 2, 3], [1, 2])


def test_an_accuracys_standard_error_is_the_binomial_one():
    # sqrt(p (1 - p) / n) in points: 0.5 · 0.5 / 20,000 → 0.3536; 0.9 · 0.1 / 100 → 3.0.
    assert statistics.accuracy_standard_error(50.0, 20_000) == pytest.approx(
        100 * math.sqrt(0.25 / 20_000), rel=1e-12)
    assert statistics.accuracy_standard_error(90.0, 100) == pytest.approx(3.0, rel=1e-12)
    assert statistics.accuracy_standard_error(100.0, 10) == 0.0
    with pytest.raises(ValueError, match="in \\[0, 100\\] % on at least one image, not 101"):
        statistics.accuracy_standard_error(101.0, 10)


def t2_quantile(q):
    """Student's t quantile with 2 degrees of freedom, in closed form."""
    return (2 * q - 1) / math.sqrt(2 * q * (1 - q))


def test_the_paired_p_is_the_two_sided_t_test_in_closed_form():
    # Differences 1, 2, 3: mean 2, sd 1, t = 2 sqrt(3); with 2 degrees of freedom the two-sided
    # p is 1 - |t| / sqrt(2 + t^2).
    t = 2 * math.sqrt(3)
    assert statistics.paired_p_value([11, 12, 13], [10, 10, 10]) == pytest.approx(
        1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert statistics.paired_p_value([5, 6], [4, 5]) == 0.0  # equal differences: no spread
    assert statistics.paired_p_value([5, 6], [5, 6]) == 1.0
    with pytest.raises(ValueError, match="two seeds"):
        statistics.paired_p_value([1.0], [2.0])


def test_holm_is_statsmodels_multipletests_on_fixed_numbers():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.005, 0.2, 0.04, 0.5, 0.0001]
    expected = multipletests(p, alpha=0.05, method="holm")[1]
    assert statistics.holm(p) == pytest.approx(list(expected), rel=1e-12)
    # By hand: sorted 0.0001, 0.005, 0.01, 0.03, 0.04, 0.04, 0.2, 0.5 times 8, 7, ..., 1.
    assert statistics.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert statistics.holm([]) == [] and statistics.holm([0.7]) == [0.7]


def test_the_resolvable_difference_is_the_t_quantiles_sum_in_closed_form():
    # Three seeds (2 degrees of freedom), 66 pairs: level 0.05 / 132, power 0.8.
    level = 0.05 / (2 * 66)
    expected = (t2_quantile(1 - level) + t2_quantile(0.8)) * 1.5 / math.sqrt(3)
    assert statistics.resolvable_difference(1.5, 3, pairs=66) == pytest.approx(expected, rel=1e-9)
    assert statistics.resolvable_difference(1.5, 1) == math.inf
    needed = statistics.seeds_to_resolve(2.0, 1.5, pairs=66)
    assert statistics.resolvable_difference(1.5, needed, pairs=66) <= 2.0 < \
        statistics.resolvable_difference(1.5, needed - 1, pairs=66)
