"""Maximum-likelihood inference: fitting on a fixed tree, topology search, branch support."""

from ._fit import MLResult, fit
from ._model_selection import ModelFit, ModelSelection, best_scheme_nexus, select_model, select_part_models
from ._search import SearchSettings, check_inputs, search, search_checkpoint
from ._support import bootstrap, sh_alrt
from ..tree import robinson_foulds, splits, with_supports  # the splits of a tree live with trees; kept here for ml users

__all__ = ["MLResult", "fit", "search", "search_checkpoint", "SearchSettings", "check_inputs", "bootstrap", "sh_alrt", "splits", "robinson_foulds",
           "with_supports", "select_model", "select_part_models", "best_scheme_nexus", "ModelSelection", "ModelFit"]
