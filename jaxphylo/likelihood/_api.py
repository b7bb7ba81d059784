"""The log-likelihood of an alignment on a tree under a model."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._alignment import Alignment
from .._errors import InputError, ModelError
from .._schedule import Schedule, build_schedule
from .._tree import Tree
from ..models import Model
from . import _kernel, _peeling

PRECISIONS = {"float64": jnp.float64, "float32": jnp.float32}


class PatternData(eqx.Module):
    """Tip data in the tree's tip order, plus one all-missing row, and pattern weights."""

    tip_codes: Int[Array, "tips_plus_one patterns"]
    tip_table: Float[Array, "codes states"]
    weights: Float[Array, " patterns"]


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


def _check_inputs(alignment: Alignment, tree: Tree, model: Model) -> None:
    if model.alphabet != alignment.alphabet:
        raise ModelError(
            f"{alignment.source}: the model is for {model.alphabet.name} data "
            f"but the alignment is {alignment.alphabet.name}"
        )
    lengths = tree.branch_lengths
    if not isinstance(lengths, jax.core.Tracer):
        bad = ~np.isfinite(np.asarray(lengths)) | (np.asarray(lengths) < 0)
        if bad.any():
            node = int(np.argmax(bad))
            where = f"taxon {tree.taxa[node]!r}" if node < tree.num_tips else f"internal node {node}"
            raise InputError(f"branch length {float(lengths[node])} above {where} is negative or not finite")


def kernel_branch_lengths(branch_lengths: Float[Array, " nodes"], schedule: Schedule) -> Float[Array, " kernel"]:
    """Branch length of every kernel node (zero for resolved polytomies, root, sentinel)."""
    padded = jnp.concatenate([branch_lengths, jnp.zeros(1, branch_lengths.dtype)])
    return padded[schedule.branch_index]


METHODS = ("preorder", "autodiff")


def kernel_arrays(model: Model, branch_lengths, data: PatternData, schedule: Schedule, dtype):
    """What the kernels take: `(P, pi, w, tip codes, tip table)` in the working precision."""
    transition = model.transition_matrices(kernel_branch_lengths(branch_lengths, schedule))
    _, weights = model.rate_categories()
    return (
        transition.astype(dtype),
        model.frequencies.astype(dtype),
        weights.astype(dtype),
        data.tip_codes,
        data.tip_table.astype(dtype),
    )


@eqx.filter_jit
def _pattern_log_likelihoods(model: Model, branch_lengths, data: PatternData, schedule: Schedule, dtype,
                             static_steps=None):
    """`static_steps=None`: the custom-VJP kernel; a tuple: plain autodiff through fixed-length loops."""
    arrays = kernel_arrays(model, branch_lengths, data, schedule, dtype)
    if static_steps is None:
        return _kernel.pattern_log_likelihoods(*arrays, schedule)
    return _peeling.pattern_log_likelihoods(*arrays, schedule, static_steps)


STEP_BYTES = 1 << 28  # cap on one `[width, C, P, S]` temporary of a level step


def schedule_for(tree: Tree, model: Model, data: PatternData, dtype) -> Schedule:
    """The tree's schedule, with steps narrow enough that one step's arrays stay near `STEP_BYTES`."""
    _, weights = jax.eval_shape(model.rate_categories)
    node_bytes = weights.shape[0] * data.tip_codes.shape[1] * data.tip_table.shape[1] * jnp.dtype(dtype).itemsize
    return build_schedule(tree.topology, max(1, STEP_BYTES // node_bytes))


def prepare(alignment: Alignment, tree: Tree, model: Model, precision: str, method: str = "preorder"):
    """Validate the inputs, then `(pattern data, schedule, dtype)`."""
    _check_inputs(alignment, tree, model)
    _check_options(precision, method)
    data, dtype = pattern_data(alignment, tree), PRECISIONS[precision]
    return data, schedule_for(tree, model, data, dtype), dtype


def _check_options(precision: str, method: str) -> None:
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    if method not in METHODS:
        raise ModelError(f"method must be 'preorder' or 'autodiff', not {method!r}")


def data_log_likelihood(data: PatternData, tree: Tree, model: Model, *, precision: str = "float64") -> Float[Array, ""]:
    """`log L` of pattern data already laid out for `tree` by `pattern_data` (a pytree, so it may be a jit argument)."""
    _check_options(precision, "preorder")
    states = jax.eval_shape(lambda: model.frequencies).shape[-1]
    if data.tip_codes.shape[0] != tree.num_tips + 1 or data.tip_table.shape[-1] != states:
        raise InputError(f"pattern data for {data.tip_codes.shape[0] - 1} tips and {data.tip_table.shape[-1]} states "
                         f"do not fit a tree of {tree.num_tips} tips and a model of {states} states")
    dtype = PRECISIONS[precision]
    schedule = schedule_for(tree, model, data, dtype)
    per_pattern = _pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, dtype)
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
    data, schedule, dtype = prepare(alignment, tree, model, precision, method)
    static_steps = tuple(int(k) for k in schedule.steps) if method == "autodiff" else None
    return _pattern_log_likelihoods(model, tree.branch_lengths, data, schedule, dtype, static_steps)


def log_likelihood(
    alignment: Alignment, tree: Tree, model: Model, *, precision: str = "float64", method: str = "preorder"
) -> Float[Array, ""]:
    """`log L = sum_c weight_c log L_c`: the log-likelihood of the alignment (see `pattern_log_likelihoods`)."""
    per_pattern = pattern_log_likelihoods(alignment, tree, model, precision=precision, method=method)
    return jnp.sum(alignment.site_patterns().weights * per_pattern)
