"""What a run will cost, said before it starts: memory per device and the time of one evaluation.

The memory figure is XLA's own account of the compiled likelihood-and-gradient
(arguments + outputs + temporaries, `Compiled.memory_analysis()`, obtained by
compiling on shapes alone, so nothing large is allocated) for the batch of
trees the command evaluates at once, plus what lives outside XLA: the C++ CPU
kernel's per-thread blocks (about 8 MB each) and, on a CPU, the process
itself (the JAX runtime and the data read). For orientation it is printed
beside the two sizes that dominate it on a GPU:

    partials            nodes x categories x patterns x states x bytes  (one buffer per tree)
    transition matrices branches x categories x states^2 x bytes

A run whose figure exceeds a device's free memory stops before it allocates
anything large (`ResourceError`, naming the numbers and what would fit).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ..models import PartitionedModel, category_count
from ..runtime import ResourceError, device_free_memory, gib, peak_resident_bytes, reset_peak_resident, resident_bytes
from ..tree import Tree, TreeBatch
from .kernels import cpu_wanted
from ._api import batch_data_log_likelihoods
from ._arrays import PRECISIONS, PatternData

CPU_KERNEL_BLOCK = 8 << 20  # bytes of scratch per CPU-kernel thread (likelihood/_cpu/peeling.cc)


@dataclass
class Cost:
    """The memory and time of one likelihood-and-gradient of `batch` trees on one device."""

    taxa: int
    sites: int
    patterns: int
    states: int
    categories: int
    batch: int
    precision: str
    partials_bytes: int  # one post-order partials buffer of one tree
    matrices_bytes: int  # the transition matrices of one tree
    program_bytes: int  # XLA: arguments + outputs + temporaries of the compiled evaluation
    outside_bytes: int  # outside XLA: CPU kernel scratch, and on a CPU the process as it stands
    device: str
    free_bytes: int
    total_bytes: int
    compile_seconds: float | None = None
    seconds: float | None = None  # median of three evaluations after compilation
    measured_bytes: int | None = None  # peak memory measured while evaluating
    program: str = ""  # what `program_bytes` is the memory of
    compiled: tuple | None = field(default=None, repr=False)  # (program, trees, model leaves) for `measure`

    @property
    def _evaluation_name(self) -> str:
        return f"likelihood and gradient of {self.batch} tree{'s' * (self.batch > 1)} at once"

    @property
    def needed_bytes(self) -> int:
        return self.program_bytes + self.outside_bytes

    def report(self) -> str:
        lines = [f"data: {self.taxa} taxa, {self.sites} sites, {self.patterns} patterns, {self.states} states, "
                 f"{self.categories} rate categories; {self.precision}",
                 f"one tree: partials {gib(self.partials_bytes)} per buffer, "
                 f"transition matrices {gib(self.matrices_bytes)}",
                 f"{self.program or self._evaluation_name}: "
                 f"{gib(self.program_bytes)} (XLA) + {gib(self.outside_bytes)} (outside XLA) = "
                 f"{gib(self.needed_bytes)}",
                 f"device: {self.device}, {gib(self.free_bytes)} free of {gib(self.total_bytes)}"]
        if self.seconds is not None:
            lines.append(f"one likelihood-and-gradient: {1e3 * self.seconds:.2f} ms "
                         f"(compilation {self.compile_seconds:.1f} s)")
        if self.measured_bytes is not None:
            lines.append(f"measured peak while evaluating: {gib(self.measured_bytes)}")
        return "\n".join(lines)


def _evaluation(data, model, precision):
    """value and gradient (branch lengths, model) of the summed log-likelihood of a batch of trees."""

    def total(lengths, model, parents, taxa):
        trees = TreeBatch(parents, lengths, taxa)
        return jnp.sum(batch_data_log_likelihoods(data, trees, model, precision=precision))

    return jax.value_and_grad(total, argnums=(0, 1))


def evaluation_cost(data, tree: Tree, model, precision: str = "float64", batch: int = 1, sites: int | None = None,
                    device=None) -> Cost:
    """The memory of one likelihood-and-gradient of `batch` copies of `tree` (compiled on shapes, not run)."""
    import equinox as eqx

    device = device or jax.devices()[0]
    one = TreeBatch.from_trees([tree])
    trees = TreeBatch(jnp.broadcast_to(one.parents, (batch,) + one.parents.shape[1:]),
                      jnp.broadcast_to(one.branch_lengths, (batch,) + one.branch_lengths.shape[1:]), one.taxa)
    dtype = jnp.dtype(PRECISIONS[precision])
    nodes, patterns, states = trees.parents.shape[1], data.tip_codes.shape[1], data.tip_table.shape[1]
    categories = category_count(model)
    params, static = eqx.partition(model, eqx.is_array)

    def run(lengths, params, parents, data):
        return _evaluation(data, eqx.combine(params, static), precision)(lengths, eqx.combine(params, static),
                                                                        parents, trees.taxa)

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                          (trees.branch_lengths, params, trees.parents, data))
    began = time.perf_counter()
    compiled = jax.jit(run).lower(*shapes).compile()
    compile_seconds = time.perf_counter() - began
    free, total = device_free_memory(device)
    if device.platform == "cpu":
        free += resident_bytes()  # the process's own memory is part of what it will use
    cost = Cost(taxa=tree.num_tips, sites=sites or int(np.sum(np.asarray(data.weights))), patterns=patterns,
                states=states, categories=categories, batch=batch, precision=precision,
                partials_bytes=nodes * categories * patterns * states * dtype.itemsize,
                matrices_bytes=(nodes - 1) * categories * states * states * dtype.itemsize,
                program_bytes=program_bytes(compiled), outside_bytes=outside_bytes(device), device=str(device),
                free_bytes=int(free), total_bytes=int(total), compile_seconds=compile_seconds,
                compiled=(compiled, trees, params))
    return cost


def partials_cells(data, tree: Tree, model) -> int:
    """One tree's partial likelihoods, in numbers: nodes x rate categories x patterns x states (a partitioned
    model counted as its widest part on every pattern, as `plan` counts it)."""
    data, model = _single_model_view(data, model)
    return (2 * tree.num_tips) * category_count(model) * data.tip_codes.shape[1] * data.tip_table.shape[1]


def rough_bytes(data, tree: Tree, model, precision: str, batch: int) -> int:
    """A quick upper bound before compiling anything: three partials buffers per tree, plus the tip data."""
    itemsize = 8 if precision == "float64" else 4
    return 3 * batch * partials_cells(data, tree, model) * itemsize + data.tip_codes.size * 4


def _single_model_view(data, model):
    """A partitioned model's costs as one model's: the part with the most states x categories on every group's
    patterns side by side (an upper bound: each part evaluates only its own patterns, at its own size)."""

    if not isinstance(model, PartitionedModel):
        return data, model
    size = lambda m: m.frequencies.shape[-1] * category_count(m)
    widest = max(model.models, key=size)
    group = next(g for g in data.groups if model.models[g.parts[0]].frequencies.shape[-1] == widest.frequencies.shape[-1])
    patterns = int(data.weights.shape[0])
    codes = np.full((group.tip_codes.shape[1], patterns), group.tip_table.shape[1] - 1, np.int32)
    return PatternData(codes, np.asarray(group.tip_table[0]), np.ones(patterns)), widest


def plan(data, tree: Tree, model, precision: str, batch: int, dry_run: bool, sites: int | None = None,
         log=print, program=None) -> None:
    """What `--dry-run` prints (then the caller exits); otherwise stop a run that cannot fit.

    `program`, if given, is `(name, compile)`: the command's own step (a NUTS
    chunk), compiled on shapes, whose memory replaces the plain evaluation's.
    The full estimate compiles (seconds), so a run whose rough bound is under a
    tenth of the free memory starts without it.
    """
    data, model = _single_model_view(data, model)
    device = jax.devices()[0]
    if not dry_run and rough_bytes(data, tree, model, precision, batch) < device_free_memory(device)[0] / 10:
        return
    cost = evaluation_cost(data, tree, model, precision, batch, sites, device)
    if program is not None and cost.needed_bytes <= cost.free_bytes:  # if not, the step cannot fit either
        cost.program, compile_step = program
        cost.program_bytes = max(cost.program_bytes, program_bytes(compile_step()))
        cost.outside_bytes = outside_bytes(device)  # with the step's compiled code loaded
    if dry_run:
        log(f"devices: {', '.join(str(d) for d in jax.devices())}")
        if cost.needed_bytes <= cost.free_bytes:
            cost = measure(cost, data)
        log(cost.report())
    check_fits(cost)


def program_bytes(compiled) -> int:
    """XLA's account of a compiled program: arguments + outputs + temporaries (aliased buffers once)."""
    a = compiled.memory_analysis()
    return int(a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes - a.alias_size_in_bytes)


def outside_bytes(device) -> int:
    """Memory a run holds outside XLA's buffers: on a CPU the process as it stands (runtime, compiled code,
    data) and the C++ kernel's per-thread blocks; nothing on a GPU (the device holds only XLA's buffers)."""
    if device.platform != "cpu":
        return 0
    threads = int(os.environ.get("JAXPHYLO_CPU_THREADS", os.cpu_count() or 1))
    return resident_bytes() + (CPU_KERNEL_BLOCK * threads if cpu_wanted() else 0)


def check_fits(cost: Cost) -> None:
    """`ResourceError` naming the figures and what would fit, when the run needs more than is free."""
    if cost.needed_bytes <= cost.free_bytes:
        return
    hints = []
    if cost.precision == "float64":
        hints.append("--precision float32 (about half the partials)")
    if cost.categories > 1:
        hints.append("fewer rate categories (memory scales with them)")
    if cost.batch > 1:
        hints.append(f"fewer trees at once than {cost.batch} (--chains, or --batch for ml)")
    hints.append("a device with more memory")
    raise ResourceError(f"this run needs about {gib(cost.needed_bytes)} on {cost.device} but "
                        f"{gib(cost.free_bytes)} is free (partials {gib(cost.partials_bytes)} per tree, "
                        f"{cost.patterns} patterns x {cost.categories} categories x {cost.states} states); "
                        f"try {'; or '.join(hints)}")


def measure(cost: Cost, data, repeats: int = 3) -> Cost:
    """Run the compiled evaluation: its time (median of `repeats` after a first call) and its peak memory."""
    compiled, trees, params = cost.compiled
    device = jax.devices()[0]
    before = device.memory_stats() if device.platform != "cpu" else None
    resident = resident_bytes()
    reset_peak_resident()
    jax.block_until_ready(compiled(trees.branch_lengths, params, trees.parents, data))  # first touch
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(compiled(trees.branch_lengths, params, trees.parents, data))
        times.append(time.perf_counter() - began)
    cost.seconds = statistics.median(times)
    if before is not None:
        cost.measured_bytes = device.memory_stats().get("peak_bytes_in_use", 0)
    else:
        cost.measured_bytes = max(peak_resident_bytes(), resident)
    return cost
