"""NUTS on a fixed topology through NumPyro: the alignment as a distribution (`PhyloCTMC`), the analysis
(tree parameterisation, priors), the resumable run and its outputs (ArviZ NetCDF, Tracer logs, NEXUS trees)."""

from ._analysis import (
    Analysis as Analysis,
    PRIOR_SETS as PRIOR_SETS,
    Prepared as Prepared,
    prepare as prepare,
    rate_guess as rate_guess,
    sample_tip_heights as sample_tip_heights,
    unrooted as unrooted,
)
from ._distribution import (
    PhyloCTMC as PhyloCTMC,
)
from ._outputs import (
    column_labels as column_labels,
    tip_height_draws as tip_height_draws,
    tracer_columns as tracer_columns,
    write_outputs as write_outputs,
)
from ._runner import (
    Draws as Draws,
    CPU_CHAINS as CPU_CHAINS,
    GPU_CELLS as GPU_CELLS,
    GPU_CHAINS as GPU_CHAINS,
    chunk_program as chunk_program,
    default_chains as default_chains,
    progress_printer as progress_printer,
    run_nuts as run_nuts,
)
