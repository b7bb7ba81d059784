"""The log-likelihood of an alignment on a tree under a model: the public entry points.

Each dispatches once on the model's kind (`_implementation`): a `Model` runs through `_single`, a
`PartitionedModel` through `_partitioned`; both are built on `_arrays` (what the kernels take) and
`kernels` (the passes).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..data import Alignment
from .._errors import ModelError
from ..models import Model, PartitionedModel
from ..tree import Tree, TreeBatch, branch_index, device_schedule, phase_widths
from . import _partitioned, _single
from ._arrays import PRECISIONS, PatternData, check_inputs, check_options, pattern_data
from ._single import schedule_for, schedule_pattern_log_likelihoods
from .kernels import exact_steps


def _implementation(model):
    """The one place the likelihood looks at a model's kind."""
    return _partitioned if isinstance(model, PartitionedModel) else _single


@eqx.filter_jit
def batch_pattern_log_likelihoods(model: Model, parents, branch_lengths, data: PatternData, widths, dtype,
                                  per_tree_models: bool = False):
    """`[B, patterns]`: the schedule is built on the device, so topologies are data.

    A `PartitionedModel` (with `PartitionedData`) gives its parts' patterns
    side by side (`PartitionedData.weights` is the matching weight vector).

    With `per_tree_models` every leaf of `model` has a leading `[B]` axis: tree
    `b` is evaluated under model `b` (MC³ chains each carry their parameters);
    only the small per-model arrays are vmapped, the kernel sees one batch.
    """
    schedule = device_schedule(parents, widths)
    return _implementation(model).batch_pattern_log_likelihoods(model, schedule, branch_lengths, data, dtype,
                                                                per_tree_models)


def max_step_width(model: Model, data: PatternData, dtype, batch: int = 1, mesh=None) -> int:
    """Widest step whose `[batch, width, C, P, S]` temporaries stay near `STEP_BYTES` (a partitioned
    model's: the widest of its groups, whose parts are one more batch axis).

    With `mesh`, for what one device holds: its share of the trees (`batch` over the mesh's `batch` axis,
    rounded up) on its share of the columns (over `patterns`). Sized for the whole batch instead, the steps
    narrowed as devices were added, each device running more and narrower steps on the same work.
    """
    if mesh is not None:
        batch = math.ceil(batch / mesh.shape["batch"]) / mesh.shape["patterns"]
    return _implementation(model).max_step_width(model, data, dtype, batch)


def node_bytes(model: Model, data: PatternData, dtype) -> int:
    """Bytes of one node's `[C, P, S]` partials (a partitioned model's: every part's, summed)."""
    return _implementation(model).node_bytes(model, data, dtype)


def prepare(alignment: Alignment, tree: Tree, model: Model, precision: str, method: str = "preorder"):
    """Validate the inputs, then `(pattern data, schedule, branch index, dtype)`.

    The pattern data are padded to a size class (`bucket_patterns`: zero-weight,
    all-missing columns after `alignment.site_patterns()`'s), so that the next
    alignment of similar size and the same number of taxa runs the same programs."""
    check_inputs(alignment, tree, model)
    check_options(precision, method)
    data, dtype = pattern_data(alignment, tree, bucket=True), PRECISIONS[precision]
    return data, schedule_for(tree, model, data, dtype), branch_index(tree.topology), dtype


def data_log_likelihood(data: PatternData, tree: Tree, model: Model, *, precision: str = "float64") -> Float[Array, ""]:
    """`log L` of pattern data already laid out for `tree` by `pattern_data` (a pytree, so it may be a jit argument).

    The level loops get the topology's step counts as static lengths (the fast
    form for NUTS and optimisers on one topology; a new topology compiles anew,
    as a `Tree`'s static topology would make any enclosing jit do anyway).
    A `TreeBatch` gives `[B]` (see `batch_data_log_likelihoods`). A
    `PartitionedModel` takes the `PartitionedData` of `likelihood.partitioned_data`.
    """
    check_options(precision, "preorder")
    if isinstance(tree, TreeBatch) and _implementation(model) is _single:
        return batch_data_log_likelihoods(data, tree, model, precision=precision)
    return _implementation(model).data_log_likelihood(data, tree, model, precision)


def pattern_log_likelihoods(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64", method: str = "preorder"
) -> Float[Array, " patterns"]:
    """`log L_c` for each site pattern of `alignment.site_patterns()`, in that order.

    Differentiable with `jax.grad` in time linear in the tree: `method="preorder"`
    (the default) supplies the gradient by the pre-order pass; `"autodiff"` lets
    JAX differentiate the post-order pass itself, storing every level (for
    comparison: slower, and far hungrier for memory).
    """
    per_pattern, _ = _bucketed_pattern_log_likelihoods(alignment, tree, model, precision, method)
    return per_pattern[..., :alignment.site_patterns().num_patterns]


def _bucketed_pattern_log_likelihoods(alignment, tree, model, precision, method):
    """`(log L_c, w_c)` over the patterns padded to their size class (the padding: `log L_c = 0`, `w_c = 0`)."""
    if isinstance(tree, TreeBatch):
        return _batch_pattern_log_likelihoods_checked(alignment, tree, model, precision, method)
    data, schedule, index, dtype = prepare(alignment, tree, model, precision, method)
    autodiff = method == "autodiff"
    return schedule_pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, index, dtype,
                                            exact_steps(schedule) if autodiff else None, autodiff), data.weights


@jax.jit
def _weighted_sum(per_pattern, weights):
    """`sum_c w_c log L_c` in one program per size class (the eager product would compile one per pattern count)."""
    return jnp.sum(weights * per_pattern, axis=-1)


def log_likelihood(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64", method: str = "preorder"
) -> Float[Array, ""]:
    """`log L = sum_c weight_c log L_c`: the log-likelihood of the alignment (see `pattern_log_likelihoods`).

    `tree` may be a `TreeBatch`: then `[B]`, every tree in one call. `model` may be a
    `jaxphylo.models.PartitionedModel`: then the sum over its parts.
    """
    if _implementation(model) is _partitioned:
        if method != "preorder":
            raise ModelError("a partitioned model is differentiated by the pre-order pass only (method='preorder')")
        return _partitioned.partitioned_log_likelihood(alignment, tree, model, precision=precision)
    per_pattern, weights = _bucketed_pattern_log_likelihoods(alignment, tree, model, precision, method)
    return _weighted_sum(per_pattern, weights)


def _batch_pattern_log_likelihoods_checked(alignment, trees: TreeBatch, model, precision, method):
    if method != "preorder":
        raise ModelError("a batch of trees is differentiated by the pre-order pass only (method='preorder')")
    check_options(precision, method)
    check_inputs(alignment, trees, model)
    data = pattern_data(alignment, trees, bucket=True)
    return batch_data_log_likelihoods(data, trees, model, precision=precision, per_pattern=True), data.weights


def batch_data_log_likelihoods(data: PatternData, trees: TreeBatch, model: Model, *, precision: str = "float64",
                               per_pattern: bool = False) -> Float[Array, "B *patterns"]:
    """`log L` of every tree of a batch (`[B]`, or `[B, patterns]` with `per_pattern`), one call.

    `data` must be laid out for `trees.taxa` (`pattern_data(alignment, trees)`).
    Differentiable in the branch lengths and the model by the pre-order pass.
    Topologies are data (the schedule is built on the device, the level loops
    run as many steps as the batch needs): any batch of the same size and N
    runs one compiled program, inside jit too.
    """
    dtype = PRECISIONS[precision]
    widths = phase_widths(trees.num_tips, max_step_width(model, data, dtype, len(trees)))
    per = batch_pattern_log_likelihoods(model, trees.parents, trees.branch_lengths, data, widths, dtype)
    return per if per_pattern else jnp.sum(per * data.weights.astype(per.dtype), axis=-1)
