"""Information criteria (AIC, AICc, BIC) with IQ-TREE 2's parameter counts, and Akaike weights.

    AIC  = 2k - 2 log L
    AICc = AIC + 2k(k + 1) / (n - k - 1)       (infinite when n <= k + 1)
    BIC  = k ln n - 2 log L

`w_i = exp(-D_i / 2) / sum_j exp(-D_j / 2)` with `D_i = IC_i - min_j IC_j`."""

from __future__ import annotations

import math
import numpy as np
from ..._errors import ModelError


CRITERIA = ("AIC", "AICc", "BIC")


def information_criteria(log_likelihood: float, df: int, num_sites: int) -> dict:
    """`{"AIC", "AICc", "BIC"}` of a fit: AIC = 2k - 2 log L, AICc = AIC + 2k(k+1)/(n-k-1), BIC = k ln n - 2 log L."""
    k, n = df, num_sites
    aic = 2.0 * k - 2.0 * log_likelihood
    aicc = aic + 2.0 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else math.inf
    return {"AIC": aic, "AICc": aicc, "BIC": k * math.log(n) - 2.0 * log_likelihood}


def akaike_weights(scores) -> np.ndarray:
    """`exp(-D_i / 2) / sum_j exp(-D_j / 2)`, `D_i = score_i - min score` (0 for infinite scores)."""
    scores = np.asarray(scores, float)
    finite = np.isfinite(scores)
    if not finite.any():
        return np.full(len(scores), 1.0 / len(scores)) if len(scores) else scores
    relative = np.where(finite, np.exp(-0.5 * (scores - scores[finite].min())), 0.0)
    return relative / relative.sum()


def _criterion(criterion: str) -> str:
    lookup = {c.upper(): c for c in CRITERIA}
    if not isinstance(criterion, str) or criterion.upper() not in lookup:
        raise ModelError(f"criterion must be one of {', '.join(CRITERIA)}, not {criterion!r}")
    return lookup[criterion.upper()]
