"""Maximum-likelihood inference: fitting on a fixed tree, topology search, branch support."""

from ._fit import MLResult, fit, searched_result
from .selection import ModelFit, ModelSelection, best_scheme_nexus, select_model, select_part_models
from ._climb import CandidateSet, SearchSettings, unsuccessful_trees
from ._lengths import Problem, fitted_tree_problem, optimise_lengths
from ._newton import node_branch_derivatives
from ._optimise import minimise
from ._nni import apply_nnis, nni_scores
from ._spr import regraft_edges, regrafted_tree, spr_scores
from ._search import check_inputs, search, search_checkpoint
from ._support import bootstrap, sh_alrt
from ._ufboot import MIN_REPLICATES as UFBOOT_MIN_REPLICATES, UFBoot, UFBootSettings
# the splits of a tree live with trees; kept here for ml users
from ..tree import robinson_foulds, splits, with_supports

__all__ = ["MLResult", "fit", "search", "search_checkpoint", "searched_result", "SearchSettings", "unsuccessful_trees",
           "CandidateSet", "Problem", "fitted_tree_problem", "optimise_lengths", "check_inputs", "bootstrap",
           "sh_alrt", "UFBoot", "UFBootSettings", "UFBOOT_MIN_REPLICATES", "splits", "robinson_foulds",
           "with_supports", "select_model", "select_part_models", "best_scheme_nexus", "ModelSelection", "ModelFit",
           "node_branch_derivatives", "apply_nnis", "nni_scores", "regraft_edges", "regrafted_tree", "spr_scores",
           "minimise"]
