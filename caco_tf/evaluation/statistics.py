"""What figures over seeds can say: a mean with its interval, and whether A beats B.

A comparison of methods trains each with the same seeds (the same data order and split for a
seed), so A and B are compared seed by seed: the paired difference d_s = a_s - b_s, its mean
and Student's t interval over the seeds.  One pair alone: "A beats B" only when that interval
excludes 0.  Many pairs at once (12 methods make 66): each pair's two-sided paired t-test p,
adjusted by Holm's step-down over the family (``holm``), so that the chance of any false "A
beats B" among them stays below the level; otherwise no difference was measured (which is not
"they are equal").  ``resolvable_difference`` says how small a difference a design of n seeds
can tell apart, ``seeds_to_resolve`` how many seeds a given difference needs.
"""

import collections
import math

from scipy import stats

Interval = collections.namedtuple("Interval", "mean low high count")
Comparison = collections.namedtuple("Comparison", "difference verdict")

NO_DIFFERENCE = "no difference measured"


def mean_interval(values, confidence=0.95):
    """The mean of ``values`` and its two-sided Student's t interval (n - 1 degrees of
    freedom); with one value the interval is unbounded (nothing is known of the spread)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_interval needs at least one value")
    count, mean = len(values), math.fsum(values) / len(values)
    if count == 1:
        return Interval(mean, -math.inf, math.inf, 1)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (count - 1))
    half = stats.t.ppf(0.5 + confidence / 2, count - 1) * sd / math.sqrt(count)
    return Interval(mean, mean - half, mean + half, count)


def interval_text(values, digits=1):
    """"mean [low, high]" of ``mean_interval`` (a report's cell); one value: "mean (1 seed)"."""
    if not values:
        return "–"
    found = mean_interval(values)
    if found.count == 1:
        return f"{found.mean:.{digits}f} (1 seed)"
    return f"{found.mean:.{digits}f} [{found.low:.{digits}f}, {found.high:.{digits}f}]"


def accuracy_standard_error(percent, count):
    """One standard error, in points, of an accuracy of ``percent`` % measured on ``count``
    images, sqrt(p (1 - p) / n): how far another draw of as many test images would move it."""
    if count < 1 or not 0.0 <= percent <= 100.0:
        raise ValueError(f"an accuracy in [0, 100] % on at least one image, not {percent} % "
                         f"on {count}")
    p = percent / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / count)


def paired_comparison(a, b, names=("A", "B"), confidence=0.95):
    """A's figures against B's, seed by seed (``a[i]`` and ``b[i]`` of the same seed): the
    interval of the mean difference a - b and the verdict it supports: "A above B", "B above
    A", or ``NO_DIFFERENCE`` when the interval holds 0."""
    if len(a) != len(b):
        raise ValueError(f"paired figures need one of each per seed: {len(a)} against {len(b)}")
    difference = mean_interval([x - y for x, y in zip(a, b)], confidence)
    if difference.low > 0:
        verdict = f"{names[0]} above {names[1]}"
    elif difference.high < 0:
        verdict = f"{names[1]} above {names[0]}"
    else:
        verdict = NO_DIFFERENCE
    return Comparison(difference, verdict)


def paired_p_value(a, b):
    """The two-sided p of the paired t-test of a - b against 0 (n - 1 degrees of freedom);
    differences all equal give 0 (or 1 when they are all 0): no spread to test against."""
    differences = [float(x) - float(y) for x, y in zip(a, b)]
    count = len(differences)
    if count < 2:
        raise ValueError("a paired test needs two seeds or more")
    mean = math.fsum(differences) / count
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (count - 1))
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return float(2.0 * stats.t.sf(abs(mean) / (sd / math.sqrt(count)), count - 1))


def holm(p_values):
    """Holm's step-down adjustment of a family's p values (in their order): the i-th smallest
    of m is multiplied by m - i + 1 (i from 1), kept at least as large as the one before, and
    capped at 1.  A pair is told apart at level alpha when its adjusted p is below alpha; the
    chance of any false claim in the family is then at most alpha, whatever their dependence."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, largest = [1.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        largest = max(largest, min(1.0, (len(p_values) - rank) * float(p_values[index])))
        adjusted[index] = largest
    return adjusted


def resolvable_difference(spread, seeds, pairs=1, alpha=0.05, power=0.8):
    """The smallest true paired difference a design tells apart with probability ``power``:
    (t_{1 - alpha / (2 pairs)} + t_{power}) · spread / √seeds, with n - 1 degrees of freedom;
    ``spread``: the standard deviation of a paired difference over seeds, ``pairs``: the
    family's size (the strictest step of Holm's, Bonferroni's level, is the conservative one)."""
    if seeds < 2:
        return math.inf
    level = alpha / (2 * pairs)
    return ((stats.t.isf(level, seeds - 1) + stats.t.ppf(power, seeds - 1))
            * spread / math.sqrt(seeds))


def seeds_to_resolve(difference, spread, pairs=1, alpha=0.05, power=0.8, most=1000):
    """The fewest seeds whose ``resolvable_difference`` is at most ``difference`` (None beyond
    ``most``)."""
    for seeds in range(2, most + 1):
        if resolvable_difference(spread, seeds, pairs, alpha, power) <= difference:
            return seeds
    return None
