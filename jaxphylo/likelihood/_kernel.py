"""The likelihood kernel `(P, pi, w, tip data) -> log L_c` and its linear-time VJP.

Forward: the post-order pass, keeping the partials. Backward: the pre-order
pass over the same schedule, whose visitor contracts `s_i p_i^T / n_i` over
patterns into the cotangent of every branch's `P`; the root gives those of
`pi` and `w`: `d log L_c / d pi = sum_r w_r p_root,r / L_c` and
`d log L_c / d w_r = pi^T p_root,r / L_c` (all on rescaled partials, where the
common factor cancels). Memory: two partials buffers, against one per level
for plain reverse-mode autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._schedule import Schedule
from ._peeling import log_likelihoods_from, post_order_partials, root_likelihoods
from ._preorder import pre_order_partials, transition_cotangent_visitor


@jax.custom_vjp
def pattern_log_likelihoods(
    transition: Float[Array, "kernel_nodes C S S"],
    root_frequencies: Float[Array, " S"],
    category_weights: Float[Array, " C"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
) -> Float[Array, " patterns"]:
    """`log L_c` for every site pattern; `jax.grad` runs the pre-order pass."""
    return _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule)[0]


def _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule):
    partials, log_scales = post_order_partials(transition, tip_codes, tip_table, schedule)
    log_likelihoods = log_likelihoods_from(partials, log_scales, root_frequencies, category_weights)
    return log_likelihoods, (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials)


def _backward(residuals, pattern_cotangent):
    transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials = residuals
    num_tips, patterns = tip_codes.shape[0] - 1, tip_codes.shape[1]
    states = tip_table.shape[1]
    visit = transition_cotangent_visitor(pattern_cotangent, tip_codes)
    start = (jnp.zeros_like(transition), jnp.zeros((num_tips + 1, patterns, states), transition.dtype))
    _, (d_transition, d_tips) = pre_order_partials(
        transition, root_frequencies, category_weights, partials, tip_codes, tip_table, schedule, visit, start
    )
    root = partials[num_tips - 2]
    ratio = pattern_cotangent / root_likelihoods(partials, root_frequencies, category_weights)
    d_root = jnp.einsum("p,c,cps->s", ratio, category_weights, root)
    d_weights = jnp.einsum("p,s,cps->c", ratio, root_frequencies, root)
    d_table = jax.ops.segment_sum(
        d_tips[:num_tips].reshape(-1, states), tip_codes[:num_tips].reshape(-1), num_segments=tip_table.shape[0]
    )
    return d_transition, d_root, d_weights, None, d_table, None


pattern_log_likelihoods.defvjp(_forward, _backward)
