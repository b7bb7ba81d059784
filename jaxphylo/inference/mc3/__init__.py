"""Metropolis-coupled MCMC over unrooted trees: the kernel (every chain of every run one batch on the device),
the run (blocks, checkpoints, MrBayes-style outputs) and its summaries (splits, ASDSF, consensus)."""

from ._kernel import (
    DEFAULT_MOVES as DEFAULT_MOVES,
    MC3Settings as MC3Settings,
    Posterior as Posterior,
    UnrootedPosition as UnrootedPosition,
    build_kernel as build_kernel,
    cold_chains as cold_chains,
    init as init,
    run_block as run_block,
)
from ._run import (
    MC3Result as MC3Result,
    mc3 as mc3,
    starting_state as starting_state,
)
