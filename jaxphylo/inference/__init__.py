"""Bayesian inference: NUTS on a fixed topology (`nuts/`, NumPyro), Metropolis-coupled MCMC over unrooted trees
(`mc3/`) and time trees with the topology sampled (`dated/`), on the moves of `moves/`, the tree priors of
`priors/` and what every Metropolis-Hastings sampler shares (`base.py`)."""

from ..likelihood import PatternData, pattern_data
from ..models import MRBAYES_PRIORS, default_priors, initial_values, sample_model
from ..tree import (
    TimeTree, branch_durations, heights_from_tree, heights_to_ratios, node_anchors, ratio_log_jacobian,
    ratios_to_heights, start_heights, time_tree, with_sampled_tips,
)
from .nuts import (
    PRIOR_SETS, Analysis, Draws, PhyloCTMC, Prepared, chunk_program, prepare, progress_printer, run_nuts,
    sample_tip_heights, unrooted, write_outputs,
)
from .dated import DatedResult, DatedSettings, check_dated_inputs, dated_mcmc, rooted_time_tree, start_time_tree
from .mc3 import DEFAULT_MOVES, MC3Result, MC3Settings, mc3
from .priors import (
    BirthDeath, ConstantCoalescent, ExponentialCoalescent, GammaDirichlet, NodeHeightPrior, NodeHeights, RatioTransform,
    Skygrid, Yule,
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
    "GammaDirichlet", "NodeHeights", "RatioTransform", "NodeHeightPrior", "ConstantCoalescent", "ExponentialCoalescent",
    "Skygrid",
    "BirthDeath", "Yule",
]
