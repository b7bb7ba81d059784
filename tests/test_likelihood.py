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
    ("HKY+G4m4", r"unknown term '\+G4m4'"),
    ("HKY+G4m{0.5,2}", r"\+G takes one shape value"),
    ("HKY+G0m", r"\+Gm needs at least one category"),
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


def _count_compilations():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    return compiles


def test_twenty_topologies_share_one_compilation():
    """Step counts are data: topologies of the same taxa differ in their level structure, not in their program."""
    taxa = [f"t{i}" for i in range(64)]
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    alignment = jp.simulate(jp.random_topology_tree(taxa, seed=0), model, 200, seed=0)
    trees = [jp.random_topology_tree(taxa, seed=seed) for seed in range(20)]
    jp.log_likelihood(alignment, jp.random_topology_tree(taxa, seed=99), model)  # compiles kernel and helpers
    compiles = _count_compilations()
    values = [float(jp.log_likelihood(alignment, tree, model)) for tree in trees]
    steps = {np.asarray(jp.build_schedule(tree.topology).steps).tobytes() for tree in trees}
    assert len(np.unique(values)) == 20
    assert len(steps) > 10, "topologies should differ in their level structure"
    assert compiles == []


def test_batches_of_trees_share_one_compilation_and_match_single_trees():
    """A `TreeBatch` of 4 random topologies per call, 5 calls: one compilation, values equal one-tree calls."""
    taxa = [f"t{i}" for i in range(40)]
    model = jp.parse_model("GTR{1,2,3,1.5,2.5}+F{.3,.2,.2,.3}+I{0.1}+G4{0.5}")
    alignment = jp.simulate(jp.random_topology_tree(taxa, seed=0), model, 150, seed=0, missing=0.05)
    trees = [jp.random_topology_tree(taxa, seed=s) for s in range(19)]
    trees.insert(3, jp.bionj(jp.distances(alignment, "jc69"), alignment.taxa))  # unrooted: a trifurcating root
    data = jp.likelihood.pattern_data(alignment, jp.TreeBatch.from_trees(trees[:1]))
    evaluate = jax.jit(lambda batch: jp.likelihood.batch_data_log_likelihoods(data, batch, model))
    evaluate(jp.TreeBatch.from_trees(trees[:4]))
    compiles = _count_compilations()
    values = np.concatenate([evaluate(jp.TreeBatch.from_trees(trees[i:i + 4])) for i in range(0, 20, 4)])
    assert compiles == []
    expected = [float(jp.log_likelihood(alignment, tree, model)) for tree in trees]
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    unrooted = jp.TreeBatch.from_trees(trees[3:4]).to_trees()[0]
    assert not unrooted.topology.rooted and len(unrooted.topology.children[-1]) == 3
    assert float(jp.log_likelihood(alignment, unrooted, model)) == pytest.approx(expected[3], rel=1e-12)


@pytest.mark.parametrize("max_width", [None, 8])
def test_schedule_covers_every_internal_node_once(max_width):
    """Every internal node gets one slot; children come from earlier steps; steps write contiguous rows."""
    for shape in ["random", "caterpillar"]:
        taxa = [f"t{i}" for i in range(300)]
        if shape == "random":
            topology = jp.random_topology_tree(taxa, seed=3).topology
        else:
            parent = [300 + max(i - 1, 0) for i in range(300)] + [300 + i + 1 for i in range(298)] + [-1]
            topology = jp.Topology(tuple(parent), tuple(taxa))
        schedule = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], jp.build_schedule(topology, max_width))
        assert schedule.widths[0] <= (max_width or 256)
        layout, slots = schedule.layout, len(schedule.children)
        done = set(range(300))  # layout ids ready: the tips
        for j, width in enumerate(schedule.widths):
            for i in range(schedule.steps[j]):
                block = range(schedule.offsets[j] + i * width, schedule.offsets[j] + (i + 1) * width)
                for row in block:
                    if layout[300 + row] < 599:
                        assert set(schedule.children[row]) <= done, "a child is computed before its parent"
                done |= {300 + row for row in block if layout[300 + row] < 599}
        real = sorted(int(layout[i]) for i in done if i >= 300)
        assert real == list(range(300, 599))
        assert layout[300 + schedule.root_row] == 598
        assert slots == 2 * 299 + schedule.widths[0]


@pytest.mark.parametrize("kernel", ["cpu", "jax"])
def test_trimmed_schedule_has_a_row_per_used_slot_and_the_same_likelihood(kernel, monkeypatch):
    """`trim_slots` (one known topology) keeps the used slots only; value and gradient are unchanged, with the
    C++ kernel and with the JAX kernels (a GPU's)."""
    from jaxphylo import tree as _schedule
    from jaxphylo.likelihood import kernels

    if kernel == "jax":
        monkeypatch.setattr(kernels.cpu, "available", lambda: False)
        jax.clear_caches()  # the jitted kernel choice is made when tracing
    from jaxphylo.likelihood import pattern_data, schedule_pattern_log_likelihoods
    from jaxphylo.likelihood.kernels import exact_steps
    from jaxphylo.tree import branch_index

    taxa = [f"t{i}" for i in range(200)]
    tree = jp.random_topology_tree(taxa, seed=4)
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    alignment = jp.simulate(tree, model, 300, seed=1)
    full = jp.build_schedule(tree.topology, 32)
    trimmed = _schedule.trim_slots(full)
    assert 199 <= trimmed.num_slots < full.num_slots
    assert int(trimmed.root_row[0]) < trimmed.num_slots
    data = pattern_data(alignment, tree)
    index = branch_index(tree.topology)

    def value_and_grad(schedule):
        total = lambda lengths: jnp.sum(data.weights * schedule_pattern_log_likelihoods(  # noqa: E731
            model, lengths, data, schedule, index, jnp.float64, exact_steps(schedule)))
        return jax.value_and_grad(total)(tree.branch_lengths)

    try:
        expected = value_and_grad(full)
        value, grad = value_and_grad(trimmed)
    finally:
        if kernel == "jax":
            jax.clear_caches()  # later tests get the C++ kernel again
    assert float(value) == pytest.approx(float(expected[0]), rel=1e-13)
    np.testing.assert_allclose(grad, expected[1], rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="one tree"):  # a batch's padded steps may reach past the used slots
        _schedule.trim_slots(_schedule.device_schedule(jp.TreeBatch.from_trees([tree, tree]).parents, full.widths))


def test_device_schedule_matches_for_a_relabelled_tree():
    """Internal node numbers are arbitrary in kernel parent arrays (as moves leave them): same likelihood."""
    taxa = [f"t{i}" for i in range(30)]
    tree = jp.random_topology_tree(taxa, seed=5)
    model = jp.parse_model("HKY{2}+F{.3,.2,.2,.3}+G4{0.5}")
    alignment = jp.simulate(tree, model, 100, seed=0)
    batch = jp.TreeBatch.from_trees([tree])
    rng = np.random.default_rng(0)
    perm = np.arange(59)
    perm[30:] = 30 + rng.permutation(29)
    parents = np.asarray(batch.parents[0])
    relabelled = np.full(59, -1)
    relabelled[perm] = np.where(parents >= 0, perm[np.maximum(parents, 0)], -1)
    lengths = np.zeros(59)
    lengths[perm] = np.asarray(batch.branch_lengths[0])
    shuffled = jp.TreeBatch(jnp.asarray(relabelled[None]), jnp.asarray(lengths[None]), batch.taxa)
    expected = float(jp.log_likelihood(alignment, tree, model))
    assert float(jp.log_likelihood(alignment, shuffled, model)[0]) == pytest.approx(expected, rel=1e-13)
    back = shuffled.to_trees(rooted=True)[0]
    assert float(jp.log_likelihood(alignment, back, model)) == pytest.approx(expected, rel=1e-13)


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


@pytest.mark.parametrize("string", ["WAG+G4{0.5}", "GY{2,0.4}+FQ+G4{0.5}"])
def test_every_product_runs_at_full_precision(string):
    """GPUs run DEFAULT-precision float32 products in TF32 (three digits lost for 20 and 61 states, issue #17):
    the lowered likelihood and gradient, model included, must carry no product below HIGHEST."""
    model = jp.parse_model(string, genetic_code=1) if string.startswith("GY") else jp.parse_model(string)
    tree = jp.random_topology_tree([f"t{i}" for i in range(6)], seed=0)
    data = jp.likelihood.pattern_data(jp.simulate(tree, model, 20, seed=0), tree)

    def total(lengths, model):
        return jp.likelihood.data_log_likelihood(data, tree.with_branch_lengths(lengths), model, precision="float32")

    text = jax.jit(jax.value_and_grad(total, argnums=(0, 1))).lower(tree.branch_lengths, model).as_text()
    products = [line for line in text.splitlines() if "dot_general" in line]
    assert len(products) >= 4  # transition matrices, peeling, the gradient contractions, the model's JVP
    assert all("precision = [HIGHEST, HIGHEST]" in line for line in products), [
        line for line in products if "HIGHEST" not in line][:3]
