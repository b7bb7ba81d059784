"""Gradients by the pre-order pass: finite differences, plain autodiff, jit/vmap, marginals, curvature."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import jaxphylo as jp
from conftest import internal_state_terms
from jaxphylo.likelihood import kernels
from jaxphylo.tree import branch_index
from jaxphylo.likelihood import kernel_arrays, layout_lengths, pattern_data

# Every parameter type of every model family, with +G, +I and +R.
MODELS = [
    "JC+G4{0.7}",  # degenerate eigenvalues: a plain eigh gradient would be NaN
    "K80{2.5}+I{0.2}",
    "F81+F{.1,.2,.3,.4}+R3{.2,.3,.5,1,.3,2}",
    "HKY{3.0}+F{.35,.15,.2,.3}+I{0.15}+G4{0.5}",
    "TN93{2,4}+F{.3,.2,.25,.25}+G4{1.3}",
    "GTR{1.2,3.4,0.8,1.1,4.0}+F{.3,.2,.2,.3}+I{0.1}+R2{.4,.6,.3,1.5}",
    "LG+G4{0.8}",
    "WAG+F{" + ",".join(["0.05"] * 20) + "}+I{0.1}+R2{.5,.5,.4,1.6}",
    "GY{2.0,0.3}+G4{0.9}",
    "GY{1.5,0.6}+I{0.1}",
]


def simulated(model_string, taxa=7, sites=120, seed=3):
    model = jp.parse_model(model_string)
    tree = jp.random_topology_tree([f"t{i}" for i in range(taxa)], seed=seed, mean_branch_length=0.15)
    return jp.simulate(tree, model, sites, seed=seed + 1, missing=0.05), tree, model


def objective(alignment, tree, model, method="preorder"):
    """log L as a function of one flat vector: every float leaf of the model, then branch lengths."""
    params, static = eqx.partition((model, tree.branch_lengths), eqx.is_inexact_array)
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def f(x):
        m, lengths = eqx.combine(unravel(x), static)
        return jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, lengths), m, method=method)

    return f, flat


def five_point(f, x, i):
    """Central differences to fourth order. Step 1e-4 * max(|x_i|, 0.1): truncation ~ h^4 f^(5) ~ 1e-15,
    round-off ~ 1.5 eps |log L| / h ~ 1e-9 for |log L| ~ 1e3, both far below the 1e-6 asked."""
    h = 1e-4 * max(abs(float(x[i])), 0.1)
    e = jnp.zeros_like(x).at[i].set(h)
    return float((f(x - 2 * e) - 8 * f(x - e) + 8 * f(x + e) - f(x + 2 * e)) / (12 * h))


@pytest.mark.parametrize("model_string", MODELS)
def test_gradient_matches_central_differences(model_string):
    alignment, tree, model = simulated(model_string, sites=60 if model_string.startswith("GY") else 120)
    f, x = objective(alignment, tree, model)
    gradient = np.asarray(jax.grad(f)(x))
    assert np.all(np.isfinite(gradient))
    # All branch lengths and scalar parameters; at most 8 coordinates of long frequency vectors.
    rng = np.random.default_rng(0)
    coordinates = [i for i in range(x.size) if rng.random() < 8 / 61 or x.size < 40 or i >= x.size - 13]
    for i in coordinates:
        numeric = five_point(f, x, i)
        assert abs(gradient[i] - numeric) <= 1e-6 * max(abs(numeric), 1.0), (i, gradient[i], numeric)


@pytest.mark.parametrize("model_string", MODELS[3:])
def test_gradient_matches_plain_autodiff(model_string):
    alignment, tree, model = simulated(model_string, taxa=12)
    f, x = objective(alignment, tree, model)
    g, _ = objective(alignment, tree, model, method="autodiff")
    assert float(f(x)) == pytest.approx(float(g(x)), rel=1e-13)
    ours, plain = np.asarray(jax.grad(f)(x)), np.asarray(jax.grad(g)(x))
    np.testing.assert_array_less(np.abs(ours - plain), 1e-9 * np.maximum(np.abs(plain), 1e-3) + 1e-300)


def test_kernel_cotangents_of_every_input_match_autodiff():
    """P, pi, category weights and the tip table: each cotangent of the custom VJP against autodiff."""
    alignment, tree, model = simulated("GTR{1,2,3,1.5,2.5}+F{.3,.2,.2,.3}+G4{0.5}", taxa=10)
    schedule = jp.build_schedule(tree.topology)
    lengths = layout_lengths(tree.branch_lengths, branch_index(tree.topology), schedule)
    transition, pi, weights, codes, table = kernel_arrays(model, lengths, pattern_data(alignment, tree), jnp.float64)
    codes, table = jnp.asarray(codes), jnp.asarray(table)
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=(1, codes.shape[1])))
    steps = tuple(int(k) for k in schedule.steps[0])

    def total(kernel, *args):
        return jnp.sum(cotangent * kernel(*args))

    ours = jax.grad(total, argnums=(1, 2, 3, 5))(kernels.pattern_log_likelihoods, transition, pi, weights, codes,
                                                  table, schedule)
    plain = jax.grad(total, argnums=(1, 2, 3, 5))(
        lambda *a: kernels.xla.pattern_log_likelihoods(*a, steps), transition, pi, weights, codes, table, schedule
    )
    # The sentinel's P (last layout id) is the identity the padding reads; only autodiff sees a slope there.
    ours, plain = (ours[0][:, :-1],) + ours[1:], (plain[0][:, :-1],) + plain[1:]
    for a, b in zip(ours, plain):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * float(jnp.max(jnp.abs(b))))
    # Without the table among the differentiated inputs its cotangent is skipped; the others are unchanged.
    without_table = jax.grad(total, argnums=(1, 2, 3))(kernels.pattern_log_likelihoods, transition, pi, weights,
                                                        codes, table, schedule)
    for a, b in zip((without_table[0][:, :-1],) + without_table[1:], ours[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=0)


def test_gradient_under_jit_and_vmap_over_parameter_sets():
    alignment, tree, model = simulated("HKY{2.0}+F{.3,.2,.2,.3}+G4{0.5}", taxa=9)

    def log_l(kappa, lengths):
        m = eqx.tree_at(lambda m: m.substitution.kappa, model, kappa)
        return jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, lengths), m)

    kappas = jnp.array([1.5, 2.0, 4.0])
    lengths = tree.branch_lengths[None] * jnp.array([0.5, 1.0, 2.0])[:, None]
    batched = jax.jit(jax.vmap(jax.grad(log_l, argnums=(0, 1))))(kappas, lengths)
    for b in range(3):
        one = jax.grad(log_l, argnums=(0, 1))(kappas[b], lengths[b])
        np.testing.assert_allclose(batched[0][b], one[0], rtol=1e-12)
        np.testing.assert_allclose(batched[1][b], one[1], rtol=1e-12, atol=1e-12)


def test_gradient_through_node_heights_and_a_clock_rate():
    """What a user composes on top: branch length = rate x (parent height - child height)."""
    alignment, tree, model = simulated("HKY{2.0}+G4{0.5}", taxa=6)
    parent = np.asarray(tree.topology.parent)
    tips = tree.num_tips

    def log_l(params):
        internal_heights, log_rate = params[:-1], params[-1]
        heights = jnp.concatenate([jnp.zeros(tips), internal_heights])
        lengths = jnp.where(parent >= 0, heights[np.maximum(parent, 0)] - heights, 0.0) * jnp.exp(log_rate)
        return jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, lengths), model)

    heights = np.zeros(tree.topology.num_nodes)
    for node in range(tips, tree.topology.num_nodes):  # children precede parents
        heights[node] = 0.1 + max(heights[c] for c in tree.topology.children[node])
    x = jnp.asarray(np.append(heights[tips:], np.log(0.8)))
    gradient = np.asarray(jax.grad(log_l)(x))
    for i in range(x.size):
        numeric = five_point(jax.jit(log_l), x, i)
        assert abs(gradient[i] - numeric) <= 1e-6 * max(abs(numeric), 1.0)


@pytest.mark.parametrize("newick", ["((A:0.1,B:0.25):0.05,(C:0.3,D:0.12):0.2);", "((A:0.1,B:0.25):0.05,C:0.3,D:0.12);"])
def test_ancestral_marginals_match_brute_force(newick):
    tree = jp.parse_newick(newick)
    model = jp.parse_model("HKY{3.0}+F{0.1,0.2,0.3,0.4}+I{0.2}+G4{0.4}")
    alignment = jp.simulate(tree, model, 40, seed=5, missing=0.1)
    marginals = np.asarray(jp.ancestral_marginals(alignment, tree, model))
    np.testing.assert_allclose(marginals.sum(axis=-1), 1.0, rtol=1e-12)

    patterns = alignment.site_patterns()
    internal = list(range(tree.num_tips, tree.topology.num_nodes))
    joint = np.zeros((len(internal), patterns.num_patterns, 4))
    for state, term in internal_state_terms(alignment, tree, model):
        for k, node in enumerate(internal):
            joint[k, :, state[node]] += term
    expected = (joint / joint.sum(axis=-1, keepdims=True))[:, patterns.site_pattern]
    np.testing.assert_allclose(marginals, expected, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("model_string", ["GTR{1.2,3.4,0.8,1.1,4.0}+F{.3,.2,.2,.3}+I{0.1}+G4{0.6}", "GY{2,0.4}+G4{0.7}"])
def test_branch_length_derivatives(model_string):
    """First derivatives equal jax.grad; second derivatives equal differences of the gradient."""
    alignment, tree, model = simulated(model_string, sites=60)

    @jax.jit
    def gradient(lengths):
        return jax.grad(lambda b: jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, b),
                                                    model))(lengths)

    first, second = (np.asarray(v) for v in jp.branch_length_derivatives(alignment, tree, model))
    lengths = tree.branch_lengths
    np.testing.assert_allclose(first, gradient(lengths), rtol=1e-10, atol=1e-10)
    root = tree.topology.root
    assert first[root] == 0 and second[root] == 0
    for i in range(tree.topology.num_nodes):
        if i == root:
            continue
        h = 1e-4 * float(lengths[i])
        e = jnp.zeros_like(lengths).at[i].set(h)
        g = lambda x: float(gradient(x)[i])
        numeric = (g(lengths - 2 * e) - 8 * g(lengths - e) + 8 * g(lengths + e) - g(lengths + 2 * e)) / (12 * h)
        assert abs(second[i] - numeric) <= 1e-6 * max(abs(numeric), 1.0), (i, second[i], numeric)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_ten_thousand_taxa_gradient_is_finite_and_right(precision):
    """Rescaled in both passes: finite, and a directional derivative agrees with differences."""
    tree = jp.random_topology_tree([f"t{i}" for i in range(10_000)], seed=1, mean_branch_length=0.05)
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    alignment = jp.simulate(tree, model, 100, seed=2)
    f = jax.jit(lambda b: jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, b), model,
                                            precision=precision))
    lengths = tree.branch_lengths
    gradient = np.asarray(jax.grad(f)(lengths))
    assert np.all(np.isfinite(gradient))
    direction = jnp.asarray(np.random.default_rng(0).normal(size=lengths.shape)) * lengths
    f64 = jax.jit(lambda b: jp.log_likelihood(alignment, eqx.tree_at(lambda t: t.branch_lengths, tree, b), model))
    h = 1e-4
    numeric = float((f64(lengths - 2 * h * direction) - 8 * f64(lengths - h * direction)
                     + 8 * f64(lengths + h * direction) - f64(lengths + 2 * h * direction)) / (12 * h))
    # float64: the 1e-6 of the other tests; float32: its 1e-3 promise for values carries to gradients here.
    tolerance = 1e-6 if precision == "float64" else 1e-3
    assert abs(gradient @ np.asarray(direction) - numeric) <= tolerance * abs(numeric)


def test_unknown_method_is_a_model_error():
    alignment, tree, model = simulated("JC", taxa=4, sites=10)
    with pytest.raises(jp.ModelError, match="method must be"):
        jp.log_likelihood(alignment, tree, model, method="finite")
