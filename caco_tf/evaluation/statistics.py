"""What figures over seeds can say: a mean with its interval, and whether A beats B.

A comparison of methods trains each with the same seeds (the same data order and split for a
seed), so A and B are compared seed by seed: the paired difference d_s = a_s - b_s, its mean
and Student's t interval over the seeds.  "A beats B" only when that interval excludes 0;
otherwise no difference was measured (which is not "they are equal").
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
