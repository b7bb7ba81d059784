"""The likelihood kernels: array-level passes over a level schedule, one file per backend.

The contract every backend keeps (`_xla.py` is the reference the others are tested against):

- inputs: transition matrices `P [B, ids, C, S, S]` indexed by layout id (tip `t` is `t`, slot `r` is
  `N + r`, the sentinel last), root frequencies `pi [B, S]`, category weights `w [B, C]`, tip codes
  `[N + 1, patterns]` (the last row all-missing) with the tip table `[codes, S]`, and a `Schedule`;
- post-order: rescaled partials `[B, slots + 1, C, patterns, S]` and log scale factors per slot and
  pattern; `log L_c = log(sum_r w_r pi^T p_root,r,c) + sum_k log scale_k,c`;
- `pattern_log_likelihoods(P, pi, w, codes, table, schedule) -> [B, patterns]`, differentiable in
  `P`, `pi`, `w` and the table by the pre-order pass (a `jax.custom_vjp`).

Incremental post-order (`_update.py`, for samplers): partials kept by node id in two buffers, only the
nodes of an operation list recomputed in place (`update_partials`: the C++ kernel on a CPU, a Pallas walk of
every chain's list on a GPU or a Pallas launch per dirty level, else an XLA loop; `update_backend` says which).

Backends: `xla` (level-batched XLA ops, everywhere), `pallas` (Triton programs per level, opt-in on
GPUs), `cpu` (the C++ XLA FFI kernel, `cpp/`). `_choice.py` chooses among them, and nothing else
does; `_kernel.py` is the differentiable kernel built on that choice (`pattern_log_likelihoods`, a
`jax.custom_vjp`) and `evaluate`, the whole call. A new backend is a file beside these (copy
`_pallas.py`'s shape: a post-order pass, a pre-order pass) plus one branch in `_choice.py`.
"""

from . import _cpu as cpu, _pallas as pallas, _xla as xla  # noqa: F401 (the backends, by name)
from ._choice import (
    KERNEL_ENV as KERNEL_ENV,
    UPDATE_ENV as UPDATE_ENV,
    cpu_wanted as cpu_wanted,
    fuses_generations as fuses_generations,
    pallas_wanted as pallas_wanted,
    post_order_partials as post_order_partials,
    update_backend as update_backend,
    update_partials as update_partials,
)
from ._preorder import (
    branch_derivative_visitor as branch_derivative_visitor,
    marginals as marginals,
    pre_order_partials as pre_order_partials,
)
from ._pallas import fused_generations as fused_generations
from ._kernel import evaluate as evaluate, pattern_log_likelihoods as pattern_log_likelihoods
from ._update import (
    kept_log_likelihoods as kept_log_likelihoods,
    level_row as level_row,
    level_schedule as level_schedule,
)
from ._walk import (
    exact_steps as exact_steps,
    gather_rows as gather_rows,
    level_loop as level_loop,
    step_children as step_children,
    write_rows as write_rows,
)
from ._xla import (
    apply_transition as apply_transition,
    child_partials as child_partials,
    log_likelihoods_from as log_likelihoods_from,
    rescale as rescale,
    root_sum as root_sum,
)
