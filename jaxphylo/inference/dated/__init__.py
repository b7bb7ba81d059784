"""Time trees with the topology sampled: the kernel (BEAST's tree operators alternated with HMC), the run,
the least-squares start and the summaries (MCC tree, clade frequencies)."""

from ._kernel import (
    DATED_MOVES as DATED_MOVES,
    DatedPosterior as DatedPosterior,
    DatedSettings as DatedSettings,
    TimeTreePosition as TimeTreePosition,
    build_kernel as build_kernel,
    init as init,
    run_block as run_block,
)
from ._run import (
    DatedResult as DatedResult,
    check_dated_inputs as check_dated_inputs,
    column_names as column_names,
    dated_mcmc as dated_mcmc,
    dated_start as dated_start,
    given_start as given_start,
)
from ._start import (
    rooted_time_tree as rooted_time_tree,
    start_time_tree as start_time_tree,
)
from ._summary import (
    clade_frequencies as clade_frequencies,
    clade_masks as clade_masks,
    hpd as hpd,
    time_tree_newick as time_tree_newick,
)
