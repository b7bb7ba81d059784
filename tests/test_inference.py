"""NumPyro building blocks: the alignment distribution, the ratio transform, tree and branch priors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.integrate
import scipy.stats
from numpyro.infer.util import initialize_model, potential_energy

import jaxphylo as jp
from jaxphylo.inference import (
    Analysis, BirthDeath, ConstantCoalescent, GammaDirichlet, PhyloCTMC, Skygrid, Yule, heights_to_ratios,
    prepare, ratio_log_jacobian, ratios_to_heights, time_tree,
)
from jaxphylo.tree import all_heights


def dated_tree(num_tips=9, seed=1):
    """A random rooted tree whose tips are sampled at different times, heights consistent with them."""
    rng = np.random.default_rng(seed)
    tree = jp.random_topology_tree([f"t{i}" for i in range(num_tips)], seed=seed)
    tips = rng.uniform(0, 3, num_tips)
    tips[0] = 0.0
    time = time_tree(tree.topology, tips)
    heights = ratios_to_heights(time, jnp.asarray(1.5), jnp.asarray(rng.uniform(0.2, 0.8, time.num_internal - 1)))
    return time, heights


def test_distribution_log_prob_is_the_likelihood():
    alignment = jp.read_alignment("jaxphylo/examples/example.fasta")
    tree = jp.read_tree("jaxphylo/examples/example.nwk")
    model = jp.parse_model("HKY{3}+F+G4{0.7}", alignment=alignment)
    expected = float(jp.log_likelihood(alignment, tree, model))
    ctmc = PhyloCTMC(tree, model)
    assert float(ctmc.log_prob(alignment)) == pytest.approx(expected, abs=1e-9)
    uncompressed = jp.inference.pattern_data(alignment, tree, compress=False)
    assert float(ctmc.log_prob(uncompressed)) == pytest.approx(expected, abs=1e-8)
    with pytest.raises(jp.JaxphyloError, match="observes an Alignment"):
        ctmc.log_prob(np.zeros(3))


def caterpillar(num_tips=11, seed=5):
    """The deepest tree: every pointer-jumping round is needed."""
    newick = "t0:1"
    for i in range(1, num_tips):
        newick = f"({newick},t{i}:1):1"
    rng = np.random.default_rng(seed)
    topology = jp.parse_newick(newick + ";").topology
    time = time_tree(topology, rng.uniform(0, 2, num_tips))
    return time, ratios_to_heights(time, jnp.asarray(0.7), jnp.asarray(rng.uniform(0.1, 0.9, time.num_internal - 1)))


@pytest.mark.parametrize("shape", [dated_tree, caterpillar])
def test_ratio_transform_round_trip_and_jacobian(shape):
    time, heights = shape()
    offset, ratios = heights_to_ratios(time, heights)
    assert np.all((ratios > 0) & (ratios < 1)) and offset > 0
    np.testing.assert_allclose(ratios_to_heights(time, offset, ratios), heights, rtol=1e-12)
    h = all_heights(time, heights)
    parent = time.topology.parent_array
    assert np.all(h[parent[:-1]] > h[:-1])  # ordered
    for node in range(time.num_tips, time.topology.num_nodes - 1):  # the recursion, one node at a time
        k = node - time.num_tips
        expected = time.anchors[k] + ratios[k] * (h[parent[node]] - time.anchors[k])
        assert float(h[node]) == pytest.approx(float(expected), rel=1e-12)
    forward = lambda v: ratios_to_heights(time, v[-1], v[:-1])
    jacobian = jax.jacfwd(forward)(jnp.append(ratios, offset))
    _, log_det = jnp.linalg.slogdet(jacobian)
    assert float(ratio_log_jacobian(time, heights)) == pytest.approx(float(log_det), abs=1e-10)


def test_numpyro_transform_includes_the_logit_and_log_terms():
    time, heights = dated_tree(7, seed=3)
    bijection = numpyro.distributions.transforms.biject_to(jp.inference.NodeHeights(time))
    x = bijection.inv(heights)
    np.testing.assert_allclose(bijection(x), heights, rtol=1e-12)
    _, log_det = jnp.linalg.slogdet(jax.jacfwd(bijection)(x))
    assert float(bijection.log_abs_det_jacobian(x, heights)) == pytest.approx(float(log_det), abs=1e-10)


def brute_force_coalescent(tip_heights, heights, size_at, breaks=()):
    """Walk back in time through every event, one at a time."""
    events = sorted([(t, +1) for t in tip_heights] + [(h, -1) for h in heights])
    log_p, lineages = 0.0, 0
    for (t, change), (t_next, _) in zip(events, events[1:] + [(None, None)]):
        lineages += change
        if change < 0:
            log_p -= math.log(size_at(t))
        if t_next is not None and lineages > 1:
            # integrate C(k,2)/theta(t) over (t, t_next], split where the piecewise-constant theta changes
            grid = np.array(sorted({t, t_next} | {b for b in breaks if t < b < t_next}))
            mids = (grid[1:] + grid[:-1]) / 2
            log_p -= lineages * (lineages - 1) / 2 * sum(np.diff(grid) / np.array([size_at(m) for m in mids]))
    return log_p


def test_constant_coalescent_against_brute_force():
    time, heights = dated_tree()
    expected = brute_force_coalescent(time.tip_heights, np.asarray(heights), lambda t: 0.7)
    assert float(ConstantCoalescent(time, 0.7).log_prob(heights)) == pytest.approx(expected, rel=1e-10)


def test_skygrid_against_brute_force_and_the_constant_case():
    time, heights = dated_tree()
    sizes = jnp.log(jnp.array([0.5, 1.0, 2.0, 0.8]))
    cutoff = float(heights[-1]) * 0.9
    grid = np.arange(1, 4) * cutoff / 3
    size_at = lambda t: float(jnp.exp(sizes[np.searchsorted(grid, t, side="right")]))
    expected = brute_force_coalescent(time.tip_heights, np.asarray(heights), size_at, grid)
    assert float(Skygrid(time, sizes, cutoff).log_prob(heights)) == pytest.approx(expected, rel=1e-12)
    flat = Skygrid(time, jnp.full(4, jnp.log(0.7)), cutoff).log_prob(heights)
    assert float(flat) == pytest.approx(float(ConstantCoalescent(time, 0.7).log_prob(heights)), rel=1e-12)


@pytest.mark.parametrize("birth, death, rho", [(2.0, 0.0, 1.0), (2.0, 1.5, 1.0), (1.0, 0.3, 0.2)])
def test_birth_death_density_is_normalised_over_labelled_histories(birth, death, rho):
    """Three tips: a labelled history's density integrated over its two node ages, times the three labelled
    histories (one per rooted topology), is one; the coalescent's (the same measure) too. The combinatorial
    factor 2^(n-1) / n! is what makes it one (with (n-1)! instead the sum is 3)."""
    time = time_tree(jp.parse_newick("((a:1,b:1):1,c:2);").topology)

    def total(prior):
        log_prob = jax.jit(lambda low, root: prior.log_prob(jnp.stack([low, root])))
        density = lambda low, root: math.exp(float(log_prob(low, root)))  # noqa: E731
        return 3 * scipy.integrate.dblquad(density, 0, np.inf, 0, lambda root: root, epsabs=1e-10)[0]

    assert total(BirthDeath(time, birth, death, rho)) == pytest.approx(1.0, abs=1e-7)
    assert total(ConstantCoalescent(time, 0.7)) == pytest.approx(1.0, abs=1e-7)


def test_yule_is_exponential_node_ages():
    """i.i.d. Exponential(lambda) node ages, each of the n! (n-1)! / 2^(n-1) labelled histories equally likely."""
    time, _ = dated_tree()
    contemporaneous = time_tree(time.topology)
    heights = ratios_to_heights(contemporaneous, jnp.asarray(2.0), jnp.full(contemporaneous.num_internal - 1, 0.6))
    n = contemporaneous.num_tips
    histories = math.lgamma(n + 1) + math.lgamma(n) - (n - 1) * math.log(2)
    expected = np.sum(scipy.stats.expon.logpdf(heights, scale=1 / 1.3)) + math.lgamma(n) - histories
    assert float(Yule(contemporaneous, 1.3).log_prob(heights)) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(jp.ModelError, match="contemporaneous"):
        Yule(time, 1.0)


def test_gamma_dirichlet_density_and_samples():
    prior = GammaDirichlet(5, shape=2.0, rate=4.0, concentration=1.5)
    b = jnp.array([0.1, 0.2, 0.05, 0.3, 0.15])
    total = float(b.sum())
    expected = (scipy.stats.gamma.logpdf(total, 2.0, scale=1 / 4.0)
                + scipy.stats.dirichlet.logpdf(np.asarray(b) / total, np.full(5, 1.5)) - 4 * math.log(total))
    assert float(prior.log_prob(b)) == pytest.approx(expected, rel=1e-12)
    draws = prior.sample(jax.random.PRNGKey(0), (20000,))
    assert float(draws.sum(-1).mean()) == pytest.approx(0.5, rel=0.03)


def potential_gradient_check(model, data, seed=0):
    """Gradient of the potential energy (unconstrained space) against central differences."""
    info = initialize_model(jax.random.PRNGKey(seed), model, model_args=(data,))
    params = info.param_info.z
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    energy = lambda v: potential_energy(model, (data,), {}, unravel(v))
    grad = jax.grad(energy)(flat)
    rng = np.random.default_rng(seed)
    for index in rng.choice(len(flat), size=min(8, len(flat)), replace=False):
        h = 1e-5
        step = jnp.zeros_like(flat).at[index].set(h)
        fd = (energy(flat + step) - energy(flat - step)) / (2 * h)
        # central differences: truncation ~h^2 |E'''| ~ 1e-10, round-off ~1e-16 |E| / h ~ 1e-8 at |E| ~ 1e3
        assert float(grad[index]) == pytest.approx(float(fd), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("clock, prior", [("strict", "coalescent"), ("relaxed", "skygrid")])
def test_time_tree_model_gradient(clock, prior):
    time, heights = dated_tree(8, seed=4)
    lengths = np.append(np.asarray(jp.inference.branch_durations(time, heights)[:-1]) * 0.05, 0.0)
    truth = jp.Tree(jnp.asarray(lengths), time.topology)
    alignment = jp.simulate(truth, jp.parse_model("HKY{3}+FQ"), 300, seed=2)
    dated = jp.Tree(jnp.asarray(np.asarray(jp.inference.branch_durations(time, heights))), time.topology)
    prepared = prepare(alignment, dated, Analysis("HKY+G4", clock=clock, tree_prior=prior), time.tip_heights)
    potential_gradient_check(prepared.model, prepared.data)


def test_unrooted_model_gradient_gamma_dirichlet():
    alignment = jp.read_alignment("jaxphylo/examples/example.fasta")
    tree = jp.read_tree("jaxphylo/examples/example.nwk")
    prepared = prepare(alignment, tree, Analysis("GTR+I+G4", tree_prior="gamma-dirichlet"))
    potential_gradient_check(prepared.model, prepared.data)


def test_user_model_with_the_distribution():
    """The pattern of the README: a hand-written NumPyro model around PhyloCTMC."""
    alignment = jp.read_alignment("jaxphylo/examples/example.fasta")
    tree = jp.read_tree("jaxphylo/examples/example.nwk")

    def model():
        lengths = numpyro.sample("lengths", dist.Exponential(10.0).expand([tree.topology.num_nodes]).to_event(1))
        kappa = numpyro.sample("kappa", dist.LogNormal(1.0, 1.0))
        substitution = jp.models.Model(jp.models.HKY85(kappa, jnp.full(4, 0.25)))
        numpyro.sample("alignment", PhyloCTMC(tree.with_branch_lengths(lengths.at[-1].set(0.0)), substitution),
                       obs=alignment)

    kernel = numpyro.infer.NUTS(model)
    mcmc = numpyro.infer.MCMC(kernel, num_warmup=30, num_samples=20, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1))
    assert np.isfinite(mcmc.get_samples()["kappa"]).all()


def test_estimated_parameters_and_model_string_errors():
    assert jp.models.estimated_parameters("HKY+G4") == {"exchangeabilities", "frequencies", "gamma_shape"}
    assert jp.models.estimated_parameters("HKY{2}+F+G4{0.5}") == frozenset()
    assert "frequencies" in jp.models.estimated_parameters("GTR+FO+I")
    with pytest.raises(jp.ModelError, match="does not apply"):
        Analysis("HKY", tree_prior="yule")
    with pytest.raises(jp.ModelError, match="clock"):
        Analysis("HKY", clock="random-local")


def test_tree_errors_for_time_trees(tmp_path):
    tree = jp.parse_newick("((a:1,b:1):1,(c:1,d:2):0.5);")
    alignment = jp.simulate(jp.parse_newick("((a:0.1,b:0.1):0.1,(c:0.1,d:0.1):0.1);"), jp.parse_model("JC"), 50)
    with pytest.raises(jp.InputError, match="not ultrametric: taxon"):
        prepare(alignment, tree, Analysis("JC", clock="strict"))
    with pytest.raises(jp.InputError, match="'e' has a date but is not in the tree"):
        jp.io.tip_heights({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, tree.taxa, "dates.tsv")
    with pytest.raises(jp.InputError, match="'d' of the tree has no date"):
        jp.io.tip_heights({"a": 1, "b": 2, "c": 3}, tree.taxa, "dates.tsv")
    bad = tmp_path / "dates.tsv"
    bad.write_text("taxon\tdate\na\t2001\nb\tlast year\n")
    with pytest.raises(jp.InputError, match="line 3: date 'last year' of 'b' is not a number"):
        jp.io.read_dates(bad)
    unrooted = jp.parse_newick("(a:1,b:1,(c:1,d:1):1);")
    with pytest.raises(jp.InputError, match="rooted"):
        prepare(alignment, unrooted, Analysis("JC", clock="strict"))
    assert jp.io.dates_from_names(["A/Brazil/1982", "x_1999.5"]) == {"A/Brazil/1982": 1982.0, "x_1999.5": 1999.5}
