"""The Pallas post-order and pre-order steps (Triton on a GPU) against the XLA steps, in interpret mode.

On a CPU Pallas interprets the kernels with the same indexing and arithmetic,
so these tests cover the kernels' logic where CI runs; the device benchmark
(`benchmarks/pallas_probe.py`) checks them compiled on the H100. Both paths do
the same float64 operations in nearly the same order, so values agree to
rounding (1e-12 relative) and gradients to 1e-10 relative.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.tree import device_schedule, phase_widths
from jaxphylo.likelihood import kernels
from jaxphylo.likelihood import PatternData, batch_layout_lengths, model_arrays


def _problem(taxa=7, patterns=200, trees=2, model="HKY{2.5}+F{0.3,0.2,0.2,0.3}+G2{0.7}", seed=0, **options):
    """A batch of random topologies over the same taxa, random data with ambiguity codes and gaps."""
    rng = np.random.default_rng(seed)
    names = [f"t{i}" for i in range(taxa)]
    batch = jp.TreeBatch.from_trees([jp.random_topology_tree(names, seed=seed + b, mean_branch_length=0.2)
                                     for b in range(trees)])
    model = jp.parse_model(model, **options)
    s = model.alphabet.num_states
    ambiguous = np.zeros((2, s))
    ambiguous[0, ::2], ambiguous[1, 1::2] = 1, 1  # for nucleotides R and Y
    table = np.vstack([np.eye(s), ambiguous, np.ones((1, s))])  # states, two ambiguity codes, gap/all-ones
    codes = np.vstack([rng.integers(0, s + 3, (taxa, patterns)), np.full((1, patterns), s + 2)]).astype(np.int32)
    data = PatternData(jnp.asarray(codes), jnp.asarray(table), jnp.asarray(rng.integers(1, 5, patterns) * 1.0))
    schedule = device_schedule(batch.parents, phase_widths(taxa, 2))  # narrow steps: several per level
    arrays = model_arrays(model, batch_layout_lengths(batch.branch_lengths, schedule), jnp.float64)
    return arrays + (data.tip_codes, data.tip_table), data.weights, schedule


def _total(kernel: str, monkeypatch):
    monkeypatch.setenv(kernels.KERNEL_ENV, kernel)

    def total(transition, pi, w, codes, table, weights, schedule):
        per = kernels.pattern_log_likelihoods(transition, pi, w, codes, table, schedule)
        return jnp.sum(per * weights)

    return jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2)))  # a new function: traced afresh per kernel


def test_pallas_passes_equal_xla_passes(monkeypatch):
    """Value and gradient; 200 patterns make a whole tile and a padded one (interpret mode is slow: small)."""
    arrays, weights, schedule = _problem()
    value, grads = _total("xla", monkeypatch)(*arrays, weights, schedule)
    pallas_value, pallas_grads = _total("pallas", monkeypatch)(*arrays, weights, schedule)
    np.testing.assert_allclose(pallas_value, value, rtol=1e-12)
    for got, want in zip(pallas_grads, grads):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(want))))


def test_pallas_post_order_equals_xla_rows(monkeypatch):
    """Every partials row and log scale factor, not just their sum (the other callers read rows)."""
    arrays, _, schedule = _problem(taxa=6, patterns=130, trees=1, model="GTR{1,2,1,1,3}+FQ+I{0.2}+G2{0.4}")
    transition, _, _, codes, table = arrays
    want = kernels.xla.post_order_partials(transition, codes, table, schedule)
    got = kernels.pallas.post_order_partials(transition, codes, table, schedule)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("model, options", [("LG+G2{0.5}", {}), ("GY{kappa=2,omega=0.3}+FQ+G2{0.5}", {"genetic_code": 1})],
                         ids=["amino-acids", "codons"])
def test_pallas_blocks_equal_xla_passes(model, options, monkeypatch):
    """Amino acids (padded to 32 states, 64-pattern tiles) and codons (64 states, 32-pattern tiles) take the
    matrix-product kernels: value, gradient and every partials row; 40 patterns make one padded tile."""
    arrays, weights, schedule = _problem(taxa=5, patterns=40, model=model, **options)
    value, grads = _total("xla", monkeypatch)(*arrays, weights, schedule)
    pallas_value, pallas_grads = _total("pallas", monkeypatch)(*arrays, weights, schedule)
    np.testing.assert_allclose(pallas_value, value, rtol=1e-12)
    for got, want in zip(pallas_grads, grads):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(want))))
    transition, _, _, codes, table = arrays
    for got, want in zip(kernels.pallas.post_order_partials(transition, codes, table, schedule),
                         kernels.xla.post_order_partials(transition, codes, table, schedule)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_kernel_choice(monkeypatch):
    """XLA unless `JAXPHYLO_KERNEL=pallas`; a misspelt choice is an error naming the variable."""
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    assert not kernels.pallas_wanted(4)
    monkeypatch.setenv(kernels.KERNEL_ENV, "pallas")
    assert kernels.pallas_wanted(4) and kernels.pallas_wanted(61) and kernels.pallas.blocked(20) and not kernels.pallas.blocked(4)
    monkeypatch.setenv(kernels.KERNEL_ENV, "trition")
    with pytest.raises(jp.InputError, match="JAXPHYLO_KERNEL='trition'"):
        kernels.pallas_wanted(4)


def test_update_kernel_choice(monkeypatch):
    """The operation-list kernel: C++ on a CPU, the Pallas walk by default on a GPU for nucleotides (XLA for
    larger state spaces, or when `JAXPHYLO_KERNEL=xla`), the XLA loop elsewhere."""
    monkeypatch.delenv(kernels.KERNEL_ENV, raising=False)
    monkeypatch.setattr(kernels._choice, "cpu_wanted", lambda: False)
    assert kernels.update_backend(4) == "xla"  # a CPU without the C++ kernel
    monkeypatch.setattr(kernels._choice.jax, "default_backend", lambda: "gpu")
    assert [kernels.update_backend(s) for s in (4, 20, 61)] == ["pallas", "xla", "xla"]
    # Fused length blocks for data one program per chain covers quickly: DS1 (934 patterns, JC), not carnivores.
    assert kernels.fuses_generations(4, 934, 1) and not kernels.fuses_generations(4, 5565, 4)
    assert not kernels.fuses_generations(20, 100, 1)
    monkeypatch.setenv(kernels.KERNEL_ENV, "xla")
    assert kernels.update_backend(4) == "xla"
    monkeypatch.setenv(kernels.KERNEL_ENV, "Pallas")
    assert kernels.update_backend(4) == "pallas"
    monkeypatch.setenv(kernels.UPDATE_ENV, "levels")
    assert [kernels.update_backend(s) for s in (4, 20)] == ["levels", "xla"]
    monkeypatch.setenv(kernels.UPDATE_ENV, "level")
    with pytest.raises(jp.InputError, match="JAXPHYLO_UPDATE='level'"):
        kernels.update_backend(4)


def test_pallas_walk_equals_steps(monkeypatch):
    """Small trees walk every node in one launch per pass; it must give the steps' value and gradient."""
    arrays, weights, schedule = _problem(taxa=5, patterns=130, trees=1, model="HKY{2.5}+F{0.3,0.2,0.2,0.3}")
    monkeypatch.setattr(kernels.pallas, "WALK_MAX_TIPS", 0)
    steps = _total("pallas", monkeypatch)(*arrays, weights, schedule)
    monkeypatch.setattr(kernels.pallas, "WALK_MAX_TIPS", 64)
    walked = _total("pallas", monkeypatch)(*arrays, weights, schedule)
    np.testing.assert_allclose(walked[0], steps[0], rtol=1e-12)
    for got, want in zip(walked[1], steps[1]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(want))))


def test_vmap_over_chains_equals_xla(monkeypatch):
    """`vmap` (NUTS's vectorised chains) through the kernels, with the tips' data shared and mapped, equals the
    XLA passes under the same `vmap`. (Folding the mapped axis into the kernels' tree axis with `custom_vmap`
    instead of Pallas's batching rule was tried: NUTS on an H100 took 4.10 ms per gradient step either way.)"""
    arrays, weights, schedule = _problem(taxa=4, patterns=60, trees=1, model="HKY{2.5}+F{0.3,0.2,0.2,0.3}")
    transition, pi, w, codes, table = arrays
    chains = jnp.stack([transition, transition ** 1.1])  # two chains' matrices
    for table_axis, tables in ((None, table), (0, jnp.stack([table, table * 0.5]))):
        results = []
        for kernel in ("xla", "pallas"):
            total = _total(kernel, monkeypatch)
            mapped = jax.vmap(lambda t, tab: total(t, pi, w, codes, tab, weights, schedule), in_axes=(0, table_axis))
            results.append(mapped(chains, tables))
        (value, grads), (pallas_value, pallas_grads) = results
        np.testing.assert_allclose(pallas_value, value, rtol=1e-12)
        for got, want in zip(pallas_grads, grads):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(want))))
