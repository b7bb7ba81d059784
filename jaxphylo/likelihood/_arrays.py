"""What the kernels take: pattern data laid out for a tree's tips, a model's matrices in layout order,
and the checks on inputs every entry point makes."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..data import Alignment
from .._errors import InputError, ModelError
from ..models import Decomposed, Model, decomposed
from ..tree import Schedule, Tree, TreeBatch

PRECISIONS = {"float64": jnp.float64, "float32": jnp.float32}
METHODS = ("preorder", "autodiff")
STEP_BYTES = 1 << 28  # cap on one `[width, C, P, S]` temporary of a level step
MIN_BUCKET = 16  # the fewest pattern columns `bucket_patterns` lays out


class PatternData(eqx.Module):
    """Tip data in the tree's tip order, plus one all-missing row, and pattern weights."""

    tip_codes: Int[Array, "tips_plus_one patterns"]
    tip_table: Float[Array, "codes states"]
    weights: Float[Array, " patterns"]

    # One PhyloCTMC observation to NumPyro, whose model checks read `jnp.shape`/`jnp.ndim` of every
    # site's value (JAX warns on objects without them).
    shape = property(lambda self: ())
    ndim = property(lambda self: 0)


def pattern_data(alignment: Alignment, tree: Tree, compress: bool = True, bucket: bool = False) -> PatternData:
    """Match the alignment's taxa to the tree's tips and lay out the site patterns.

    `compress=False` keeps one pattern per site, so that every alignment of a
    given size has arrays of the same shape (one compiled program for all).
    `bucket=True` pads the patterns and the tip table to a few sizes
    (`bucket_patterns`), so that alignments of a size class share programs.
    """
    check_taxa(alignment, tree)
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
    data = PatternData(codes.astype(np.int32), table, weights)
    return bucket_patterns(data) if bucket else data


def pattern_bucket(count: int) -> int:
    """`count` rounded up to the next size of the form `m 2^k`, `m` in 5..8 (four sizes per doubling, at least
    `MIN_BUCKET`): at most 25% more columns (12% on average), and one compiled program for every alignment
    in the class."""
    if count <= MIN_BUCKET:
        return MIN_BUCKET
    step = 1 << ((count - 1).bit_length() - 3)
    return -(-count // step) * step


def bucket_patterns(data: PatternData) -> PatternData:
    """`data` padded to `pattern_bucket` columns and a power-of-two number of tip-table rows.

    A padded column is all-missing at every tip (its likelihood is exactly 1, so
    `log L_c = 0`: finite, as every derivative) and has weight 0: it adds exactly
    nothing to `sum_c w_c log L_c` or to any derivative. Padded table rows are
    never indexed. Per-pattern outputs are cut back to the first
    `alignment.site_patterns().num_patterns` columns by their callers.
    """
    codes, table = np.asarray(data.tip_codes), np.asarray(data.tip_table)
    patterns, rows = codes.shape[1], table.shape[0]  # table's last row is the all-missing one
    width, height = pattern_bucket(patterns), max(8, 1 << (rows - 1).bit_length())
    missing = height - 1
    codes = np.where(codes == rows - 1, missing, codes)
    codes = np.pad(codes, ((0, 0), (0, width - patterns)), constant_values=missing)
    table = np.concatenate([table[:-1], np.zeros((height - rows, table.shape[1])), table[-1:]])
    return PatternData(codes.astype(np.int32), table, np.pad(np.asarray(data.weights), (0, width - patterns)))


def check_taxa(alignment: Alignment, tree: Tree) -> None:
    in_tree, in_alignment = set(tree.taxa), set(alignment.taxa)
    if only := sorted(in_tree - in_alignment):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the tree but not in the alignment")
    if only := sorted(in_alignment - in_tree):
        raise InputError(f"{alignment.source}: taxon {only[0]!r} is in the alignment but not in the tree")


def check_inputs(alignment: Alignment, tree: Tree | TreeBatch, model: Model) -> None:
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


def check_options(precision: str, method: str) -> None:
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be 'float64' or 'float32', not {precision!r}")
    if method not in METHODS:
        raise ModelError(f"method must be 'preorder' or 'autodiff', not {method!r}")


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


def spectral_arrays(model: Model, dtype, per_tree_models: bool = False, batch: int = 1):
    """The model as a kernel that forms `P` itself takes it: `(left [B, S, S], values [B, S], right [B, S, S],
    rates [B, C], w [B, C], pi [B, S])` with `P_r(t) = left diag(exp(values rates_r t)) right` (from the
    symmetric form `A = U diag(lam) U^T`: `left = diag(pi)^-1/2 U`, `right = U^T diag(pi)^1/2`). A model
    without a per-tree axis is broadcast to `batch` trees."""
    if per_tree_models:
        return jax.vmap(lambda m: tuple(x[0] for x in spectral_arrays(m, dtype)))(model)
    substitution = model.substitution
    if not isinstance(substitution, Decomposed):
        substitution = decomposed(substitution)
    root = jnp.sqrt(substitution.frequencies)
    u = substitution.eigenvectors
    rates, weights = model.rate_categories()
    parts = (u / root[:, None], substitution.eigenvalues, u.T * root[None, :], rates, weights,
             substitution.frequencies)
    return tuple(jnp.broadcast_to(x.astype(dtype), (batch,) + x.shape) for x in parts)


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
