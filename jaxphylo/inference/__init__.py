"""Bayesian inference: NUTS on a fixed topology (NumPyro), Metropolis-coupled MCMC over unrooted trees, and
time trees with the topology sampled; the alignment distribution, tree parameterisations and priors, runs."""

from ..likelihood import PatternData, pattern_data
from ..models import MRBAYES_PRIORS, default_priors, initial_values, sample_model
from ..tree import (
    TimeTree, branch_durations, heights_from_tree, heights_to_ratios, node_anchors, ratio_log_jacobian,
    ratios_to_heights, start_heights, time_tree, with_sampled_tips,
)
from ._analysis import PRIOR_SETS, Analysis, Prepared, prepare, sample_tip_heights, unrooted
from ._dated_mcmc import DatedSettings
from ._dated_run import DatedResult, check_dated_inputs, dated_mcmc
from ._dated_start import rooted_time_tree, start_time_tree
from ._distribution import PhyloCTMC
from ._mc3 import DEFAULT_MOVES, MC3Settings
from ._mc3_run import MC3Result, mc3
from ._outputs import write_outputs
from ._runner import Draws, chunk_program, progress_printer, run_nuts
from ._tree_priors import (
    BirthDeath, ConstantCoalescent, GammaDirichlet, NodeHeightPrior, NodeHeights, RatioTransform, Skygrid, Yule,
)

__all__ = [
    "dated_mcmc", "DatedSettings", "DatedResult", "check_dated_inputs", "start_time_tree", "rooted_time_tree",
    "MC3Result", "MC3Settings", "DEFAULT_MOVES", "mc3",
    "PhyloCTMC", "PatternData", "pattern_data", "Analysis", "Prepared", "prepare", "unrooted", "PRIOR_SETS",
    "run_nuts", "Draws", "chunk_program", "progress_printer", "write_outputs",
    "sample_model", "initial_values", "default_priors", "MRBAYES_PRIORS",
    "TimeTree", "time_tree", "ratios_to_heights", "heights_to_ratios", "ratio_log_jacobian",
    "branch_durations", "heights_from_tree", "start_heights", "node_anchors", "with_sampled_tips",
    "sample_tip_heights",
    "GammaDirichlet", "NodeHeights", "RatioTransform", "NodeHeightPrior", "ConstantCoalescent", "Skygrid",
    "BirthDeath", "Yule",
]
