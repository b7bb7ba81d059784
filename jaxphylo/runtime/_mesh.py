"""Device meshes and placing arrays on them: the two named axes `("batch", "patterns")` every multi-device
run uses, the default shape for a problem, and copies or splits of host arrays that also work across the
processes of `jax.distributed` (`replicate`, `place_batch`, `to_host`), per-tree indexing that keeps a
split batch split (`take_per_tree`, `set_per_tree`, `add_per_tree`), and batches whose shares run apart, one
per device (`shard_batch`, `run_shares`)."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._errors import InputError


AXES = ("batch", "patterns")


MIN_PATTERNS_PER_DEVICE = 1024  # below this a device's pass is dispatch-bound (DESIGN.md probe: ~flat under 1k)


def default_mesh_shape(num_devices: int, trees: int = 1, num_patterns: int | None = None) -> tuple[int, int]:
    """`(batch, patterns)` sizes for `num_devices` devices, `trees` trees per call and `num_patterns` patterns.

    The rule:
    - one tree: every device on `patterns` (the batch axis would only repeat the work);
    - several trees: `batch` gets the largest divisor of the device count that
      also divides the number of trees (splitting trees needs no communication
      and, unlike splitting columns, keeps each device's pass as wide as it was),
      and `patterns` the rest;
    - but if the pattern shards would then hold fewer than `MIN_PATTERNS_PER_DEVICE`
      patterns (few patterns: a device would idle on dispatch), `batch` takes the
      largest divisor of the device count not above the number of trees, and the
      batch is padded with copies of its last tree.
    """
    if num_devices < 1:
        raise InputError(f"a mesh needs at least one device, not {num_devices}")
    divisors = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
    if trees <= 1:
        return 1, num_devices
    batch = max(d for d in divisors if trees % d == 0)
    if num_patterns is not None and num_patterns < MIN_PATTERNS_PER_DEVICE * (num_devices // batch):
        batch = max(d for d in divisors if d <= trees)
    return batch, num_devices // batch


def device_mesh(devices=None, batch: int | None = None, patterns: int | None = None, *, trees: int = 1,
                num_patterns: int | None = None) -> Mesh:
    """A `Mesh` with axes `("batch", "patterns")` over `devices` (default: every device of every process).

    Give `batch`, `patterns`, both (their product must be the device count) or
    neither (then `default_mesh_shape(len(devices), trees, num_patterns)` picks).
    Devices are laid out row by row in `jax.devices()` order, which lists each
    process's devices together: a `patterns` row (whose devices all-reduce at
    every likelihood) stays within a host where it can, and `batch` (no
    communication) spans hosts.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    for name, size in (("batch", batch), ("patterns", patterns)):
        if size is not None and (size < 1 or n % size):
            raise InputError(f"mesh axis {name}={size} does not divide the {n} devices")
    if batch is None and patterns is None:
        batch, patterns = default_mesh_shape(n, trees, num_patterns)
    elif batch is None:
        batch = n // patterns
    elif patterns is None:
        patterns = n // batch
    if batch * patterns != n:
        raise InputError(f"mesh batch={batch} x patterns={patterns} is {batch * patterns} devices, not the {n} given")
    return Mesh(np.array(devices, dtype=object).reshape(batch, patterns), AXES)


def place(value, sharding: NamedSharding) -> jax.Array:
    """A host array as a global array with `sharding`; each process supplies only its own devices' pieces.

    `make_array_from_callback` works the same under `jax.distributed` (where
    `device_put` of a host array to devices of other processes would not).
    """
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicate(pytree, mesh: Mesh):
    """Every concrete array leaf of `pytree` (a model, a tree) copied to every device of `mesh`.

    Tracers (inside a caller's `jit` or `grad`) are left alone: `jit` places them.
    Needed only under `jax.distributed`, where an array on one local device
    cannot enter a computation over other processes' devices.
    """
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(lambda leaf: _put(leaf, sharding), pytree)


def _put(leaf, sharding: NamedSharding):
    """One leaf with `sharding`: tracers and non-arrays as they are, an array already so placed unchanged,
    a global array (spanning other processes) re-laid out on the devices, anything else placed from the host."""
    if isinstance(leaf, jax.core.Tracer) or not isinstance(leaf, (np.ndarray, jax.Array)):
        return leaf
    if isinstance(leaf, jax.Array):
        if leaf.sharding == sharding:
            return leaf
        if not leaf.is_fully_addressable:
            return jax.device_put(leaf, sharding)
    return place(leaf, sharding)


def padded_pattern_count(num_patterns: int, mesh: Mesh) -> int:
    """The pattern count rounded up to a multiple of the mesh's `patterns` size."""
    shards = mesh.shape["patterns"]
    return shards * math.ceil(num_patterns / shards)


def place_batch(x, mesh: Mesh | None):
    """A batch-leading array (or pytree of them) split over `batch` where its leading length divides evenly,
    else copied to every device; unchanged without a mesh."""
    if mesh is None:
        return x
    rows = mesh.shape["batch"]

    def place(leaf):
        split = np.ndim(leaf) and np.shape(leaf)[0] % rows == 0
        return _put(leaf, NamedSharding(mesh, PartitionSpec("batch") if split else PartitionSpec()))

    return jax.tree_util.tree_map(place, x)


def take_per_tree(x: jax.Array, index) -> jax.Array:
    """`x[b, index[b]]` for every tree `b` (`index` an array or a tuple of them, one per indexed axis).

    Written per tree under `vmap`, so the gather has a batch dimension: XLA's
    SPMD partitioner then keeps a batch split over devices split, where
    `x[arange(B)[:, None], index]` makes it gather every device's trees onto
    every device (each GPU would compute the whole batch).
    """
    return jax.vmap(lambda a, i: a[i])(x, index)


def set_per_tree(x: jax.Array, index, values, **kwargs) -> jax.Array:
    """`x[b, index[b]] = values[b]` for every tree (see `take_per_tree`; `kwargs` go to `.at[].set`)."""
    return jax.vmap(lambda a, i, v: a.at[i].set(v, **kwargs))(x, index, values)


def add_per_tree(x: jax.Array, index, values) -> jax.Array:
    """`x[b, index[b]] += values[b]` for every tree (see `take_per_tree`)."""
    return jax.vmap(lambda a, i, v: a.at[i].add(v))(x, index, values)


def splits_batch(mesh: Mesh | None, size: int) -> bool:
    """Whether a batch of `size` (runs, replicates) runs in shares, one per row of `mesh` (`shard_batch`):
    several rows, patterns not split, and the rows dividing `size`."""
    return (mesh is not None and mesh.shape["batch"] > 1 and mesh.shape["patterns"] == 1
            and size % mesh.shape["batch"] == 0)


def batch_specs(tree):
    """`PartitionSpec("batch")` for every leaf of `tree` with a leading (batch) axis, `PartitionSpec()` for scalars."""
    return jax.tree.map(lambda x: PartitionSpec() if np.ndim(x) == 0 else PartitionSpec("batch"), tree)


SHARE_TRACING = threading.RLock()  # NumPyro's effect handlers (model priors) are module globals, not per thread


def on_devices(fn, devices, *per_device):
    """`[fn(*args_i) for each device i]`, each call in a thread of its own with device `i` the default device
    (its host work and waits overlap the others'); `per_device` are sequences of arguments, one per device."""

    def one(device, *args):
        with jax.default_device(device):
            return fn(*args)

    with ThreadPoolExecutor(len(devices)) as pool:
        return list(pool.map(one, devices, *per_device))


def shard_batch(fn, mesh: Mesh, batched: tuple, shared: tuple, out_specs):
    """`fn(*batched, *shared)` with each row of `mesh` running its share of the batch on its own, as one
    `jax.shard_map` program over the mesh (call it inside `jit`, so that it is traced once).

    `batched` pytrees are split on their leading axis (`batch_specs`), `shared` ones copied to every device;
    `out_specs` (`PartitionSpec`s, a prefix of the results) says how the shares' results join: `"batch"` on
    the axis the batch runs along, `PartitionSpec()` for what every share computes alike. Under the SPMD
    partitioner a split batch runs in lock step: a data-dependent loop (a walk, a dirty path, an optimiser's
    iterations) runs as long as the longest member's anywhere, with an all-reduce of its condition on every
    iteration. In shares, a device's loops end when its own members are done. Callers keep every draw per
    member (a chain's or a replicate's own random stream), so that the result does not depend on the split.
    This is the form for a mesh spanning processes (a process per GPU); on a mesh of this process's devices
    `run_shares` is faster (one program over four H200s ran MC³ at weak-scaling efficiency 0.61, as one
    process's threads did, while four processes, a GPU each, ran at one GPU's speed).
    """
    specs = _in_specs(batched, shared)
    # check_vma off: the likelihood's foreign-function kernels (C++, Pallas) return values that carry no
    # varying-axis type, and `out_specs` is what the caller knows: its shared results are the same everywhere.
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(*batched, *shared)


def _in_specs(batched: tuple, shared: tuple) -> tuple:
    """`batched` pytrees split over `batch` on their leading axis, `shared` ones copied to every device."""
    return (*map(batch_specs, batched), *(jax.tree.map(lambda _: PartitionSpec(), x) for x in shared))


def is_local(mesh: Mesh) -> bool:
    """Whether every device of `mesh` belongs to this process."""
    local = set(jax.local_devices())
    return all(d in local for d in mesh.devices.flat)


def run_shares(fn, mesh: Mesh, batched: tuple, shared: tuple, out_specs):
    """`shard_batch`'s result on a mesh of this process's devices, with `fn` (a jitted function) called once
    per device on the device's pieces, each call in a thread of its own (`on_devices`: a GPU program's loops
    step through the host, so a thread runs one device's program at a time), and the results joined without
    copies. Arrays only: `shared` leaves are arrays or host values. A program traced in the threads holds
    `SHARE_TRACING` while it is traced."""
    specs = _in_specs(batched, shared)
    devices = list(mesh.devices[:, 0])
    placed = jax.tree.map(lambda x, spec: _put(x, NamedSharding(mesh, spec)), (*batched, *shared), specs)
    leaves, structure = jax.tree.flatten(placed)
    pieces = [[_piece(leaf, device) for leaf in leaves] for device in devices]
    results = on_devices(lambda flat: fn(*jax.tree.unflatten(structure, flat)), devices, pieces)
    out_leaves = [jax.tree.leaves(r) for r in results]
    leaf_specs = jax.tree.leaves(jax.tree.map(lambda spec, sub: jax.tree.map(lambda _: spec, sub), out_specs,
                                              results[0], is_leaf=lambda x: isinstance(x, PartitionSpec)),
                                 is_leaf=lambda x: isinstance(x, PartitionSpec))
    joined = []
    for k, spec in enumerate(leaf_specs):
        local = [r[k] for r in out_leaves]
        shape = list(local[0].shape)
        if "batch" in spec:
            shape[list(spec).index("batch")] *= len(devices)
        joined.append(jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(mesh, spec), local))
    return jax.tree.unflatten(jax.tree.structure(results[0]), joined)


def _piece(x, device):
    """The part of a placed array that `device` holds (a host scalar: copied there)."""
    if not isinstance(x, jax.Array):
        return jax.device_put(x, device)
    return next(shard.data for shard in x.addressable_shards if shard.device == device)


def run_mesh(devices=None, mesh_shape: tuple[int | None, int | None] = (None, None), *, trees: int = 1,
             num_patterns: int | None = None) -> Mesh | None:
    """The mesh a run uses: over `devices` (default every device), `(batch, patterns)` as given or the
    default for `trees` trees and `num_patterns` patterns; None for a single device (nothing to place)."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) == 1:
        return None
    return device_mesh(devices, *mesh_shape, trees=trees, num_patterns=num_patterns)


def to_device(x, dtype=None) -> jax.Array:
    """`jnp.asarray(x, dtype)` without compiling anything for a host value (a NumPy array, a Python number or list).

    Outside jit, JAX 0.10's `jnp.asarray` of a host value runs a one-operation program (`stage`, or
    `convert_element_type` with a dtype) compiled anew for every shape and dtype: tens of milliseconds each, dozens
    per command. `jax.device_put` copies the value instead. The result is never weakly typed (a Python `2.0`
    becomes a float64 array, as a value an optimiser returns would be, so jitted functions see one type). JAX
    arrays and tracers go through `jnp.asarray` as before."""
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return jax.numpy.asarray(x, dtype)
    return jax.device_put(np.asarray(x, dtype))


def to_host(x):
    """The whole value of an array, or of every array of a pytree, on the host, in every process: arrays split
    over other processes' devices are gathered from them in one call (`multihost_utils.process_allgather`:
    one program and one exchange for the whole pytree: one per leaf made a block of MC³ on two CPU processes
    wait 0.6 s per leaf); anything else is read as it is."""
    leaves, structure = jax.tree.flatten(x)
    split = [isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated
             for leaf in leaves]
    remote = [k for k, is_split in enumerate(split) if is_split]
    host = [None if is_split else np.asarray(leaf) for leaf, is_split in zip(leaves, split)]
    if remote:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather([leaves[k] for k in remote], tiled=True)
        for k, value in zip(remote, gathered):
            host[k] = np.asarray(value)
    return jax.tree.unflatten(structure, host)
