"""Chi-square goodness of fit without scipy (Wilson-Hilferty approximation of the p-value)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def chi_square_p(observed: Counter[int], p: np.ndarray, n: int, min_expected: float = 5.0) -> float:
    """p-value of observing ``observed`` (n draws) under distribution ``p``; rare bins pooled."""
    expected = p * n
    big = [i for i in range(len(p)) if expected[i] >= min_expected]
    rest_exp = n - sum(expected[i] for i in big)
    rest_obs = n - sum(observed.get(i, 0) for i in big)
    stat = sum((observed.get(i, 0) - expected[i]) ** 2 / expected[i] for i in big)
    dof = len(big) - 1
    if rest_exp >= min_expected:
        stat += (rest_obs - rest_exp) ** 2 / rest_exp
        dof += 1
    elif rest_obs > 3 * max(rest_exp, 1.0) + 10:
        return 0.0  # mass where the target has (almost) none
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))
