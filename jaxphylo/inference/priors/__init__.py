"""Tree priors: node-height densities (constant and exponential-growth coalescent, skygrid, Yule, birth-death)
and unrooted branch-length priors."""

from ._tree import (
    BirthDeath as BirthDeath,
    ConstantCoalescent as ConstantCoalescent,
    ExponentialCoalescent as ExponentialCoalescent,
    GammaDirichlet as GammaDirichlet,
    NodeHeightPrior as NodeHeightPrior,
    NodeHeights as NodeHeights,
    RatioTransform as RatioTransform,
    Skygrid as Skygrid,
    Yule as Yule,
    birth_death_times_log_density as birth_death_times_log_density,
    coalescent_times_log_density as coalescent_times_log_density,
    exponential_coalescent_times_log_density as exponential_coalescent_times_log_density,
)
