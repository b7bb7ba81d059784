"""Bayesian inference with NumPyro: the alignment distribution, tree parameterisations and priors, runs."""

from ..likelihood import PatternData, pattern_data
from ._analysis import Analysis, Prepared, prepare, sample_tip_heights, unrooted
from ._dated_mcmc import DatedSettings
from ._dated_run import DatedResult, dated_mcmc
from ._dated_start import rooted_time_tree, start_time_tree
from ._distribution import PhyloCTMC
from ._mc3 import MC3Settings
from ._mc3_run import MC3Result, mc3
from ..models import MRBAYES_PRIORS, default_priors, initial_values, sample_model
from ..tree import (
    TimeTree, branch_durations, heights_from_tree, heights_to_ratios, node_anchors, ratio_log_jacobian, ratios_to_heights, start_heights, time_tree, with_sampled_tips,
)
from ._tree_priors import (
    BirthDeath, ConstantCoalescent, GammaDirichlet, NodeHeightPrior, NodeHeights, RatioTransform, Skygrid, Yule,
)

__all__ = [
    "dated_mcmc", "DatedSettings", "DatedResult", "start_time_tree", "rooted_time_tree",
    "MC3Result",
    "MC3Settings",
    "mc3",
    "PhyloCTMC", "PatternData", "pattern_data", "Analysis", "Prepared", "prepare", "unrooted",
    "sample_model", "initial_values", "default_priors", "MRBAYES_PRIORS",
    "TimeTree", "time_tree", "ratios_to_heights", "heights_to_ratios", "ratio_log_jacobian",
    "branch_durations", "heights_from_tree", "start_heights", "node_anchors", "with_sampled_tips",
    "sample_tip_heights",
    "GammaDirichlet", "NodeHeights", "RatioTransform", "NodeHeightPrior", "ConstantCoalescent", "Skygrid",
    "BirthDeath", "Yule",
]
