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

from functools import partial

import jax
import jax.numpy as jnp
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero
from jaxtyping import Array, Float, Int

from ...runtime import product_precision, take_per_tree
from ...tree import Schedule
from . import _cpu, _pallas, _xla
from ._choice import cpu_wanted, pallas_wanted, post_order_partials
from ._xla import log_likelihoods_from, root_sum
from ._preorder import pre_order_partials, transition_cotangent_visitor


@partial(jax.custom_vjp, nondiff_argnums=(6,))
def pattern_log_likelihoods(
    transition: Float[Array, "B ids C S S"],
    root_frequencies: Float[Array, "B S"],
    category_weights: Float[Array, "B C"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps: tuple[int, ...] | None = None,
) -> Float[Array, "B patterns"]:
    """`log L_c` for every tree of the batch and site pattern; `jax.grad` runs the pre-order pass.

    `static_steps` (Python ints) fixes the loop lengths at compile time; None reads them from the schedule.
    """
    return _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, static_steps)[0]


def _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, static_steps=None):
    if pallas_wanted(tip_table.shape[1]):
        # The Pallas passes keep their tiled layout between the two passes.
        tiled = _pallas.post_order_tiled(transition, root_frequencies, category_weights, tip_codes, tip_table,
                                         schedule, static_steps)
        patterns = tip_codes.shape[1]
        return jnp.log(_pallas.root_sums(tiled, patterns)) + _pallas.total_log_scales(tiled, patterns), tiled
    partials, log_scales = post_order_partials(transition, tip_codes, tip_table, schedule, static_steps)
    return log_likelihoods_from(partials, log_scales, root_frequencies, category_weights, schedule), partials


def _forward_rule(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, static_steps):
    # Arguments arrive as `CustomVJPPrimal(value, perturbed)` (symbolic zeros). The tip table is data, rarely
    # differentiated, and its cotangent costs a [B, N+1, P, S] buffer that every step scatter-adds into:
    # it is computed only when the table is perturbed (its presence in the residuals says so).
    table_wanted = tip_table.perturbed
    transition, root_frequencies, category_weights, tip_codes, tip_table, schedule = jax.tree_util.tree_map(
        lambda a: a.value, (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule),
        is_leaf=lambda a: isinstance(a, CustomVJPPrimal))
    values, partials = _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule,
                                static_steps)
    residuals = (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials)
    return values, (residuals, () if table_wanted else None)


def _backward(static_steps, saved, pattern_cotangent):
    (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials), table_wanted = saved
    if isinstance(pattern_cotangent, SymbolicZero):
        return (None,) * 6
    table_wanted = table_wanted is not None
    num_tips, patterns = tip_codes.shape[0] - 1, tip_codes.shape[1]
    states = tip_table.shape[1]
    if isinstance(partials, _pallas.TiledPartials):
        if not table_wanted:
            d_transition = _pallas.transition_cotangents(transition, root_frequencies, category_weights, partials,
                                                         pattern_cotangent, schedule, static_steps)
            root = _pallas.root_partials(partials, schedule, patterns, states)
            d_root, d_weights = _root_cotangents(pattern_cotangent, root, root_frequencies, category_weights,
                                                 _pallas.root_sums(partials, patterns))
            return d_transition, d_root, d_weights, None, None, None
        partials = _pallas.untiled(partials.partials, patterns, states)  # the tip table's cotangent: the XLA pass
    visit = transition_cotangent_visitor(pattern_cotangent, num_tips, table_wanted)
    start = (jnp.zeros_like(transition),
             jnp.zeros((transition.shape[0], num_tips + 1, patterns, states), transition.dtype) if table_wanted
             else None)
    _, (d_transition, d_tips) = pre_order_partials(
        transition, root_frequencies, category_weights, partials, tip_codes, tip_table, schedule, visit, start,
        static_steps)
    root = take_per_tree(partials, schedule.root_row)
    d_root, d_weights = _root_cotangents(pattern_cotangent, root, root_frequencies, category_weights)
    d_table = None
    if table_wanted:
        d_table = jax.ops.segment_sum(
            jnp.sum(d_tips[:, :num_tips], axis=0).reshape(-1, states), tip_codes[:num_tips].reshape(-1),
            num_segments=tip_table.shape[0])
    return d_transition, d_root, d_weights, None, d_table, None


def _root_cotangents(pattern_cotangent, root: Float[Array, "B C patterns S"], root_frequencies, category_weights,
                     sums: Float[Array, "B patterns"] | None = None):
    """Cotangents of `pi` and `w` from the rescaled root partials (the common factor cancels in the ratio);
    `sums`, their `root_sum`, when the forward pass kept it (the Pallas kernels)."""
    sums = root_sum(root, root_frequencies, category_weights) if sums is None else sums
    ratio = pattern_cotangent / sums
    d_root = jnp.einsum("bp,bc,bcps->bs", ratio, category_weights, root, precision=product_precision())
    d_weights = jnp.einsum("bp,bs,bcps->bc", ratio, root_frequencies, root, precision=product_precision())
    return d_root, d_weights


pattern_log_likelihoods.defvjp(_forward_rule, _backward, symbolic_zeros=True)


def evaluate(arrays, schedule: Schedule, static_steps=None, autodiff: bool = False) -> Float[Array, "B patterns"]:
    """`log L_c` of kernel arrays `(P, pi, w, codes, table)` by the chosen backend: the C++ kernel on a CPU,
    else the custom-VJP kernel (XLA or Pallas passes); with `autodiff`, plain autodiff through the XLA
    post-order pass with fixed-length loops (`static_steps`), for comparison."""
    # A schedule closed over by an outer jit is a constant: XLA would then unroll the level loops and
    # constant-fold the first steps (seconds of compile time, and a program per topology). Keep it opaque.
    schedule = jax.lax.optimization_barrier(schedule)
    if autodiff:
        return _xla.pattern_log_likelihoods(*arrays, schedule, static_steps)
    if cpu_wanted():
        # One C++ call per pass instead of XLA's many small ops per level (issue #19: 10-100x on a CPU).
        return _cpu.pattern_log_likelihoods(*arrays, schedule)
    if static_steps is not None:
        # A phase of one static step runs outside any loop, and XLA then copies whole partials buffers
        # (a packed schedule's tail is such phases: 1,000 taxa x 2,000 patterns, XLA on a CPU, 4.1 buffers of
        # temporaries against 3.3; on four H200s 1,000 x 1,000,000 took 121 GiB per GPU against 65.4). Its
        # count stays data: one loop iteration.
        static_steps = tuple(None if count == 1 else count for count in static_steps)
    return pattern_log_likelihoods(*arrays, schedule, static_steps)
