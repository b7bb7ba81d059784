"""Tree priors: node-height densities (coalescent, skygrid, Yule, birth-death) and unrooted branch-length priors."""

from ._tree import (
    BirthDeath as BirthDeath,
    ConstantCoalescent as ConstantCoalescent,
    GammaDirichlet as GammaDirichlet,
    NodeHeightPrior as NodeHeightPrior,
    NodeHeights as NodeHeights,
    RatioTransform as RatioTransform,
    Skygrid as Skygrid,
    Yule as Yule,
    birth_death_times_log_density as birth_death_times_log_density,
    coalescent_times_log_density as coalescent_times_log_density,
)
