"""Likelihood behaviour: brute force, models, schedules and compilation, rescaling."""

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import jaxphylo as jp
from conftest import internal_state_terms, iqtree_log_likelihood, write_fasta


def brute_force_log_likelihood(alignment, tree, model):
    total = sum(term for _, term in internal_state_terms(alignment, tree, model))
    return float(np.sum(alignment.site_patterns().weights * np.log(total)))


@pytest.mark.parametrize("newick", [
    "((A:0.1,B:0.25):0.05,(C:0.3,D:0.12):0.2);",        # rooted
    "((A:0.1,B:0.25):0.05,C:0.3,D:0.12);",             # unrooted: trifurcating root
    "(A:0.1,B:0.25,C:0.3,D:0.12,E:0.07);",             # a star: polytomy resolved internally
])
@pytest.mark.parametrize("model", ["HKY{3.0}+F{0.1,0.2,0.3,0.4}+G4{0.4}", "GTR{1,2,3,4,5}+F{.4,.3,.2,.1}+I{0.3}"])
def test_matches_brute_force_enumeration(newick, model):
    tree = jp.parse_newick(newick)
    truth = jp.parse_model(model)
    alignment = jp.simulate(tree, truth, 60, seed=1, missing=0.1)
    expected = brute_force_log_likelihood(alignment, tree, truth)
    assert float(jp.log_likelihood(alignment, tree, truth)) == pytest.approx(expected, rel=1e-12, abs=1e-10)


@pytest.mark.parametrize("model", ["GTR{1.2,3.4,0.8,1.1,4.0}+F{0.3,0.2,0.2,0.3}", "WAG", "GY{2,0.4}+FQ"])
def test_transition_matrices_match_scipy_expm(model):
    parsed = jp.parse_model(model + "+G4{0.6}")
    q = np.asarray(parsed.substitution.rate_matrix())
    pi = np.asarray(parsed.frequencies)
    assert np.allclose(q.sum(axis=1), 0, atol=1e-12)
    assert np.allclose(pi @ q, 0, atol=1e-12)  # stationary
    assert -np.sum(pi * np.diag(q)) == pytest.approx(1.0)  # one substitution per unit time
    rates, _ = parsed.rate_categories()
    p = np.asarray(parsed.transition_matrices(jnp.array([0.0, 0.05, 0.7])))
    for b, t in enumerate([0.0, 0.05, 0.7]):
        for c, r in enumerate(np.asarray(rates)):
            np.testing.assert_allclose(p[b, c], scipy.linalg.expm(q * r * t), atol=1e-12)


@pytest.mark.parametrize("shape", [0.05, 0.3, 1.0, 7.0, 200.0])
def test_discrete_gamma_mean_rates_and_their_derivative(shape):
    rates, weights = jp.models.DiscreteGamma(jnp.asarray(shape), 4).categories()
    assert float(jnp.sum(rates * weights)) == pytest.approx(1.0)
    assert np.all(np.diff(np.asarray(rates)) > 0)
    # Yang (1994) Table 1 style check: alpha = 1 has closed-form boundaries -log(1 - i/4)
    if shape == 1.0:
        b = -np.log(1 - np.arange(1, 4) / 4)
        cdf = np.concatenate([[0], 1 - np.exp(-b) * (1 + b), [1]])
        np.testing.assert_allclose(rates, 4 * np.diff(cdf), rtol=1e-12)
    derivative = jax.jacfwd(lambda a: jp.models.DiscreteGamma(a, 4).categories()[0])(jnp.asarray(shape))
    h = 1e-6 * shape
    central = (np.asarray(jp.models.DiscreteGamma(jnp.asarray(shape + h), 4).categories()[0])
               - np.asarray(jp.models.DiscreteGamma(jnp.asarray(shape - h), 4).categories()[0])) / (2 * h)
    np.testing.assert_allclose(derivative, central, rtol=1e-6, atol=1e-12)
    assert jax.vmap(lambda a: jp.models.DiscreteGamma(a, 4).categories()[0])(jnp.array([0.5, 2.0])).shape == (2, 4)


@pytest.mark.parametrize("string,message", [
    ("XYZ", "unknown substitution model 'XYZ'"),
    ("GTR{1,2}", "GTR takes 5 or 6 values, got 2"),
    ("HKY{-1}", "HKY85 rate must be positive"),
    ("HKY+F{0.5,0.5,0.5,0.5}", "frequencies must be >= 0 and sum to 1"),
    ("HKY+F{0.5,0.5}", r"\+F needs 4 frequencies, got 2"),
    ("HKY+G4{0}", "Gamma shape must be positive"),
    ("HKY+I{1.5}", r"\+I takes one proportion in \[0, 1\)"),
    ("HKY+G4{1}+R2", "only one of"),
    ("HKY+Q", r"unknown term '\+Q'"),
    ("HKY{2", "unbalanced braces"),
    ("HKY++G", "empty term"),
    ("GTR+F", "need the alignment"),
    ("GY{kappa=2,omegax=1}", "unknown parameter 'omegax'"),
    ("HKY{abc}", "'abc' in 'HKY{abc}' is not a number"),
])
def test_invalid_model_strings(string, message):
    with pytest.raises(jp.ModelError, match=message):
        jp.parse_model(string)


def test_model_must_match_alignment_type():
    tree = jp.parse_newick("((A:0.1,B:0.2):0.1,C:0.3);")
    dna = jp.simulate(tree, jp.parse_model("JC"), 20)
    with pytest.raises(jp.ModelError, match="is for protein data"):
        jp.parse_model("LG", alignment=dna)
    with pytest.raises(jp.ModelError, match="the model is for protein data but the alignment is dna"):
        jp.log_likelihood(dna, tree, jp.parse_model("LG"))


def test_models_are_pytrees_with_float_leaves():
    model = jp.parse_model("GTR{1,2,3,4,5}+F{.1,.2,.3,.4}+I{0.2}+G4{0.5}")
    leaves = jax.tree_util.tree_leaves(model)
    assert len(leaves) == 4 and all(jnp.issubdtype(x.dtype, jnp.floating) for x in leaves)
    tree = jp.parse_newick("((A:0.1,B:0.2):0.1,C:0.3);")
    assert [x.shape for x in jax.tree_util.tree_leaves(tree)] == [(5,)]


def test_twenty_topologies_share_one_compilation():
    taxa = [f"t{i}" for i in range(64)]
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    alignment = jp.simulate(jp.random_topology_tree(taxa, seed=0), model, 200, seed=0)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    values = []
    for seed in range(20):
        tree = jp.random_topology_tree(taxa, seed=seed)
        values.append(float(jp.log_likelihood(alignment, tree, model)))
    # the first call compiles the kernel (and a few small helper ops); the other 19 reuse it
    first = len(compiles)
    assert len(set(jp.build_schedule(jp.random_topology_tree(taxa, seed=s).topology).steps.tobytes()
                   for s in range(20))) > 1, "topologies should differ in their level structure"
    assert len(np.unique(values)) == 20
    assert first <= 3, compiles
    compiles.clear()
    for seed in range(20, 25):
        jp.log_likelihood(alignment, jp.random_topology_tree(taxa, seed=seed), model)
    assert compiles == []


@pytest.mark.parametrize("max_width", [None, 8])
def test_schedule_covers_every_internal_node_once(max_width):
    for shape in ["random", "caterpillar"]:
        taxa = [f"t{i}" for i in range(300)]
        if shape == "random":
            topology = jp.random_topology_tree(taxa, seed=3).topology
        else:
            parent = [300 + max(i - 1, 0) for i in range(300)] + [300 + i + 1 for i in range(298)] + [-1]
            topology = jp.Topology(tuple(parent), tuple(taxa))
        schedule = jp.build_schedule(topology, max_width)
        assert schedule.widths[0] <= (max_width or 256)
        used = []
        for j, width in enumerate(schedule.widths):
            start = schedule.offsets[j]
            used.extend(schedule.nodes[start:start + schedule.steps[j] * width])
        real = [n for n in used if n != schedule.sentinel]
        assert sorted(real) == list(range(300, 599))
        assert len(used) <= 2 * 299 + schedule.widths[0]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_ten_thousand_taxa_stay_finite_and_match_iqtree(precision, tmp_path):
    """Without rescaling, partials of 10,000 taxa underflow even float64."""
    taxa = [f"t{i}" for i in range(10_000)]
    tree = jp.random_topology_tree(taxa, seed=1, mean_branch_length=0.05)
    string = "HKY{2}+F{.3,.2,.2,.3}+G4{0.5}"
    model = jp.parse_model(string)
    alignment = jp.simulate(tree, model, 100, seed=2)
    value = float(jp.log_likelihood(alignment, tree, model, precision=precision))
    assert np.isfinite(value)
    jp.write_tree(tree, tmp_path / "tree.nwk")
    reference = iqtree_log_likelihood(write_fasta(alignment, tmp_path / "aln.fasta"), tmp_path / "tree.nwk",
                                      string, tmp_path)
    # float64: the reference tolerance; float32: the promised 1e-3 relative
    tolerance = max(1e-3, 1e-7 * abs(reference)) if precision == "float64" else 1e-3 * abs(reference)
    assert abs(value - reference) < tolerance, (value, reference)
