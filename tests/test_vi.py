"""Variational inference (`jaxphylo.inference.vi`): q(tree) is a distribution over all topologies, VIMCO's gradient
is unbiased, a short fit recovers a 5-taxon posterior over topologies, and the `vi` command (outputs, bad input,
resume to the same bytes).

The fit, the command and the resume check share one alignment and one training program (one compilation).
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import StopAfter

import jaxphylo as jp
from jaxphylo.cli import main
from jaxphylo.inference.vi import (
    TopologyModel,
    VISettings,
    all_choices,
    initial_fit_state,
    select,
    target_of,
    tip_coordinates,
    vi,
    vimco_surrogate,
)
from jaxphylo.runtime import Interrupted
from jaxphylo.tree import kernel_splits

TAXA = tuple(f"t{i}" for i in range(5))
# One training program for every test that trains (the block, particles, learning rate and widths shape it).
SETTINGS = {"particles": 10, "block": 100, "learning_rate": 3e-3, "topology_rate": 1.0, "width": 16, "depth": 2,
            "eval_batch": 100}


@pytest.fixture(scope="module")
def alignment():
    """50 sites of JC69 on 5 taxa: the posterior over topologies is spread (no split but one is certain)."""
    return jp.simulate(jp.random_topology_tree(TAXA, seed=1), jp.parse_model("JC"), 50, seed=1)


@pytest.fixture(scope="module")
def fasta(alignment, tmp_path_factory):
    path = tmp_path_factory.mktemp("vi") / "five.fasta"
    path.write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    return path


def topology_key(parent, taxa=TAXA):
    return frozenset(s for s in kernel_splits(np.asarray(parent), taxa) if s is not None)


@pytest.mark.parametrize("guided", [False, True], ids=["random", "distance-guided"])
def test_the_construction_gives_every_topology_once_and_probabilities_summing_to_one(guided):
    """ARTree's fixed insertion order: the 15 choice sequences of 5 taxa are the 15 unrooted topologies, and q over
    them sums to 1 (to rounding), for random network weights, and with tip embeddings from distances and a strong
    proximity weight (no tree gets probability zero)."""
    choices = all_choices(5)
    assert len(choices) == 15 and len(all_choices(6)) == 105
    tips = None
    if guided:
        points = np.random.default_rng(0).normal(size=(5, 3))
        distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
        tips = tip_coordinates(distances, 8)
        assert tips.shape == (5, 8) and np.mean(np.sum(tips ** 2, 1)) == pytest.approx(8, rel=0.1)
        tips = tips + 0.1 * np.asarray(jax.random.normal(jax.random.PRNGKey(2), tips.shape))
    q = TopologyModel(5, width=8, key=jax.random.PRNGKey(3), tips=tips, proximity=30.0 if guided else 0.0)
    parents, _, log_q = eqx.filter_jit(jax.vmap(lambda c: q.walk(5, choices=c)))(jnp.asarray(choices))
    assert len({topology_key(p) for p in np.asarray(parents)}) == 15
    probabilities = np.exp(np.asarray(log_q))
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    assert probabilities.min() > 0
    # the exploring proposal (a share of uniform insertion) is a distribution over the same sequences, and it
    # reports q's own probabilities beside its own
    _, _, log_q_again, log_r = eqx.filter_jit(jax.vmap(lambda c: q.explore(5, 0.3, choices=c)))(jnp.asarray(choices))
    np.testing.assert_allclose(np.asarray(log_q_again), np.asarray(log_q), atol=1e-12)
    assert np.exp(np.asarray(log_r)).sum() == pytest.approx(1.0, abs=1e-12) and np.exp(np.asarray(log_r)).min() > 0
    # a drawn tree follows one of those sequences, and its log q is the one the sequence gives
    _, picked, drawn = eqx.filter_jit(q.sample)(jax.random.PRNGKey(0), 5)
    assert tuple(np.asarray(picked).tolist()) in choices
    assert float(drawn) == pytest.approx(float(log_q[choices.index(tuple(np.asarray(picked).tolist()))]), abs=1e-12)


def test_vimco_gradient_is_unbiased_against_exact_enumeration():
    """4 taxa (3 topologies), a target over topologies alone, K = 3: the exact objective
    `L_3 = sum over the 27 triples of prod q(tree_i) log mean_i p(tree_i)/q(tree_i)` is differentiated by jax;
    the mean of 20,000 VIMCO estimates must agree along random directions within 4.5 Monte Carlo standard
    errors (a false alarm about 1e-5 per direction). Dropping the score term (a biased estimator) is caught."""
    q = TopologyModel(4, width=8, key=jax.random.PRNGKey(1))
    params, static = eqx.partition(q, eqx.is_inexact_array)
    choices = jnp.asarray(all_choices(4))
    log_p = jnp.array([0.0, -1.5, 0.7])
    k = 3

    def exact(params):
        model = eqx.combine(params, static)
        log_q = jax.vmap(lambda c: model.log_prob(c, 4))(choices)
        total = 0.0
        for triple in itertools.product(range(3), repeat=k):
            idx = jnp.asarray(triple)
            log_w = log_p[idx] - log_q[idx]
            total = total + jnp.exp(log_q[idx].sum()) * (jax.nn.logsumexp(log_w) - jnp.log(k))
        return total

    def estimate(params, key, score=True):
        model = eqx.combine(params, static)
        _, picked, log_q = jax.vmap(lambda kk: model.sample(kk, 4))(jax.random.split(key, k))
        index = jnp.argmax(jnp.all(picked[:, None, :] == choices[None], -1), 1)
        log_w = log_p[index] - log_q
        return vimco_surrogate(log_w, log_q if score else jax.lax.stop_gradient(log_q))

    flat = lambda tree: jnp.concatenate([x.ravel() for x in jax.tree.leaves(tree)])
    truth = flat(jax.jit(jax.grad(exact))(params))
    directions = jax.random.normal(jax.random.PRNGKey(7), (5, truth.size))
    keys = jax.random.split(jax.random.PRNGKey(11), 20_000)
    for score, unbiased in ((True, True), (False, False)):
        def projected(key, score=score):
            return directions @ flat(jax.grad(estimate)(params, key, score))

        draws = jax.jit(jax.vmap(projected))(keys)
        mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(keys))
        z = np.abs(np.asarray((mean - directions @ truth) / se))
        assert (np.all(z < 4.5) if unbiased else np.any(z > 10)), z


def exact_topology_posterior(target, particles=4000, seed=0):
    """`p(tree | y)` over the 15 topologies, by integrating the lengths: for each topology `p(y | tree)` =
    `int L p(t) dt` by 4,000 draws of importance sampling in log-lengths from a Gaussian at the posterior mode with
    1.5 times the Laplace standard deviations (the diagonal curvature, by central differences of the gradient),
    independent of q. Returns the posterior, the smallest effective sample fraction of a topology above 0.01, and
    `log p(y)`."""
    choices = all_choices(5)
    probe = TopologyModel(5, width=4, key=jax.random.PRNGKey(0))
    parents = eqx.filter_jit(jax.vmap(lambda c: probe.walk(5, choices=c)[0]))(jnp.asarray(choices))  # [15, 9]
    root_child = jnp.argmax((parents == 8) & (jnp.arange(9) != 0), 1)
    edges = (jnp.arange(9) != 8) & (jnp.arange(9) != root_child[:, None])

    def log_post(x, parents, edges):  # the posterior density of log-lengths (Jacobian included)
        lengths = jnp.where(edges, jnp.exp(x), 0.0)
        return (target.log_likelihoods(parents, lengths) + target.log_priors(lengths, edges)
                + jnp.where(edges, x, 0.0).sum(-1))

    grad = jax.jit(jax.grad(lambda x: log_post(x, parents, edges).sum()))

    def ascend(x):
        opt = optax.adam(0.05)
        state = opt.init(x)

        def body(_, carry):
            x, state = carry
            updates, state = opt.update(-grad(x), state)
            return optax.apply_updates(x, updates), state

        return jax.lax.fori_loop(0, 600, body, (x, state))[0]

    mode = jax.jit(ascend)(jnp.full((15, 9), jnp.log(0.1)))
    h = 1e-4
    curvature = jnp.stack([(grad(mode.at[:, j].add(h))[:, j] - grad(mode.at[:, j].add(-h))[:, j]) / (2 * h)
                           for j in range(9)], 1)
    scale = 1.5 / jnp.sqrt(jnp.maximum(-curvature, 1e-6))
    marginals, ess = [], []
    score = jax.jit(log_post)
    for i in range(15):
        eps = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), i), (particles, 9))
        x = mode[i] + scale[i] * eps
        log_q = jnp.where(edges[i], -0.5 * eps ** 2 - jnp.log(scale[i]) - 0.5 * jnp.log(2 * jnp.pi), 0.0).sum(1)
        log_w = score(x, jnp.broadcast_to(parents[i], (particles, 9)), jnp.broadcast_to(edges[i], (particles, 9))) \
            - log_q
        marginals.append(jax.nn.logsumexp(log_w) - jnp.log(particles))
        ess.append(float(jnp.exp(2 * jax.nn.logsumexp(log_w) - jax.nn.logsumexp(2 * log_w))) / particles)
    marginals = np.asarray(marginals)
    posterior = np.exp(marginals - jax.nn.logsumexp(marginals))
    return posterior, min(e for e, p in zip(ess, posterior) if p > 0.01), float(jax.nn.logsumexp(marginals))


@pytest.mark.parametrize("explore", [0.0, 0.2], ids=["vimco", "explore-rws"])
def test_short_fit_recovers_the_exact_posterior_over_topologies(alignment, explore):
    """q(tree) (exact: the 15 sequences' probabilities) within 0.02 of the posterior over topologies (0.05 for
    reweighted wake-sleep on exploring particles), and the importance-sampled log ML within 0.1 of the enumerated
    one. From the default start, distance-guided insertion, which begins concentrated: 4,000 steps (2,000
    left VIMCO 0.044 off; from a uniform start 0.018)."""
    settings = VISettings(steps=4000, repeats=2, importance=500, tree_samples=10, explore=explore, **SETTINGS)
    result = vi(alignment, "JC", settings, seed=0)
    posterior, ess, log_ml = exact_topology_posterior(target_of(alignment, "JC", settings))
    assert ess > 0.2
    q_tree = np.exp(np.asarray(eqx.filter_jit(jax.vmap(lambda c: result.q.topology.log_prob(c, 5)))(
        jnp.asarray(all_choices(5)))))
    # VIMCO's gradient is unbiased; reweighted wake-sleep's self-normalised weights over K = 10 particles are
    # biased at finite K (measured 0.033 here), hence its wider bound
    assert np.max(np.abs(q_tree - posterior)) < (0.05 if explore else 0.02), (q_tree.round(3), posterior.round(3))
    assert np.mean(result.log_ml) == pytest.approx(log_ml, abs=0.1)
    assert np.mean(result.elbo) < np.mean(result.log_ml)


def run_cli(*argv):
    return main(["vi", *map(str, argv)])


CLI = ("--particles", 10, "--block", 100, "--lr", 3e-3, "--topology-rate", 1.0, "--width", 16, "--repeats", 2,
       "--importance", 100, "--samples", 5)


def test_cli_writes_every_output_and_a_resumed_run_ends_with_the_same_bytes(fasta, tmp_path, capsys):
    """The command's outputs; the same run stopped after its first block (a signal's stop request) and resumed
    through the library ends with the same files, byte for byte."""
    assert run_cli(fasta, "-m", "JC", "--steps", 300, "--out", tmp_path / "whole", *CLI) == 0
    assert "log ML" in capsys.readouterr().out
    whole = tmp_path / "whole"
    for name in ("trace.tsv", "trace.png", "summary.json", "splits.tsv", "consensus.tree", "samples.trees",
                 "checkpoint.pkl"):
        assert (whole / name).stat().st_size > 0, name
    assert len((whole / "trace.tsv").read_text().splitlines()) == 301
    assert (whole / "samples.trees").read_text().count("tree q.") == 5
    alignment = jp.read_alignment(fasta)
    settings = VISettings(steps=300, repeats=2, importance=100, tree_samples=5, **SETTINGS)
    with pytest.raises(Interrupted, match="after 100 steps"):
        vi(alignment, "JC", settings, out=tmp_path / "cut", stop=StopAfter(1))
    with pytest.raises(jp.InputError, match="holds a run"):
        vi(alignment, "JC", settings, out=tmp_path / "cut")
    vi(alignment, "JC", settings, out=tmp_path / "cut", resume=True)
    for name in ("trace.tsv", "summary.json", "splits.tsv", "consensus.tree", "samples.trees", "checkpoint.pkl"):
        assert (tmp_path / "cut" / name).read_bytes() == (whole / name).read_bytes(), name


def test_selection_copies_the_better_half_and_keeps_every_slots_key():
    """Scores 3, 1, 2, 0: slots 1 and 3 (the worse half) take members 0 and 2; each slot keeps its own key."""
    settings = VISettings(population=4, width=4, depth=1)
    state = initial_fit_state(5, settings, seed=0)
    selected, source = select(state, np.array([3.0, 1.0, 2.0, 0.0]))
    assert source.tolist() == [0, 0, 2, 2]
    taxa = np.asarray(selected.q.topology.taxon)
    assert np.array_equal(taxa[1], np.asarray(state.q.topology.taxon)[0]) and np.array_equal(taxa[3], taxa[2])
    assert np.array_equal(np.asarray(selected.key), np.asarray(state.key))


def test_a_population_run_selects_and_resumes_to_the_same_bytes(alignment, tmp_path):
    """Two q's side by side (selections inside both blocks' spans), stopped after the first block and resumed:
    the same files as a run that never stopped; the result is one member (its step count, not the population's)."""
    settings = VISettings(steps=200, repeats=2, importance=100, tree_samples=5, population=2, selections=5,
                          **SETTINGS)
    whole = vi(alignment, "JC", settings, out=tmp_path / "whole")
    assert whole.steps == 200 and len(whole.trace) == 200 and np.all(np.isfinite(whole.trace))
    with pytest.raises(Interrupted, match="after 100 steps"):
        vi(alignment, "JC", settings, out=tmp_path / "cut", stop=StopAfter(1))
    vi(alignment, "JC", settings, out=tmp_path / "cut", resume=True)
    for name in ("trace.tsv", "summary.json", "splits.tsv", "samples.trees", "checkpoint.pkl"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


@pytest.mark.parametrize("drop", [0.0, 1e6])
def test_a_run_returns_the_q_of_its_best_block(alignment, monkeypatch, drop):
    """A q that a later step throws out of its mode is not what the run returns: the second block's bounds made
    worse by 1e6, the q estimated from is the state after the first block (step 100 of 200); left as they are
    (block means within a step's spread), the last q."""
    from jaxphylo.inference.vi import _run

    after = []

    def worse_later(state, *args):
        state, rows = real(state, *args)
        after.append(state)
        return state, rows - drop * (len(after) > 1)

    real = _run.run_block
    monkeypatch.setattr(_run, "run_block", worse_later)
    settings = VISettings(steps=200, repeats=2, importance=100, tree_samples=5, population=1, **SETTINGS)
    result = vi(alignment, "JC", settings)
    kept = 100 if drop else 200
    assert result.steps == 200 and result.kept_step == kept and result.summary()["kept_step"] == kept
    if not drop:
        return
    first = jax.tree.leaves(eqx.filter(after[0].q, eqx.is_array))
    assert all(np.array_equal(np.asarray(a)[0], np.asarray(b)) for a, b in
               zip(first, jax.tree.leaves(eqx.filter(result.q, eqx.is_array))))


def test_bad_input_is_one_line(fasta, tmp_path, capsys):
    assert run_cli(fasta, "-m", "NOSUCHMODEL", "--out", tmp_path / "a") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxphylo: error:") and len(err.splitlines()) == 1, err
    three = tmp_path / "three.fasta"
    three.write_text(">a\nACGT\n>b\nACGA\n>c\nACTT\n")
    assert run_cli(three, "-m", "JC", "--out", tmp_path / "b") == 2
    err = capsys.readouterr().err.strip()
    assert "at least 4 taxa" in err and len(err.splitlines()) == 1, err
    assert run_cli(fasta, "-m", "JC", "--particles", 1, "--out", tmp_path / "c") == 2
    assert "--particles" in capsys.readouterr().err
