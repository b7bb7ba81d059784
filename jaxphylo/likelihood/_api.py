"""The log-likelihood of an alignment on a tree under a model."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..data import Alignment
from .._errors import InputError, ModelError
from ..tree import Schedule, Tree, TreeBatch, branch_index, build_schedule, device_schedule, phase_widths, trim_slots
from ..models import Model
from . import kernels
from .kernels import exact_steps

PRECISIONS = {"float64": jnp.float64, "float32": jnp.float32}


class PatternData(eqx.Module):
    """Tip data in the tree's tip order, plus one all-missing row, and pattern weights."""

    tip_codes: Int[Array, "tips_plus_one patterns"]
    tip_table: Float[Array, "codes states"]
    weights: Float[Array, " patterns"]

    # One PhyloCTMC observation to NumPyro, whose model checks read `jnp.shape`/`jnp.ndim` of every
    # site's value (JAX warns on objects without them).
    shape = property(lambda self: ())
    ndim = property(lambda self: 0)


def pattern_data(alignment: Alignment, tree: Tree, compress: bool = True) -> PatternData:
    """Match the alignment's taxa to the tree's tips and lay out the site patterns.

    `compress=False` keeps one pattern per site, so that every alignment of a
    given size has arrays of the same shape (one compiled program for all).
    """
    _check_taxa(alignment, tree)
    if compress:
        patterns = alignment.site_patterns()
        codes, table, weights = patterns.codes, patterns.tip_table, patterns.weights
    else:
        codes, table, _ = alignment.encoded()
        weights = np.ones(codes.shape[1])
    row = {t: i for i, t in enumerate(alignment.taxa)}
    order = np.array([row[t] for t in tree.taxa])
    codes = np.vstack([codes[order], np.full((1, codes.shape[1]), table.shape[0])])
    table = np.vstack([table, np.ones((1, table.shape[1]))])
    return PatternData(codes.astype(np.int32), table, weights)


def _check_taxa(alignment: Alignment, tree: Tree) -> None:
    in_tree, in_alignment = set(tree.taxa), set(alignment.taxa)
    if only := sorted(in_tree - in_alignment):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the tree but not in the alignment")
    if only := sorted(in_alignment - in_tree):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the alignment but not in the tree")


def _check_inputs(alignment: Alignment, tree: Tree | TreeBatch, model: Model) -> None:
    if model.alphabet != alignment.alphabet:
        raise ModelError(
            f"{alignment.source}: the model is for {model.alphabet.name} data "
            f"but the alignment is {alignment.alphabet.name}"
        )
    lengths = tree.branch_lengths
    if not isinstance(lengths, jax.core.Tracer):
        lengths = np.atleast_2d(np.asarray(lengths))
        bad = ~np.isfinite(lengths) | (lengths < 0)
        if bad.any():
            which, node = np.unravel_index(np.argmax(bad), bad.shape)
            where = f"taxon {tree.taxa[node]!r}" if node < tree.num_tips else f"internal node {node}"
            of = f" of tree {which}" if isinstance(tree, TreeBatch) else ""
            raise InputError(f"branch length {float(lengths[which, node])} above {where}{of} is negative or not finite")


METHODS = ("preorder", "autodiff")


def model_arrays(model: Model, layout_lengths: Float[Array, "B ids"], dtype, per_tree_models: bool = False):
    """The model's share of the kernels' input: `(P in layout order, pi, w)` in the working precision.

    Transition matrices (and the model's eigensystem) are computed in the
    model's own precision (float64 by default) and then cast: they are small.
    With `per_tree_models` every leaf of `model` has a leading `[B]` axis and
    tree `b` takes model `b` (only these small arrays are vmapped).
    """
    if per_tree_models:
        one = lambda m, lengths: tuple(x[0] for x in model_arrays(m, lengths[None], dtype))
        return jax.vmap(one)(model, layout_lengths)
    batch, ids = layout_lengths.shape
    transition = model.transition_matrices(layout_lengths.reshape(-1))
    transition = transition.reshape((batch, ids) + transition.shape[1:])
    _, weights = model.rate_categories()
    return (
        transition.astype(dtype),
        jnp.broadcast_to(model.frequencies.astype(dtype), (batch,) + model.frequencies.shape),
        jnp.broadcast_to(weights.astype(dtype), (batch,) + weights.shape),
    )


def kernel_arrays(model: Model, layout_lengths: Float[Array, "B ids"], data: PatternData, dtype):
    """What the kernels take: `model_arrays` and then `(tip codes, tip table)` in the working precision."""
    return model_arrays(model, layout_lengths, dtype) + (data.tip_codes, data.tip_table.astype(dtype))


def layout_lengths(branch_lengths: Float[Array, " nodes"], index, schedule: Schedule) -> Float[Array, "1 ids"]:
    """Branch length at every layout id of a one-tree schedule (zero for resolved polytomies, root, padding)."""
    padded = jnp.concatenate([branch_lengths, jnp.zeros(1, branch_lengths.dtype)])
    return padded[index][schedule.layout]


def batch_layout_lengths(branch_lengths: Float[Array, "B M"], schedule: Schedule) -> Float[Array, "B ids"]:
    padded = jnp.concatenate([branch_lengths, jnp.zeros_like(branch_lengths[:, :1])], axis=1)
    return jnp.take_along_axis(padded, schedule.layout, axis=1)


def _kernel(arrays, schedule, static_steps, autodiff=False):
    # A schedule closed over by an outer jit is a constant: XLA would then unroll the level loops and
    # constant-fold the first steps (seconds of compile time, and a program per topology). Keep it opaque.
    schedule = jax.lax.optimization_barrier(schedule)
    if autodiff:
        return kernels.xla.pattern_log_likelihoods(*arrays, schedule, static_steps)
    if kernels.cpu_wanted():
        # One C++ call per pass instead of XLA's many small ops per level (issue #19: 10-100x on a CPU).
        return kernels.cpu.pattern_log_likelihoods(*arrays, schedule)
    return kernels.pattern_log_likelihoods(*arrays, schedule, static_steps)


@eqx.filter_jit
def _pattern_log_likelihoods(model: Model, branch_lengths, data: PatternData, schedule: Schedule, index, dtype,
                             static_steps=None, autodiff=False):
    """The custom-VJP kernel, or with `autodiff` plain autodiff through fixed-length loops (`static_steps`)."""
    arrays = kernel_arrays(model, layout_lengths(branch_lengths, index, schedule), data, dtype)
    return _kernel(arrays, schedule, static_steps, autodiff)[0]


@eqx.filter_jit
def _batch_pattern_log_likelihoods(model: Model, parents, branch_lengths, data: PatternData, widths, dtype,
                                   per_tree_models: bool = False):
    """`[B, patterns]`: the schedule is built on the device, so topologies are data.

    A `PartitionedModel` (with `PartitionedData`) gives its parts' patterns
    side by side (`PartitionedData.weights` is the matching weight vector).

    With `per_tree_models` every leaf of `model` has a leading `[B]` axis: tree
    `b` is evaluated under model `b` (MC³ chains each carry their parameters);
    only the small per-model arrays are vmapped, the kernel sees one batch.
    """
    from ..models._partitioned import PartitionedModel, batch_part_pattern_log_likelihoods

    schedule = device_schedule(parents, widths)
    if isinstance(model, PartitionedModel):
        return batch_part_pattern_log_likelihoods(model, schedule, branch_lengths, data, dtype, per_tree_models)
    arrays = model_arrays(model, batch_layout_lengths(branch_lengths, schedule), dtype, per_tree_models)
    return _kernel(arrays + (data.tip_codes, data.tip_table.astype(dtype)), schedule, None)


STEP_BYTES = 1 << 28  # cap on one `[width, C, P, S]` temporary of a level step


def max_step_width(model: Model, data: PatternData, dtype, batch: int = 1) -> int:
    """Widest step whose `[batch, width, C, P, S]` temporaries stay near `STEP_BYTES` (a partitioned
    model's: the widest of its groups, whose parts are one more batch axis)."""
    from ..models._partitioned import PartitionedModel

    if isinstance(model, PartitionedModel):
        return min(max_step_width(model.models[g.parts[0]], g, dtype, batch * len(g.parts)) for g in data.groups)
    return max(1, STEP_BYTES // (batch * node_bytes(model, data, dtype)))


def node_bytes(model: Model, data: PatternData, dtype) -> int:
    """Bytes of one node's `[C, P, S]` partials (a partitioned model's: every part's, summed)."""
    from ..models._partitioned import PartitionedModel

    if isinstance(model, PartitionedModel):
        return sum(len(g.parts) * node_bytes(model.models[g.parts[0]], g, dtype) for g in data.groups)
    _, weights = jax.eval_shape(model.rate_categories)
    return weights.shape[0] * data.tip_codes.shape[-1] * data.tip_table.shape[-1] * jnp.dtype(dtype).itemsize


def schedule_for(tree: Tree, model: Model, data: PatternData, dtype) -> Schedule:
    """The tree's schedule, with steps narrow enough that one step's arrays stay near `STEP_BYTES`."""
    return build_schedule(tree.topology, max_step_width(model, data, dtype))


def prepare(alignment: Alignment, tree: Tree, model: Model, precision: str, method: str = "preorder"):
    """Validate the inputs, then `(pattern data, schedule, branch index, dtype)`."""
    _check_inputs(alignment, tree, model)
    _check_options(precision, method)
    data, dtype = pattern_data(alignment, tree), PRECISIONS[precision]
    return data, schedule_for(tree, model, data, dtype), branch_index(tree.topology), dtype


def _check_options(precision: str, method: str) -> None:
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    if method not in METHODS:
        raise ModelError(f"method must be 'preorder' or 'autodiff', not {method!r}")


def data_log_likelihood(data: PatternData, tree: Tree, model: Model, *, precision: str = "float64") -> Float[Array, ""]:
    """`log L` of pattern data already laid out for `tree` by `pattern_data` (a pytree, so it may be a jit argument).

    The level loops get the topology's step counts as static lengths (the fast
    form for NUTS and optimisers on one topology; a new topology compiles anew,
    as a `Tree`'s static topology would make any enclosing jit do anyway).
    A `TreeBatch` gives `[B]` (see `batch_data_log_likelihoods`). A
    `PartitionedModel` takes the `PartitionedData` of `models.partitioned_data`.
    """
    from ..models._partitioned import PartitionedModel, partitioned_data_log_likelihoods

    _check_options(precision, "preorder")
    if isinstance(model, PartitionedModel):
        return jnp.sum(partitioned_data_log_likelihoods(data, tree, model, precision=precision))
    if isinstance(tree, TreeBatch):
        return batch_data_log_likelihoods(data, tree, model, precision=precision)
    states = jax.eval_shape(lambda: model.frequencies).shape[-1]
    if data.tip_codes.shape[0] != tree.num_tips + 1 or data.tip_table.shape[-1] != states:
        raise InputError(f"pattern data for {data.tip_codes.shape[0] - 1} tips and {data.tip_table.shape[-1]} states "
                         f"do not fit a tree of {tree.num_tips} tips and a model of {states} states")
    dtype = PRECISIONS[precision]
    schedule = trim_slots(schedule_for(tree, model, data, dtype))
    # Inside a user's jit a Tree's topology is static anyway (it retraces per topology), so the level loops
    # may take static lengths (trip counts XLA knows), and the buffers only the slots this topology uses.
    per_pattern = _pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, branch_index(tree.topology),
                                           dtype, exact_steps(schedule))
    return jnp.sum(data.weights * per_pattern)


def pattern_log_likelihoods(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64", method: str = "preorder"
) -> Float[Array, " patterns"]:
    """`log L_c` for each site pattern of `alignment.site_patterns()`, in that order.

    Differentiable with `jax.grad` in time linear in the tree: `method="preorder"`
    (the default) supplies the gradient by the pre-order pass; `"autodiff"` lets
    JAX differentiate the post-order pass itself, storing every level (for
    comparison: slower, and far hungrier for memory).
    """
    if isinstance(tree, TreeBatch):
        return _batch_pattern_log_likelihoods_checked(alignment, tree, model, precision, method)
    data, schedule, index, dtype = prepare(alignment, tree, model, precision, method)
    autodiff = method == "autodiff"
    return _pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, index, dtype,
                                    exact_steps(schedule) if autodiff else None, autodiff)


def log_likelihood(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64", method: str = "preorder"
) -> Float[Array, ""]:
    """`log L = sum_c weight_c log L_c`: the log-likelihood of the alignment (see `pattern_log_likelihoods`).

    `tree` may be a `TreeBatch`: then `[B]`, every tree in one call. `model` may be a
    `jaxphylo.models.PartitionedModel`: then the sum over its parts.
    """
    from ..models._partitioned import PartitionedModel, partitioned_log_likelihood

    if isinstance(model, PartitionedModel):
        if method != "preorder":
            raise ModelError("a partitioned model is differentiated by the pre-order pass only (method='preorder')")
        return partitioned_log_likelihood(alignment, tree, model, precision=precision)
    per_pattern = pattern_log_likelihoods(alignment, tree, model, precision=precision, method=method)
    return jnp.sum(alignment.site_patterns().weights * per_pattern, axis=-1)


def _batch_pattern_log_likelihoods_checked(alignment, trees: TreeBatch, model, precision, method):
    if method != "preorder":
        raise ModelError("a batch of trees is differentiated by the pre-order pass only (method='preorder')")
    _check_options(precision, method)
    _check_inputs(alignment, trees, model)
    return batch_data_log_likelihoods(pattern_data(alignment, trees), trees, model, precision=precision,
                                      per_pattern=True)


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
    per = _batch_pattern_log_likelihoods(model, trees.parents, trees.branch_lengths, data, widths, dtype)
    return per if per_pattern else jnp.sum(per * data.weights.astype(per.dtype), axis=-1)
