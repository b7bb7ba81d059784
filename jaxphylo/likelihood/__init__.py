"""Likelihood kernels (array level) and the public log-likelihood functions."""

from ._api import PatternData, log_likelihood, pattern_data, pattern_log_likelihoods

__all__ = ["log_likelihood", "pattern_log_likelihoods", "pattern_data", "PatternData"]
