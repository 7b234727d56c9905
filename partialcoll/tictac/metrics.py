"""TicTac's metrics (section 3.2 and 6), computed from measured times.

* communication time N, computation time C, ratio rho = N / C;
* iteration time T and overlap coefficient alpha = (N + C - T) / min(N, C)
  (1: the smaller of N and C hid entirely under the other; 0: none did);
* utilisation U = C / T = 1 / (1 + rho - alpha * min(rho, 1));
* straggler effect: the 95th percentile of the workers' iteration times
  over their median (1: no straggler);
* out-of-order share: transfers that left before one with a lower
  priority number;
* R^2 of a least-squares line (iteration time against alpha, Figure 13a).

No MPI, no torch.
"""
import math

import numpy as np


def busy(spans):
    """Length of the union of (start, end) intervals (NaN ones ignored)."""
    spans = sorted((a, b) for a, b in spans
                   if not (math.isnan(a) or math.isnan(b)) and b > a)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            total += 0.0 if cur_b is None else cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (0.0 if cur_b is None else cur_b - cur_a)


def overlap(N, C, T):
    """alpha = (N + C - T) / min(N, C) (section 3.2); NaN when N or C is 0."""
    m = min(N, C)
    return (N + C - T) / m if m > 0 else math.nan


def utilisation(rho, alpha):
    """U = 1 / (1 + rho - alpha * min(rho, 1)) (section 3.2)."""
    return 1.0 / (1.0 + rho - alpha * min(rho, 1.0))


def straggler(times, q=95):
    """The q-th percentile of the workers' iteration times over their
    median (linear interpolation between workers)."""
    t = np.asarray(times, dtype=float)
    return float(np.percentile(t, q) / np.median(t))


def out_of_order(released, numbers):
    """How many transfers left before a transfer with a lower number
    (``released``: times they were handed to the wire; ``numbers``: their
    priority numbers, same order).  A transfer is out of order when some
    transfer released after it has a lower number."""
    order = np.argsort(np.asarray(released, dtype=float), kind="stable")
    nums = np.asarray(numbers)[order]
    suffix_min = np.minimum.accumulate(nums[::-1])[::-1]
    later_min = np.append(suffix_min[1:], np.iinfo(np.int64).max)
    return int(np.sum(nums > later_min))


def r_squared(x, y):
    """R^2 of the least-squares line y = a x + b (NaN for < 3 points or
    no spread)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    a, b = np.polyfit(x, y, 1)
    resid = y - (a * x + b)
    return float(1.0 - np.sum(resid ** 2) / np.sum((y - y.mean()) ** 2))


def iqr(values):
    """Interquartile range (the spread the benchmark compares)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return math.nan
    q1, q3 = np.percentile(v, [25, 75])
    return float(q3 - q1)
