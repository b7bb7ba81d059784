"""The C++ CPU kernel (XLA FFI custom calls, `kernels.cpu`) against the JAX kernel it reproduces.

Log-likelihoods against `kernels.xla`'s post-order, and every cotangent (P, pi,
category weights, the tip table through the tips) against the custom VJP of
`kernels.pattern_log_likelihoods`, with 4, 20 and 61 states, one tree and a batch of three, missing
data, float64 and float32; a 2,000-taxon tree (rescaling); vmap; bad input.
"""

import os
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.tree import branch_index, device_schedule, phase_widths
from jaxphylo.likelihood import kernels
from jaxphylo.likelihood import batch_layout_lengths, kernel_arrays, layout_lengths, pattern_data

MODELS = {
    4: "GTR{1.2,3.4,0.8,1.1,4.0}+F{.3,.2,.2,.3}+G4{0.5}",
    20: "LG+G4{0.8}",
    61: "GY{2.0,0.3}+G4{0.9}",
}
TOLERANCE = {jnp.float64: 1e-12, jnp.float32: 1e-5}
SMALL = (MODELS[4], 11, 90)  # the 4-state case's model, taxa and sites: the other tests reuse its compiled code


@pytest.fixture(autouse=True)
def _library():
    if not kernels.cpu.available():
        message = f"CPU kernel not built: {kernels.cpu.unavailable_reason()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def random_alignment(alphabet, taxa, sites, rng):
    """Random states with 10% missing and 5% ambiguous cells (no simulation: quick, and hard on rescaling)."""
    states = list(alphabet.states)
    missing, ambiguous = {"dna": ("-", "R"), "protein": ("-", "B")}.get(alphabet.name, ("---", "AAN"))
    cells = rng.choice(len(states), (taxa, sites))
    kind = rng.random((taxa, sites))
    sequences = ["".join(missing if k < 0.1 else ambiguous if k < 0.15 else states[c] for c, k in zip(row, kinds))
                 for row, kinds in zip(cells, kind)]
    return jp.Alignment(tuple(f"t{i}" for i in range(taxa)), tuple(sequences), alphabet)


@lru_cache(maxsize=None)
def kernel_inputs(model_string, taxa, sites, batch, dtype, seed=0, max_width=None):
    """`(transition, pi, w, tip codes, tip table, schedule)` of random trees and random data with gaps."""
    model = jp.parse_model(model_string)
    alignment = random_alignment(model.alphabet, taxa, sites, np.random.default_rng(seed))
    trees = [jp.random_topology_tree(alignment.taxa, seed=seed + b, mean_branch_length=0.15) for b in range(batch)]
    if batch == 1:  # the one-tree path: a cached host schedule
        tree = trees[0]
        schedule = jp.build_schedule(tree.topology, max_width)
        lengths = layout_lengths(tree.branch_lengths, branch_index(tree.topology), schedule)
        data = pattern_data(alignment, tree)
    else:  # the batch path: the schedule built on the device
        trees = jp.TreeBatch.from_trees(trees)
        schedule = device_schedule(trees.parents, phase_widths(taxa, max_width))
        lengths = batch_layout_lengths(trees.branch_lengths, schedule)
        data = pattern_data(alignment, trees)
    transition, pi, w, codes, table = _kernel_arrays(model, lengths, data, dtype)
    return transition, pi, w, jnp.asarray(codes), jnp.asarray(table), schedule


_kernel_arrays = jax.jit(kernel_arrays, static_argnums=3)  # one compile, not op by op


@jax.jit
def jax_kernel(transition, pi, w, codes, table, schedule, g):
    """The JAX kernel's log-likelihoods (its post-order, `kernels.xla.log_likelihoods_from(*post_order_partials(...))`)
    and the cotangents of its custom VJP (the pre-order pass) for P, pi, w and the tip table."""
    value, vjp = jax.vjp(lambda t, p, c, x: kernels.pattern_log_likelihoods(t, p, c, codes, x, schedule),
                         transition, pi, w, table)
    return value, vjp(g)


def close(ours, reference, tolerance):
    """Equal to `tolerance` relative to the largest reference entry (cotangents have tiny entries)."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance * np.max(np.abs(reference)))


def table_cotangent(d_tips, codes, table):
    num_tips = codes.shape[0] - 1
    return jax.ops.segment_sum(d_tips[:num_tips].reshape(-1, table.shape[1]), codes[:num_tips].reshape(-1),
                               num_segments=table.shape[0])


def check_against(reference, cotangents, transition, pi, w, codes, table, schedule, g, tolerance):
    """The FFI calls on these inputs (in their dtype) against the JAX kernel's values and cotangents."""
    d_transition, d_pi, d_w, d_table = cotangents
    batch, states, dtype = transition.shape[0], transition.shape[-1], transition.dtype
    ours, partials = kernels.cpu.post_order(transition, codes, table, schedule, pi, w)
    assert ours.dtype == dtype and partials.shape == (batch, schedule.num_slots + 1) + transition.shape[2:3] + (
        codes.shape[1], states)
    close(ours, reference, tolerance)
    np.testing.assert_array_equal(kernels.cpu.log_likelihoods(transition, codes, table, schedule, pi, w), ours)

    stored = kernels.cpu.pre_order_cotangents(transition, codes, table, schedule, pi, w, partials, g)
    recomputed = kernels.cpu.cotangents(transition, codes, table, schedule, pi, w, g)
    assert stored[3].shape == (codes.shape[0], codes.shape[1], states) and recomputed[3].shape == table.shape
    for ours in (stored[:3] + (table_cotangent(stored[3], codes, table),), recomputed):
        assert all(x.dtype == dtype for x in ours)
        # The sentinel's P (last layout id) is the identity padding reads: no cotangent there.
        close(ours[0][:, :-1], d_transition[:, :-1], tolerance)
        assert not np.any(np.asarray(ours[0][:, -1]))
        close(ours[1], d_pi, tolerance)
        close(ours[2], d_w, tolerance)
        close(ours[3], d_table, tolerance)
    np.testing.assert_array_equal(stored[3][-1], 0)  # the all-missing spare row is not a tip


# One JAX kernel compile per case (float64); float32 is checked against it on the inputs rounded to float32.
# Steps at most 2 wide: two phases to compile (not four), several steps each, and padding slots.
@pytest.mark.parametrize("states,batch", [(4, 1), (4, 3), (20, 3), (61, 1)])
def test_log_likelihoods_and_cotangents_match_the_jax_kernel(states, batch):
    taxa, sites = SMALL[1], (40 if states == 61 else SMALL[2])
    inputs = kernel_inputs(MODELS[states], taxa, sites, batch, jnp.float64, seed=states, max_width=2)
    transition, pi, w, codes, table, schedule = inputs
    assert transition.shape[-1] == states and transition.shape[0] == batch
    g = jnp.asarray(np.random.default_rng(states + batch).normal(size=(batch, codes.shape[1])))
    reference, cotangents = jax_kernel(transition, pi, w, codes, table, schedule, g)
    check_against(reference, cotangents, *inputs, g, TOLERANCE[jnp.float64])
    single = [x.astype(jnp.float32) for x in (transition, pi, w)]
    check_against(reference, cotangents, *single, codes, table.astype(jnp.float32), schedule, g.astype(jnp.float32),
                  TOLERANCE[jnp.float32])


def test_many_blocks_of_patterns_and_threads():
    """1,500 patterns (blocks of at most 128, split over threads where there is more than one CPU) give what
    the same patterns give in pieces of one block each (checked against the JAX kernel above)."""
    transition, pi, w, codes, table, schedule = kernel_inputs(*SMALL[:2], 1500, 1, jnp.float64, seed=9, max_width=2)
    patterns = codes.shape[1]
    assert patterns > 1200
    g = jnp.asarray(np.random.default_rng(9).normal(size=(1, patterns)))
    pieces = np.array_split(np.arange(patterns), 13)

    whole = kernels.cpu.log_likelihoods(transition, codes, table, schedule, pi, w)
    parts = [kernels.cpu.log_likelihoods(transition, codes[:, k], table, schedule, pi, w) for k in pieces]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)

    def stored(codes, g):
        partials = kernels.cpu.post_order(transition, codes, table, schedule, pi, w)[1]
        d_transition, d_pi, d_w, d_tips = kernels.cpu.pre_order_cotangents(
            transition, codes, table, schedule, pi, w, partials, g)
        return d_transition, d_pi, d_w, table_cotangent(d_tips, codes, table)

    def recomputed(codes, g):
        return kernels.cpu.cotangents(transition, codes, table, schedule, pi, w, g)

    for cotangents in (stored, recomputed):
        total = cotangents(codes, g)
        summed = [sum(x) for x in zip(*(cotangents(codes[:, k], g[:, k]) for k in pieces))]
        for a, b in zip(total, summed):
            close(a, b, 1e-13)


def test_custom_vjps_give_the_cotangents():
    """`pattern_log_likelihoods` (recomputing) and `pattern_log_likelihoods_stored` under `jax.grad`, batch of 3."""
    transition, pi, w, codes, table, schedule = kernel_inputs(*SMALL[:3], 3, jnp.float64, seed=4, max_width=2)
    weights = jnp.asarray(np.random.default_rng(0).integers(1, 4, codes.shape[1]), jnp.float64)
    value = jnp.sum(weights * kernels.cpu.log_likelihoods(transition, codes, table, schedule, pi, w), axis=1)
    expected = kernels.cpu.cotangents(transition, codes, table, schedule, pi, w, jnp.tile(weights, (3, 1)))
    for kernel in (kernels.cpu.pattern_log_likelihoods, kernels.cpu.pattern_log_likelihoods_stored):
        f = jax.jit(jax.value_and_grad(lambda t, p, c, x: jnp.sum(weights * kernel(t, p, c, codes, x, schedule)),
                                       argnums=(0, 1, 2, 3)))
        ours_value, ours = f(transition, pi, w, table)
        assert float(ours_value) == pytest.approx(float(jnp.sum(value)), rel=1e-14)
        for a, b in zip(ours, expected):
            close(a, b, 1e-13)


def test_vmap_over_parameter_sets():
    transition, pi, w, codes, table, schedule = kernel_inputs(*SMALL[:3], 1, jnp.float64, seed=4, max_width=2)
    scaled = jnp.stack([transition, transition ** 1.5 / jnp.sum(transition ** 1.5, axis=-1, keepdims=True)])

    def f(t):
        return jnp.sum(kernels.cpu.pattern_log_likelihoods(t, pi, w, codes, table, schedule))

    values, grads = jax.jit(jax.vmap(jax.value_and_grad(f)))(scaled)
    for k in range(2):
        value, grad = jax.value_and_grad(f)(scaled[k])
        assert float(values[k]) == pytest.approx(float(value), rel=1e-14)
        close(grads[k], grad, 1e-14)


def test_two_thousand_taxa_stay_finite():
    """Without rescaling, variable patterns would underflow (log L_c below -745); with it, all finite and equal."""
    transition, pi, w, codes, table, schedule = kernel_inputs(
        "HKY{2.0}+F{.3,.2,.2,.3}+G4{0.5}", 2000, 40, 1, jnp.float64, seed=11, max_width=256)
    ours = kernels.cpu.log_likelihoods(transition, codes, table, schedule, pi, w)
    assert np.all(np.isfinite(ours)) and np.min(np.asarray(ours)) < -745
    close(kernels.cpu.post_order(transition, codes, table, schedule, pi, w)[0], ours, 1e-15)
    g = jnp.ones_like(ours)
    d_transition, d_pi, d_w, d_table = kernels.cpu.cotangents(transition, codes, table, schedule, pi, w, g)
    for x in (d_transition, d_pi, d_w, d_table):
        assert np.all(np.isfinite(x))
    # d log L / d w_c summed with w_c is the number of patterns (log L is homogeneous of degree 1 in w).
    assert float(jnp.sum(d_w * w)) == pytest.approx(codes.shape[1], rel=1e-10)


def test_bad_schedules_are_errors_not_crashes():
    transition, pi, w, codes, table, schedule = kernel_inputs(*SMALL[:3], 1, jnp.float64, seed=4, max_width=2)
    bad_root = jax.tree_util.tree_map(lambda x: x, schedule)
    object.__setattr__(bad_root, "root_row", jnp.full_like(schedule.root_row, schedule.num_slots))
    with pytest.raises(Exception, match="root_row is out of range"):
        jax.block_until_ready(kernels.cpu.log_likelihoods(transition, codes, table, bad_root, pi, w))
    bad_codes = codes.at[0, 0].set(table.shape[0])
    with pytest.raises(Exception, match="tip code is outside"):
        jax.block_until_ready(kernels.cpu.post_order(transition, bad_codes, table, schedule, pi, w))
