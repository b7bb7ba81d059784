"""First and second derivatives of log L with respect to each branch length.

`P(t) = expm(r t Q)` gives `P' = r Q P` and `P'' = r^2 Q^2 P`; the pre-order
pass supplies `s_i` for every branch, so `L_c' = sum_r s^T P' p` and
`L_c'' = sum_r s^T P'' p` cost one more product per branch each. The second
derivative is the diagonal of the Hessian, for Newton steps on branch lengths
(BEAGLE's edge derivatives). Forward-mode autodiff cannot pass through the
custom VJP, so `jax.hessian` of `log_likelihood` is not the way to it.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..data import Alignment
from ..runtime import product_precision
from ..tree import Schedule, Tree
from ..models import Model
from ._api import prepare
from ._arrays import PatternData, kernel_arrays, layout_lengths
from .kernels import branch_derivative_visitor, log_likelihoods_from, post_order_partials, pre_order_partials


def layout_branch_derivatives(model: Model, lengths: Float[Array, "B ids"], data: PatternData,
                              pattern_weights: Float[Array, "B P"], schedule: Schedule, dtype):
    """`(d log L / dt, d^2 log L / dt^2)` at every layout id of every tree, and `log L` per tree (`[B]`)."""
    rates, _ = model.rate_categories()
    return derivatives_from_arrays(kernel_arrays(model, lengths, data, dtype), model.substitution.rate_matrix(),
                                   rates, pattern_weights, schedule, dtype)


def derivatives_from_arrays(arrays, q: Float[Array, "S S"], rates: Float[Array, " C"],
                            pattern_weights: Float[Array, "B P"], schedule: Schedule, dtype):
    """`layout_branch_derivatives` from the kernels' input `(P, pi, w, tip codes, tip table)`, `Q` and the
    category rates (pure arrays: vmapped over the parts of a partitioned model)."""
    transition, pi, weights, codes, table = arrays
    q = q.astype(dtype)
    rates = rates.astype(dtype)[None, None, :, None, None]
    first_matrices = rates * jnp.einsum("ij,bncjk->bncik", q, transition, precision=product_precision())
    second_matrices = rates * jnp.einsum("ij,bncjk->bncik", q, first_matrices, precision=product_precision())
    post, log_scales = post_order_partials(transition, codes, table, schedule)
    pattern_weights = pattern_weights.astype(dtype)
    visit = branch_derivative_visitor(first_matrices, second_matrices, pattern_weights)
    zeros = jnp.zeros(transition.shape[:2], dtype)  # [B, ids]
    _, (first, second) = pre_order_partials(transition, pi, weights, post, codes, table, schedule, visit, (zeros, zeros))
    log_l = jnp.sum(pattern_weights * log_likelihoods_from(post, log_scales, pi, weights, schedule), axis=-1)
    return first, second, log_l


@eqx.filter_jit
def _kernel_derivatives(model: Model, branch_lengths, data: PatternData, schedule: Schedule, index, dtype):
    lengths = layout_lengths(branch_lengths, index, schedule)
    first, second, _ = layout_branch_derivatives(model, lengths, data, data.weights[None], schedule, dtype)
    # Back from layout ids to the tree's branches: the transpose of `layout_lengths`.
    num_branches = branch_lengths.shape[0]
    to_tree = lambda per_id: jnp.zeros(num_branches + 1, dtype).at[jnp.asarray(index)[schedule.layout[0]]].add(per_id[0])[:-1]
    return to_tree(first), to_tree(second)


def branch_length_derivatives(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64"
) -> tuple[Float[Array, " nodes"], Float[Array, " nodes"]]:
    """`(d log L / d b_k, d^2 log L / d b_k^2)` for the branch above every node `k`.

    The root's entries are zero. Both come from one post-order and one pre-order
    pass, linear in the number of taxa.
    """
    data, schedule, index, dtype = prepare(alignment, tree, model, precision)
    return _kernel_derivatives(model, tree.branch_lengths, data, schedule, index, dtype)
