"""Ji et al. (2020)'s pre-order pass: the level schedule read backwards.

For node k with children i and j, in every category r and pattern c,
`s_i = q_k o (P_j p_j)` and `q_i = P_i^T s_i`, starting from `q_root,r = w_r pi`.
Then every branch holds the whole likelihood, `L_c = sum_r s_i,r^T P_i,r p_i,r`,
so with `n_i,c` that sum evaluated on *rescaled* vectors,

    d log L_c / d P_i,r = s_i,r p_i,r^T / n_i,c

exactly, whatever per-pattern factors `s` and `p` were divided by. So `q` is
rescaled like the partials and no scale factors are carried. A visitor sees
every branch once per level and turns `(s, p, 1/n)` into what is wanted:
cotangents of `P`, of the tip vectors, or branch-length derivatives.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._schedule import Schedule
from ._peeling import apply_transition, child_partials, level_loop, rescale


def pre_order_partials(
    transition: Float[Array, "kernel_nodes C S S"],
    root_frequencies: Float[Array, " S"],
    category_weights: Float[Array, " C"],
    partials: Float[Array, "rows C patterns S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    visit=None,
    accumulator=(),
):
    """Rescaled `q` of every internal node (rows as in `partials`) and the visitor's result.

    `visit(accumulator, children [W, 2], s, p, up, inverse_norm [W, P])` is
    called once per step with `s`, the children's partials `p` and
    `up = P_child^T s` (before rescaling), all `[W, 2, C, P, S]`;
    `inverse_norm` is `1/n` for real nodes, zero for padding.
    """
    num_tips = schedule.num_tips
    sentinel_row = partials.shape[0] - 1
    root = (category_weights[:, None] * root_frequencies)[:, None, :]
    q = jnp.ones_like(partials).at[num_tips - 2].set(jnp.broadcast_to(root, partials.shape[1:]))

    def body(carry, nodes, children):
        q, accumulator = carry
        parent = q[nodes - num_tips][:, None]
        p = child_partials(children, partials, tip_codes, tip_table)
        matrices = transition[children]
        messages = apply_transition(matrices, p)
        s = parent * messages[:, ::-1]  # each child's sibling message
        norm = jnp.sum(s[:, 0] * messages[:, 0], axis=(1, 3))
        real = (nodes != schedule.sentinel)[:, None]
        inverse_norm = jnp.where(real, 1.0 / jnp.where(real, norm, 1.0), 0.0)
        up = apply_transition(jnp.swapaxes(matrices, -1, -2), s)
        if visit is not None:
            accumulator = visit(accumulator, children, s, p, up, inverse_norm)
        rows = jnp.where(children < num_tips, sentinel_row, children - num_tips)
        return q.at[rows].set(rescale(up)[0]), accumulator

    return level_loop(schedule, body, (q, accumulator), reverse=True)


def transition_cotangent_visitor(pattern_cotangent, tip_codes):
    """Accumulate `sum_c g_c d log L_c / d P_i` per branch, and `d / d p_tip` per tip and pattern."""
    num_tips = tip_codes.shape[0] - 1

    def visit(accumulator, children, s, p, up, inverse_norm):
        d_transition, d_tips = accumulator
        alpha = inverse_norm * pattern_cotangent
        d_transition = d_transition.at[children].add(jnp.einsum("wkcps,wp,wkcpt->wkcst", s, alpha, p))
        tip = jnp.where(children < num_tips, children, num_tips)  # other children land on the spare row
        d_tips = d_tips.at[tip].add(jnp.sum(up, axis=2) * alpha[:, None, :, None])
        return d_transition, d_tips

    return visit


def branch_derivative_visitor(first_matrices, second_matrices, pattern_weights):
    """Accumulate `d log L / dt` and `d^2 log L / dt^2` per branch, from `dP/dt` and `d^2P/dt^2`.

    Per pattern, `d^2 log L_c/dt^2 = L_c''/L_c - (L_c'/L_c)^2`, with `L_c' = sum_r s^T P' p`.
    """

    def visit(accumulator, children, s, p, up, inverse_norm):
        first, second = accumulator
        inverse_norm = inverse_norm[:, None]
        slope = jnp.sum(s * apply_transition(first_matrices[children], p), axis=(2, 4)) * inverse_norm
        curve = jnp.sum(s * apply_transition(second_matrices[children], p), axis=(2, 4)) * inverse_norm
        first = first.at[children].add(slope @ pattern_weights)
        second = second.at[children].add((curve - slope * slope) @ pattern_weights)
        return first, second

    return visit


def marginals(
    pre: Float[Array, "rows C patterns S"], post: Float[Array, "rows C patterns S"]
) -> Float[Array, "rows patterns S"]:
    """`P(X_k = x | data) = sum_r q_k,r(x) p_k,r(x) / L_c` for every internal node."""
    joint = jnp.sum(pre * post, axis=1)
    return joint / jnp.sum(joint, axis=-1, keepdims=True)
