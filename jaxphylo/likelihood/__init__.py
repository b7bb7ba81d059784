"""Likelihood kernels (array level) and the public functions built on them."""

from ._ancestral import ancestral_marginals
from ._api import PatternData, batch_data_log_likelihoods, data_log_likelihood, log_likelihood, pattern_data, pattern_log_likelihoods
from ._cost import Cost, plan
from ._derivatives import branch_length_derivatives

__all__ = [
    "log_likelihood", "data_log_likelihood", "batch_data_log_likelihoods", "pattern_log_likelihoods", "pattern_data", "PatternData",
    "ancestral_marginals", "branch_length_derivatives", "Cost", "plan",
]
