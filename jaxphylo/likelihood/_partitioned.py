"""The likelihood of a partitioned model: parts grouped by `(states, rate categories)`, each group one
vmapped kernel call; the same functions as `_single` for `_api` to dispatch to.

Parts of a group share a kernel call: their pattern data are padded to the group's largest pattern count
(all-missing columns of weight zero) and code table; linked branch lengths are scaled by each part's
normalised rate, unlinked ones (`-Q`) are every part's own.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..data import Alignment
from .._errors import InputError, ModelError
from ..models import Model, PartitionedModel, category_count, part_alignments
from ..tree import Tree, branch_index, build_schedule
from . import _single, kernels
from ._arrays import (
    PRECISIONS, STEP_BYTES, batch_layout_lengths, check_options, check_taxa, layout_lengths, model_arrays, pattern_data,
)


class GroupData(eqx.Module):
    """Pattern data of the parts of one group, padded to a common pattern count and code table."""

    parts: tuple[int, ...] = eqx.field(static=True)
    tip_codes: Int[Array, "parts tips_plus_one patterns"]
    tip_table: Float[Array, "parts codes states"]
    weights: Float[Array, "parts patterns"]


class PartitionedData(eqx.Module):
    """Every group's pattern data, laid out for one tree's tips (a pytree: a jit argument).

    Side by side, the groups' patterns (part by part inside a group, padding
    included) form one pattern axis: `weights` and `part_of_pattern` follow
    it, and so do the batched log-likelihoods (`batch_pattern_log_likelihoods`).
    """

    groups: tuple[GroupData, ...]
    num_parts: int = eqx.field(static=True)

    @property
    def weights(self) -> Float[Array, " patterns"]:
        return jnp.concatenate([g.weights.reshape(-1) for g in self.groups])

    def group_offsets(self) -> list[int]:
        """Where every group's patterns begin on the side-by-side pattern axis."""
        return list(np.cumsum([0] + [g.weights.shape[0] * g.weights.shape[1] for g in self.groups])[:-1])

    def group_weights(self, weights: Float[Array, "B patterns"]) -> list[Float[Array, "parts B group_patterns"]]:
        """Per-tree weights on the side-by-side axis split into every group's `[K_g, B, P_g]`."""
        return [jnp.moveaxis(weights[:, start:start + g.weights.size].reshape((-1,) + g.weights.shape), 1, 0)
                for start, g in zip(self.group_offsets(), self.groups)]

    @property
    def part_of_pattern(self) -> Int[np.ndarray, " patterns"]:
        """The part of every pattern of the side-by-side axis (padding included)."""
        return np.concatenate([np.repeat(np.asarray(g.parts), g.weights.shape[1]) for g in self.groups])

    # One PhyloCTMC observation to NumPyro (see `likelihood.PatternData`).
    shape = property(lambda self: ())
    ndim = property(lambda self: 0)


def partitioned_data(alignment: Alignment, tree, model: PartitionedModel) -> PartitionedData:
    """Split the alignment into parts, compress each part's patterns and lay them out for `tree`.

    Parts are grouped by `(states, rate categories)`; inside a group, each
    part's codes are padded to the group's largest pattern count with the
    all-missing row (weight zero) and its code table with all-one rows.
    """
    check_taxa(alignment, tree)
    return grouped_data([pattern_data(part, tree) for part in part_alignments(alignment, model)], model)


def grouped_data(layouts: list, model: PartitionedModel) -> PartitionedData:
    """Every part's `PatternData` (NumPy or JAX arrays) in groups of equal `(states, categories)`, padded."""
    xp = np if all(isinstance(x, np.ndarray) for layout in layouts for x in jax.tree.leaves(layout)) else jnp
    keys: dict[tuple[int, int], list[int]] = {}
    for k, (m, layout) in enumerate(zip(model.models, layouts)):
        categories = category_count(m)
        keys.setdefault((layout.tip_table.shape[1], categories), []).append(k)
    groups = []
    for members in keys.values():
        patterns = max(layouts[k].tip_codes.shape[1] for k in members)
        codes = max(layouts[k].tip_table.shape[0] for k in members)
        tip_codes, tables, weights = [], [], []
        for k in members:
            c, t, w = layouts[k].tip_codes, layouts[k].tip_table, layouts[k].weights
            missing = t.shape[0] - 1  # pattern_data's all-missing row, last
            tip_codes.append(xp.pad(c, ((0, 0), (0, patterns - c.shape[1])), constant_values=missing))
            tables.append(xp.vstack([t, xp.ones((codes - t.shape[0], t.shape[1]), t.dtype)]))
            weights.append(xp.pad(w, (0, patterns - w.shape[0])))
        groups.append(GroupData(tuple(members), xp.stack(tip_codes).astype(np.int32), xp.stack(tables),
                                xp.stack(weights)))
    return PartitionedData(tuple(groups), model.num_parts)


def group_kernel_arrays(models, group: GroupData, part_lengths, dtype, per_tree_models: bool = False):
    """The kernels' input `(P, pi, w, tip codes, tip table)` of a group's parts, stacked `[K_g, ...]`.

    `part_lengths[k]` are part `k`'s lengths in layout order `[B, ids]`; each
    part's matrices come from its own model (`model_arrays`).
    """
    own = [model_arrays(models[k], part_lengths[k], dtype, per_tree_models) for k in group.parts]
    return tuple(jnp.stack(x) for x in zip(*own)) + (jnp.asarray(group.tip_codes),
                                                     jnp.asarray(group.tip_table).astype(dtype))


def _group_pattern_log_likelihoods(models, group: GroupData, part_lengths, schedule, dtype, static_steps,
                                   per_tree_models: bool) -> Float[Array, "parts B patterns"]:
    """`log L_c` of one group's parts, `[K_g, B, P_g]`: ONE kernel call, vmapped over the group's parts."""
    arrays = group_kernel_arrays(models, group, part_lengths, dtype, per_tree_models)
    return jax.vmap(lambda *arrays: kernels.evaluate(arrays, schedule, static_steps))(*arrays)


@eqx.filter_jit
def _part_log_likelihoods(models: tuple[Model, ...], lengths: Float[Array, "parts nodes"], data: PartitionedData,
                          schedule, index, dtype, static_steps):
    """`[K]` log-likelihoods from each part's branch lengths: one program for every link mode."""
    layout = jax.vmap(lambda t: layout_lengths(t, index, schedule))(lengths)  # [K, 1, ids]
    result = [None] * data.num_parts
    for group in data.groups:
        per_pattern = _group_pattern_log_likelihoods(models, group, layout, schedule, dtype, static_steps, False)
        totals = jnp.sum(group.weights.astype(per_pattern.dtype) * per_pattern[:, 0], axis=-1)
        for j, k in enumerate(group.parts):
            result[k] = totals[j]
    return jnp.stack(result)


def part_layout_lengths(model: PartitionedModel, branch_lengths: Float[Array, "B nodes *parts"], schedule,
                        per_tree_models: bool = False) -> list[Float[Array, "B ids"]]:
    """Every part's lengths of a batch of trees, in the schedule's layout order (one `[B, ids]` per part).

    Linked lengths `[B, nodes]` give `t_k = r_k t` (`r_k` the normalised rates, `[B, K]` with
    `per_tree_models`); unlinked ones (`-Q`) are every part's own, `[B, nodes, K]`, parts last so
    that node indexing is the same for both.
    """
    if model.link == "unlinked" and model.branch_lengths is not None:
        raise ModelError("a batch of trees takes its lengths as an argument: unlinked ones as [trees, nodes, parts], "
                         "not in the model")
    if branch_lengths.ndim == 3:
        if model.link != "unlinked" or branch_lengths.shape[-1] != model.num_parts:
            raise ModelError(f"per-part branch lengths of shape {tuple(branch_lengths.shape)} need an unlinked (-Q) "
                             f"model of {branch_lengths.shape[-1]} parts")
        return [batch_layout_lengths(branch_lengths[..., k], schedule) for k in range(model.num_parts)]
    rates = model.normalised_rates()  # [K], or [B, K] with per-tree models
    scaled = rates.T[:, :, None] * branch_lengths[None] if per_tree_models else (
        rates[:, None, None] * branch_lengths[None])
    return [batch_layout_lengths(lengths, schedule) for lengths in scaled]


def batch_pattern_log_likelihoods(model: PartitionedModel, schedule, branch_lengths: Float[Array, "B nodes *parts"],
                                  data: PartitionedData, dtype, per_tree_models: bool = False) -> Float[Array, "B patterns"]:
    """`log L_c` of a batch of trees (a device schedule), every part's patterns side by side in
    `PartitionedData.weights`'s order: `[B, sum_g K_g P_g]`, one kernel call per group. Lengths as
    `part_layout_lengths` takes them: linked `[B, nodes]`, or unlinked `[B, nodes, K]`.

    With `per_tree_models` every leaf of `model` (part models and rates) has a leading `[B]` axis.
    """
    layout = part_layout_lengths(model, branch_lengths, schedule, per_tree_models)
    groups = [_group_pattern_log_likelihoods(model.models, group, layout, schedule, dtype, None, per_tree_models)
              for group in data.groups]
    return jnp.concatenate([jnp.moveaxis(g, 0, 1).reshape(g.shape[1], -1) for g in groups], axis=1)


def partitioned_data_log_likelihoods(data: PartitionedData, tree, model: PartitionedModel, *,
                                     precision: str = "float64") -> Float[Array, " parts"]:
    """`log L(A_k | tree, t_k, M_k)` for every part, from data laid out by `partitioned_data` (see the module).

    The parts' lengths `t_k` are formed first (`part_branch_lengths`), so every
    link mode runs the same compiled program.
    """
    check_options(precision, "preorder")
    if not isinstance(tree, Tree):
        raise ModelError("a partitioned model takes one Tree (per-part lengths live in the model for -Q)")
    dtype = PRECISIONS[precision]
    widest = max(g.tip_codes.shape[0] * g.tip_codes.shape[2] * g.tip_table.shape[2] *
                 category_count(model.models[g.parts[0]]) for g in data.groups)
    schedule = build_schedule(tree.topology, max(1, STEP_BYTES // (widest * jnp.dtype(dtype).itemsize)))
    # Static step counts give the JAX kernel's level loops trip counts XLA knows; the C++ CPU kernel
    # ignores them, and leaving them out there lets every topology of a size share one program.
    cpu = kernels.cpu_wanted()
    return _part_log_likelihoods(model.models, model.part_branch_lengths(tree.branch_lengths), data, schedule,
                                 branch_index(tree.topology), dtype, None if cpu else kernels.exact_steps(schedule))


def partitioned_log_likelihoods(alignment: Alignment, tree, model: PartitionedModel, *,
                                precision: str = "float64") -> Float[Array, " parts"]:
    """Every part's log-likelihood `[K]`, in the scheme's order; `jax.grad` runs the pre-order pass per part."""
    check_lengths(tree, model)
    return partitioned_data_log_likelihoods(partitioned_data(alignment, tree, model), tree, model,
                                            precision=precision)


def check_lengths(tree, model: PartitionedModel) -> None:
    for what, lengths in (("tree", tree.branch_lengths), ("unlinked", model.branch_lengths)):
        if lengths is None or isinstance(lengths, jax.core.Tracer):
            continue
        values = np.asarray(lengths)
        if (bad := ~np.isfinite(values) | (values < 0)).any():
            raise InputError(f"{what} branch length {float(values[bad][0])} is negative or not finite")


def partitioned_log_likelihood(alignment: Alignment, tree, model: PartitionedModel, *,
                               precision: str = "float64") -> Float[Array, ""]:
    """`log L = sum_k log L(A_k | tree, t_k, M_k)`: the sum of `partitioned_log_likelihoods`."""
    return jnp.sum(partitioned_log_likelihoods(alignment, tree, model, precision=precision))


def node_bytes(model: PartitionedModel, data: PartitionedData, dtype) -> int:
    """Bytes of one node's partials: every part's `[C, P, S]`, summed."""
    return sum(len(g.parts) * _single.node_bytes(model.models[g.parts[0]], g, dtype) for g in data.groups)


def max_step_width(model: PartitionedModel, data: PartitionedData, dtype, batch: int = 1) -> int:
    """The widest step of every group's (its parts are one more batch axis)."""
    return min(_single.max_step_width(model.models[g.parts[0]], g, dtype, batch * len(g.parts)) for g in data.groups)


def data_log_likelihood(data: PartitionedData, tree, model: PartitionedModel, precision: str) -> Float[Array, ""]:
    return jnp.sum(partitioned_data_log_likelihoods(data, tree, model, precision=precision))
