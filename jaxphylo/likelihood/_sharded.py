"""The likelihood across many devices: site patterns over a `patterns` mesh axis, trees over a `batch` axis.

A device mesh has two named axes, `("batch", "patterns")`. Pattern data is
laid out once by `shard_pattern_data`: the pattern axis of `tip_codes [N+1, P]`
and `weights [P]` is split into contiguous blocks, one per position along
`patterns` (and copied along `batch`); the small tip table is copied to every
device. Trees and the model are copied to every device too (a `TreeBatch` is
split over `batch` instead).

The likelihood then runs under `jax.shard_map`: every device runs the
unchanged fused passes of `jaxphylo.likelihood` on its own columns (on a CPU
the C++ custom call, which XLA could not partition by itself; on a GPU the JAX
kernels, unchanged) and computes the transition matrices itself from its copy
of the model: they are small (branches x categories x S^2), so recomputing
them costs less than sending them. What crosses devices is exactly:

- forward: one all-reduce (`psum` over `patterns`) of each device's weighted
  sum of `log L_c`: a scalar per tree;
- gradient: the transpose of that `psum` (an all-reduce of the scalar
  cotangent, no data), the pre-order pass on each device's own columns, and
  one all-reduce, fused by XLA into a single collective, of the cotangents of
  the copied inputs (branch lengths and model leaves: a few hundred numbers),
  which `shard_map` inserts as the transpose of copying them to every device.
  (Compiled HLO of `jax.grad` on a 1x4 and a 2x2 mesh: exactly these two
  all-reduces; on 2x2 the second spans all four devices, each `batch` row
  contributing half, since every row computed the same tree.)

`check_vma=False`: the C++ CPU kernel's custom calls report their outputs as
not varying over the mesh (JAX's `ffi_call` drops the inputs' varying axes),
which under `check_vma=True` silently skips the all-reduce of the cotangents
and gives a wrong gradient (and the JAX kernels' custom VJP is refused
outright). Without the check, `shard_map` sums the cotangents of every
replicated input, which is what the gradient needs.

For a `TreeBatch` split over `batch` (compiled HLO on 2x2): the forward
all-reduces `[B / batch]` values over `patterns` only; the gradient
all-reduces each device's branch-length cotangents `[B / batch, 2N - 1]` over
`patterns` and the model's cotangents over every device (all trees share the
model). Nothing else crosses the `batch` axis.
Padding patterns (weight 0, every tip missing) have `L_c = 1`, so they add
exactly 0 to log L and to every cotangent.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int

from .._errors import InputError
from ..models import Model
from ..runtime import padded_pattern_count, place, replicate
from ..tree import Tree, TreeBatch
from ._api import batch_data_log_likelihoods, data_log_likelihood
from ._arrays import PRECISIONS, PatternData


def shard_pattern_data(data: PatternData, mesh: Mesh) -> PatternData:
    """`data` padded to a multiple of `mesh.shape["patterns"]` patterns and placed over the mesh.

    `tip_codes [N+1, P]` and `weights [P]` are split over `patterns` (each
    device holds `P / patterns` contiguous columns) and copied along `batch`;
    `tip_table [K, S]` is copied to every device. Padding patterns have weight
    0 and every tip (and the sentinel row) coded missing, the table's last row
    of ones (`pattern_data` puts it there), so their `log L_c` is 0 and they add
    exactly nothing. This is the one transfer of the data: later calls read it
    where it lies.
    """
    codes, table, weights = (np.asarray(data.tip_codes), np.asarray(data.tip_table), np.asarray(data.weights))
    num_patterns = codes.shape[1]
    if num_patterns == 0:
        raise InputError("pattern data has no patterns to shard")
    pad = padded_pattern_count(num_patterns, mesh) - num_patterns
    missing = table.shape[0] - 1
    if pad:
        if not np.all(table[missing] == 1):
            raise InputError("pattern data's tip table lacks the all-missing last row that padding needs")
        codes = np.concatenate([codes, np.full((codes.shape[0], pad), missing, codes.dtype)], axis=1)
        weights = np.concatenate([weights, np.zeros(pad, weights.dtype)])
    return PatternData(
        place(codes, NamedSharding(mesh, PartitionSpec(None, "patterns"))),
        place(table, NamedSharding(mesh, PartitionSpec())),
        place(weights, NamedSharding(mesh, PartitionSpec("patterns"))),
    )


def _ready(data: PatternData, mesh: Mesh) -> PatternData:
    """`data` as `shard_pattern_data` leaves it: padded if it is concrete and not padded yet."""
    if data.tip_codes.shape[1] % mesh.shape["patterns"] == 0:
        return data
    if isinstance(data.tip_codes, jax.core.Tracer):
        raise InputError(f"traced pattern data has {data.tip_codes.shape[1]} patterns, not a multiple of the mesh's "
                         f"{mesh.shape['patterns']}: lay it out with shard_pattern_data(data, mesh) outside jit")
    return shard_pattern_data(data, mesh)


_DATA_SPECS = PatternData(PartitionSpec(None, "patterns"), PartitionSpec(), PartitionSpec("patterns"))


@eqx.filter_jit
def _sharded_total(model: Model, tree: Tree, data: PatternData, mesh: Mesh, precision: str):
    model_arrays, model_static = eqx.partition(model, eqx.is_array)
    tree_arrays, tree_static = eqx.partition(tree, eqx.is_array)

    def local(model_arrays, tree_arrays, local_data):
        # One device's columns: the unchanged passes, then one all-reduce of a scalar.
        value = data_log_likelihood(local_data, eqx.combine(tree_arrays, tree_static),
                                    eqx.combine(model_arrays, model_static), precision=precision)
        return jax.lax.psum(value, "patterns")

    mapped = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(), _DATA_SPECS),
                           out_specs=PartitionSpec(), check_vma=False)
    return mapped(model_arrays, tree_arrays, data)


def sharded_log_likelihood(data: PatternData, tree: Tree, model: Model, mesh: Mesh, *,
                           precision: str = "float64") -> Float[Array, ""]:
    """`log L` of one tree, the patterns split over the mesh's `patterns` axis (see the module docstring).

    `data` is `pattern_data(alignment, tree)`, best already laid out by
    `shard_pattern_data(data, mesh)` (else it is padded and placed here, once
    per call). Equal to `data_log_likelihood(data, tree, model)` up to the order
    of the pattern sum, and differentiable the same way (`jax.grad` runs the
    pre-order pass on every device; the branch-length and model cotangents
    are summed by one all-reduce). On a mesh with `batch > 1`, every row of
    `batch` computes the same value (use `sharded_batch_log_likelihoods` for
    many trees).
    """
    if isinstance(tree, TreeBatch):
        return sharded_batch_log_likelihoods(data, tree, model, mesh, precision=precision)
    if precision not in PRECISIONS:
        raise InputError(f"precision must be 'float64' or 'float32', not {precision!r}")
    data = _ready(data, mesh)
    return _sharded_total(replicate(model, mesh), replicate(tree, mesh), data, mesh, precision)


def pad_batch(trees: TreeBatch, multiple: int) -> TreeBatch:
    """`trees` with copies of its last tree appended up to a multiple of `multiple` trees (works on tracers)."""
    extra = -len(trees) % multiple
    if not extra:
        return trees
    grow = lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], extra, axis=0)], axis=0)  # noqa: E731
    return TreeBatch(grow(trees.parents), grow(trees.branch_lengths), trees.taxa)


@eqx.filter_jit
def _sharded_batch(model: Model, parents: Int[Array, "B nodes"], lengths: Float[Array, "B nodes"],
                   data: PatternData, taxa: tuple, mesh: Mesh, precision: str) -> Float[Array, " B"]:
    model_arrays, model_static = eqx.partition(model, eqx.is_array)

    def local(model_arrays, parents, lengths, local_data):
        # One device's trees (its block of `batch`) on its columns; the sum over columns is one all-reduce of [B/b].
        per_tree = batch_data_log_likelihoods(local_data, TreeBatch(parents, lengths, taxa),
                                              eqx.combine(model_arrays, model_static), precision=precision)
        return jax.lax.psum(per_tree, "patterns")

    trees_spec = PartitionSpec("batch")
    mapped = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), trees_spec, trees_spec, _DATA_SPECS),
                           out_specs=trees_spec, check_vma=False)
    return mapped(model_arrays, parents, lengths, data)


def sharded_batch_log_likelihoods(data: PatternData, trees: TreeBatch, model: Model, mesh: Mesh, *,
                                  precision: str = "float64") -> Float[Array, " B"]:
    """`[B]` log-likelihoods of a `TreeBatch`: trees split over `batch`, patterns over `patterns`.

    Each device evaluates its `B / batch` trees on its `P / patterns` columns
    (the batch is padded with copies of its last tree to a multiple of
    `batch`; those values are dropped, so they get no gradient); the only
    communication is one all-reduce of `[B / batch]` over `patterns` per call
    (for the gradient, of the branch-length cotangents over `patterns` and of
    the model's over every device: see the module docstring). Equal to
    `batch_data_log_likelihoods(data, trees, model)`; topologies are data, so
    any batch of the same size runs one compiled program.
    """
    if precision not in PRECISIONS:
        raise InputError(f"precision must be 'float64' or 'float32', not {precision!r}")
    data = _ready(data, mesh)
    count = len(trees)
    padded = pad_batch(trees, mesh.shape["batch"])
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    parents, lengths = padded.parents, padded.branch_lengths
    if not isinstance(parents, jax.core.Tracer):
        parents = place(parents, sharding)
    if not isinstance(lengths, jax.core.Tracer):
        lengths = place(lengths, sharding)
    values = _sharded_batch(replicate(model, mesh), parents, lengths, data, trees.taxa, mesh, precision)
    return values[:count]


def place_data(data, mesh: Mesh | None):
    """Pattern data for a batch of trees on `mesh`: `PatternData` padded and split over `patterns`
    (`shard_pattern_data`), a partitioned model's data copied to every device (its patterns are not split:
    the mesh's `patterns` axis must then be 1). Unchanged without a mesh."""
    if mesh is None:
        return data
    if isinstance(data, PatternData):
        return shard_pattern_data(data, mesh)
    if mesh.shape["patterns"] > 1:
        raise InputError(f"a partitioned model's patterns are not split over devices: use a mesh with patterns=1 "
                         f"(--mesh batch={mesh.devices.size}), not patterns={mesh.shape['patterns']}")
    return replicate(data, mesh)
