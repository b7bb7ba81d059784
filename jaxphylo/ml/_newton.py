"""Branch lengths of a batch of trees by simultaneous per-branch Newton steps.

One sweep: one post-order and one pre-order pass give `d log L / dt` and
`d^2 log L / dt^2` for every branch of every tree (`layout_branch_derivatives`);
every branch takes its own Newton step `t - f'/f''` (where `f'' >= 0`, it
doubles or halves `t` in the direction of `f'`), clipped to [1e-6, 10]. The
steps ignore the coupling between branches, so each tree then takes the best
of the fractions 1, 1/2, 1/4 and 0 of its step (one likelihood call over
four copies of the batch): log L never decreases. A tree has converged when a
sweep gains it less than `tolerance`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..runtime import add_per_tree
from ..tree import device_schedule, mask_like
from ..likelihood import (
    batch_layout_lengths, batch_pattern_log_likelihoods, derivatives_from_arrays, group_kernel_arrays,
    layout_branch_derivatives, part_layout_lengths,
)
from ..models import MAX_LENGTH, MIN_LENGTH, PartitionedModel

FRACTIONS = (1.0, 0.5, 0.25, 0.0)


def node_branch_derivatives(parents: Int[Array, "B M"], lengths: Float[Array, "B M *K"], model, data,
                            weights: Float[Array, "B P"], widths, dtype):
    """`(f' [B, M], f'' [B, M], log L [B])` for the branch above every kernel node (`[B, M, K]`, each part's
    own, for unlinked lengths `[B, M, K]`)."""
    schedule = device_schedule(parents, widths)
    if isinstance(model, PartitionedModel):
        first, second, log_l = _part_derivatives(model, lengths, data, weights, schedule, dtype)
    else:
        layout = batch_layout_lengths(lengths, schedule)
        first, second, log_l = layout_branch_derivatives(model, layout, data, weights, schedule, dtype)
    batch, m = parents.shape
    to_nodes = lambda per_id: add_per_tree(  # noqa: E731
        jnp.zeros((batch, m + 1) + per_id.shape[2:], per_id.dtype), schedule.layout, per_id)[:, :m]
    return to_nodes(first), to_nodes(second), log_l


def _part_derivatives(model: PartitionedModel, lengths: Float[Array, "B M *K"], data, weights: Float[Array, "B P"],
                      schedule, dtype):
    """One derivative pass per group, vmapped over its parts, as the likelihood is. Linked lengths
    `t_k = r_k t`: `f' = sum_k r_k f_k'`, `f'' = sum_k r_k^2 f_k''` (`[B, ids]`); unlinked: every part's
    own `f_k'`, `f_k''` (`[B, ids, K]`)."""
    unlinked = lengths.ndim == 3
    rates, part_layout = model.normalised_rates(), part_layout_lengths(model, lengths, schedule)
    first, second, log_l = [None] * model.num_parts, [None] * model.num_parts, 0.0
    for group, part_weights in zip(data.groups, data.group_weights(weights)):
        members = [model.models[k] for k in group.parts]
        q = jnp.stack([m.substitution.rate_matrix() for m in members])
        category_rates = jnp.stack([m.rate_categories()[0] for m in members])
        d1, d2, ll = jax.vmap(lambda a, q, c, w: derivatives_from_arrays(a, q, c, w, schedule, dtype))(
            group_kernel_arrays(model.models, group, part_layout, dtype), q, category_rates, part_weights)
        for j, k in enumerate(group.parts):
            r = 1.0 if unlinked else rates[k]
            first[k], second[k] = r * d1[j], r**2 * d2[j]
        log_l = log_l + jnp.sum(ll, 0)
    if unlinked:
        return jnp.stack(first, -1), jnp.stack(second, -1), log_l
    return sum(first), sum(second), log_l


@eqx.filter_jit
def newton_lengths(parents: Int[Array, "B M"], lengths: Float[Array, "B M *K"], fixed: Bool[Array, "B M"], problem,
                   tolerance: float, max_sweeps: int = 50):
    """Optimised lengths and log L of every tree, and the sweeps taken (unlinked lengths `[B, M, K]`: every
    part's branch its own Newton step, the step fractions tried per tree)."""
    batch = parents.shape[0]

    def log_likelihoods(candidates):
        # Tree-major (a tree's candidates beside it), so that trees split over devices stay on theirs.
        k = len(FRACTIONS)
        per = batch_pattern_log_likelihoods(problem.model, jnp.repeat(parents, k, axis=0),
                                             jnp.swapaxes(candidates, 0, 1).reshape((batch * k,) + lengths.shape[1:]),
                                             problem.data, problem.widths, problem.dtype)
        return jnp.sum(jnp.repeat(problem.weights, k, axis=0) * per, axis=-1).reshape(batch, k).T

    def sweep(state):
        lengths, _, gain, k = state
        d1, d2, now = node_branch_derivatives(parents, lengths, problem.model, problem.data, problem.weights,
                                              problem.widths, problem.dtype)
        newton = lengths - d1 / jnp.where(d2 < 0, d2, -1.0)
        target = jnp.where(d2 < 0, newton, jnp.where(d1 > 0, 2 * lengths, 0.5 * lengths))
        target = jnp.where(mask_like(fixed, lengths), lengths, jnp.clip(target, MIN_LENGTH, MAX_LENGTH))
        fractions = jnp.asarray(FRACTIONS, lengths.dtype).reshape((-1,) + (1,) * lengths.ndim)
        candidates = lengths + fractions * (target - lengths)
        values = log_likelihoods(candidates)
        best = jnp.argmax(values, axis=0)
        new = jnp.take_along_axis(candidates, best.reshape((1, batch) + (1,) * (lengths.ndim - 1)), axis=0)[0]
        value = jnp.max(values, axis=0)
        return new, value, value - now, k + 1

    def going(state):
        _, _, gain, k = state
        return (k < max_sweeps) & jnp.any(gain >= tolerance)

    start = (lengths, jnp.full(batch, -jnp.inf, lengths.dtype), jnp.full(batch, jnp.inf, lengths.dtype), 0)
    lengths, value, _, sweeps = jax.lax.while_loop(going, sweep, start)
    return lengths, value, sweeps
