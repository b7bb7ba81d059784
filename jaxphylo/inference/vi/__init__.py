"""Variational Bayesian phylogenetics: q(tree, lengths) fitted by stochastic gradient, no candidate trees needed.

q(tree) is ARTree's autoregressive construction (`_topology`), q(lengths | tree)
VBPI-GNN's log-normal edges (`_lengths`), both on graph networks written with
equinox (`_graph`), started from the taxa's distances; the objective is the
multi-sample bound, its gradient for q(tree) by reweighted wake-sleep on
exploring particles (default) or VIMCO (`_objective`), trained with optax in a
population of restarts (`_fit`) in resumable blocks (`_run`, on
`runtime.BlockRun`).
"""

from ._fit import (
    VISettings as VISettings,
    estimate as estimate,
    initial_fit_state as initial_fit_state,
    member as member,
    run_block as run_block,
    select as select,
)
from ._graph import tip_coordinates as tip_coordinates
from ._lengths import LengthModel as LengthModel
from ._objective import (
    Target as Target,
    Variational as Variational,
    draw as draw,
    multi_sample_bound as multi_sample_bound,
    rws_surrogate as rws_surrogate,
    vimco_surrogate as vimco_surrogate,
)
from ._run import VIResult as VIResult, plot_trace as plot_trace, target_of as target_of, vi as vi
from ._topology import TopologyModel as TopologyModel, all_choices as all_choices
