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

from ...runtime import add_per_tree, product_precision, set_per_tree, take_per_tree
from ...tree import Schedule
from ._walk import gather_rows, level_loop, step_children
from ._xla import apply_transition, child_partials, rescale


def pre_order_partials(
    transition: Float[Array, "B ids C S S"],
    root_frequencies: Float[Array, "B S"],
    category_weights: Float[Array, "B C"],
    partials: Float[Array, "B rows C patterns S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    visit=None,
    accumulator=(),
    static_steps=None,
):
    """Rescaled `q` of every slot (rows as in `partials`; the sentinel row stays ones) and the visitor's result.

    `visit(accumulator, children [B, W, 2], s, p, up, inverse_norm [B, W, P])`
    is called once per step with `s`, the children's partials `p` and
    `up = P_child^T s` (before rescaling), all `[B, W, 2, C, P, S]`;
    `inverse_norm` is `1/n` for real nodes of real steps, zero otherwise.
    """
    num_tips = schedule.num_tips
    sentinel = num_tips + schedule.num_slots
    root = (category_weights[:, :, None] * root_frequencies[:, None, :])[:, :, None, :]
    q = set_per_tree(jnp.ones_like(partials), schedule.root_row,
                     jnp.broadcast_to(root, partials.shape[:1] + partials.shape[2:]))

    def body(carry, start, real, width):
        q, accumulator = carry
        parent = gather_rows(q, start, width)[:, :, None]
        children = step_children(schedule, start, width)
        p = child_partials(children, partials, tip_codes, tip_table)
        matrices = take_per_tree(transition, children)
        messages = apply_transition(matrices, p)
        s = parent * messages[:, :, ::-1]  # each child's sibling message
        norm = jnp.sum(s[:, :, 0] * messages[:, :, 0], axis=(2, 4))
        counted = (children[:, :, 0] != sentinel) & real[:, None]
        inverse_norm = jnp.where(counted[..., None], 1.0 / jnp.where(counted[..., None], norm, 1.0), 0.0)
        up = apply_transition(jnp.swapaxes(matrices, -1, -2), s)
        if visit is not None:
            accumulator = visit(accumulator, children, s, p, up, inverse_norm)
        # Only internal children's q is kept; tips and the padding's sentinel go out of range and are dropped,
        # so the rows written are distinct and the scatter needs no ordering between its updates.
        kept = (children >= num_tips) & (children != sentinel)
        rows = jnp.where(kept, children - num_tips, q.shape[1])
        q = set_per_tree(q, rows, rescale(up)[0], mode="drop", unique_indices=True)
        return q, accumulator

    return level_loop(schedule, body, (q, accumulator), reverse=True, static_steps=static_steps)


def transition_cotangent_visitor(pattern_cotangent: Float[Array, "B patterns"], num_tips: int, tips: bool = True):
    """Accumulate `sum_c g_c d log L_c / d P_i` per branch, and (with `tips`) `d / d p_tip` per tree, tip and
    pattern (else that accumulator stays None)."""

    def visit(accumulator, children, s, p, up, inverse_norm):
        d_transition, d_tips = accumulator
        alpha = inverse_norm * pattern_cotangent[:, None, :]
        d_transition = add_per_tree(
            d_transition, children,
            jnp.einsum("bwkcps,bwp,bwkcpt->bwkcst", s, alpha, p, precision=product_precision()))
        if tips:
            # Per tree, so that no two updates meet (each tip is one child once); other children land on the
            # spare row.
            tip = jnp.where(children < num_tips, children, num_tips)
            d_tips = add_per_tree(d_tips, tip, jnp.sum(up, axis=3) * alpha[:, :, None, :, None])
        return d_transition, d_tips

    return visit


def branch_derivative_visitor(first_matrices, second_matrices, pattern_weights: Float[Array, "B P"]):
    """Accumulate `d log L / dt` and `d^2 log L / dt^2` per branch, from `dP/dt` and `d^2P/dt^2` (layout order).

    Per pattern, `d^2 log L_c/dt^2 = L_c''/L_c - (L_c'/L_c)^2`, with `L_c' = sum_r s^T P' p`.
    """

    def visit(accumulator, children, s, p, up, inverse_norm):
        first, second = accumulator
        inverse_norm = inverse_norm[:, :, None]
        slope = jnp.sum(s * apply_transition(take_per_tree(first_matrices, children), p), axis=(3, 5)) * inverse_norm
        curve = jnp.sum(s * apply_transition(take_per_tree(second_matrices, children), p), axis=(3, 5)) * inverse_norm
        per_branch = lambda x: jnp.einsum("bwkp,bp->bwk", x, pattern_weights, precision=product_precision())
        first = add_per_tree(first, children, per_branch(slope))
        second = add_per_tree(second, children, per_branch(curve - slope * slope))
        return first, second

    return visit


def marginals(
    pre: Float[Array, "*B rows C patterns S"], post: Float[Array, "*B rows C patterns S"]
) -> Float[Array, "*B rows patterns S"]:
    """`P(X_k = x | data) = sum_r q_k,r(x) p_k,r(x) / L_c` for every slot."""
    joint = jnp.sum(pre * post, axis=-3)
    return joint / jnp.sum(joint, axis=-1, keepdims=True)
