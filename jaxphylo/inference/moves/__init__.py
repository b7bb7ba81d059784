"""MCMC moves: proposals that return the new state and the log proposal ratio.

Unrooted trees in the tip-0 view (`_unrooted`: stochastic NNI, SPR, extending SPR and TBR, branch multiplier,
tree-length multiplier, node slider), time trees as parents and heights (`_time_tree`: narrow and wide
exchange, subtree slide, Wilson-Balding, node and root height), one model parameter at a time (`_parameters`),
and HMC over every continuous coordinate (`_hmc`)."""

from ._hmc import (
    HMC_START_STEP as HMC_START_STEP,
    HMC_STEPS as HMC_STEPS,
    HMC_TARGET_ACCEPTANCE as HMC_TARGET_ACCEPTANCE,
    hmc_proposal as hmc_proposal,
    leapfrog_trajectory as leapfrog_trajectory,
)
from ._parameters import (
    START_TUNING as START_TUNING,
    propose_parameters as propose_parameters,
    support_kind as support_kind,
)
from ._time_tree import (
    ROOT_TUNING as ROOT_TUNING,
    START_SLIDE as START_SLIDE,
    TIME_TREE_MOVES as TIME_TREE_MOVES,
    TUNED as TUNED,
    propose_time_tree as propose_time_tree,
)
from ._unrooted import (
    BRANCH_MOVES as BRANCH_MOVES,
    MULTIPLIER_TUNING as MULTIPLIER_TUNING,
    TOPOLOGY_MOVES as TOPOLOGY_MOVES,
    propose_tree as propose_tree,
)
