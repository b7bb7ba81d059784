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

from .._alignment import Alignment
from .._schedule import Schedule
from .._tree import Tree
from ..models import Model
from ._api import PatternData, kernel_arrays, prepare
from ._peeling import post_order_partials
from ._preorder import branch_derivative_visitor, pre_order_partials


@eqx.filter_jit
def _kernel_derivatives(model: Model, branch_lengths, data: PatternData, schedule: Schedule, dtype):
    transition, pi, weights, codes, table = kernel_arrays(model, branch_lengths, data, schedule, dtype)
    rates, _ = model.rate_categories()
    q = model.substitution.rate_matrix().astype(dtype)
    rates = rates.astype(dtype)[None, :, None, None]
    first_matrices = rates * jnp.einsum("ij,bcjk->bcik", q, transition)
    second_matrices = rates * jnp.einsum("ij,bcjk->bcik", q, first_matrices)
    post, _ = post_order_partials(transition, codes, table, schedule)
    visit = branch_derivative_visitor(first_matrices, second_matrices, data.weights.astype(dtype))
    zeros = jnp.zeros(transition.shape[0], dtype)
    _, (first, second) = pre_order_partials(transition, pi, weights, post, codes, table, schedule, visit, (zeros, zeros))
    # Back from kernel nodes to the tree's branches: the transpose of `kernel_branch_lengths`.
    num_branches = branch_lengths.shape[0]
    to_tree = lambda kernel: jnp.zeros(num_branches + 1, dtype).at[schedule.branch_index].add(kernel)[:-1]
    return to_tree(first), to_tree(second)


def branch_length_derivatives(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64"
) -> tuple[Float[Array, " nodes"], Float[Array, " nodes"]]:
    """`(d log L / d b_k, d^2 log L / d b_k^2)` for the branch above every node `k`.

    The root's entries are zero. Both come from one post-order and one pre-order
    pass, linear in the number of taxa.
    """
    data, schedule, dtype = prepare(alignment, tree, model, precision)
    return _kernel_derivatives(model, tree.branch_lengths, data, schedule, dtype)
