"""The likelihood under one `Model`: the implementations `_api` dispatches to (`_partitioned` has the same
functions for a `PartitionedModel`)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._errors import InputError
from ..models import Model, category_count
from ..tree import Schedule, Tree, branch_index, build_schedule, trim_slots
from . import kernels
from ._arrays import PRECISIONS, STEP_BYTES, PatternData, batch_layout_lengths, kernel_arrays, layout_lengths, model_arrays


@eqx.filter_jit
def schedule_pattern_log_likelihoods(model: Model, branch_lengths, data: PatternData, schedule: Schedule, index, dtype,
                             static_steps=None, autodiff=False):
    """The custom-VJP kernel, or with `autodiff` plain autodiff through fixed-length loops (`static_steps`)."""
    arrays = kernel_arrays(model, layout_lengths(branch_lengths, index, schedule), data, dtype)
    return kernels.evaluate(arrays, schedule, static_steps, autodiff)[0]


def batch_pattern_log_likelihoods(model: Model, schedule: Schedule, branch_lengths, data: PatternData, dtype,
                                  per_tree_models: bool = False) -> Float[Array, "B patterns"]:
    """`[B, patterns]` of a batch of trees on a device schedule (with `per_tree_models`, tree `b` under model `b`)."""
    arrays = model_arrays(model, batch_layout_lengths(branch_lengths, schedule), dtype, per_tree_models)
    return kernels.evaluate(arrays + (data.tip_codes, data.tip_table.astype(dtype)), schedule)


def node_bytes(model: Model, data: PatternData, dtype) -> int:
    """Bytes of one node's `[C, P, S]` partials."""
    return category_count(model) * data.tip_codes.shape[-1] * data.tip_table.shape[-1] * jnp.dtype(dtype).itemsize


def max_step_width(model: Model, data: PatternData, dtype, batch: float = 1) -> int:
    """Widest step whose `[batch, width, C, P, S]` temporaries stay near `STEP_BYTES` (`batch` may be a
    fraction: a device's share of the columns)."""
    return max(1, int(STEP_BYTES // (batch * node_bytes(model, data, dtype))))


def data_log_likelihood(data: PatternData, tree: Tree, model: Model, precision: str) -> Float[Array, ""]:
    """One tree's `log L` with the topology's step counts static (see `_api.data_log_likelihood`)."""
    states = model.alphabet.num_states
    if data.tip_codes.shape[0] != tree.num_tips + 1 or data.tip_table.shape[-1] != states:
        raise InputError(f"pattern data for {data.tip_codes.shape[0] - 1} tips and {data.tip_table.shape[-1]} states "
                         f"do not fit a tree of {tree.num_tips} tips and a model of {states} states")
    dtype = PRECISIONS[precision]
    schedule = trim_slots(schedule_for(tree, model, data, dtype))
    # Inside a user's jit a Tree's topology is static anyway (it retraces per topology), so the level loops
    # may take static lengths (trip counts XLA knows), and the buffers only the slots this topology uses.
    per_pattern = schedule_pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, branch_index(tree.topology),
                                           dtype, kernels.exact_steps(schedule))
    return jnp.sum(data.weights * per_pattern)


def schedule_for(tree: Tree, model: Model, data: PatternData, dtype) -> Schedule:
    """The tree's schedule, with steps narrow enough that one step's arrays stay near `STEP_BYTES`."""
    return build_schedule(tree.topology, max_step_width(model, data, dtype))
