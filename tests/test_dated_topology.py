"""Time trees with the topology free: BEAST's tree moves, the HMC move, the sampler, its outputs and CLI."""

import collections
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import dated_simulation
from numpyro.infer import MCMC, NUTS, init_to_value

import jaxphylo as jp
from jaxphylo.inference import Analysis, prepare
from jaxphylo.inference import tempered
from jaxphylo.inference.base import sample_blocks
from jaxphylo.inference.dated import (
    DatedPosterior, DatedSettings, build_kernel, clade_masks, dated_mcmc, init, run_block,
)
from jaxphylo.tree import anchors_on as node_anchors, ratio_coordinates_on as ratio_coordinates, \
    ratio_heights_on as ratio_heights, ratio_log_jacobian_on as ratio_log_jacobian
from jaxphylo.models import ModelCoordinates

TIPS = np.array([0.0, 0.5, 1.0, 0.2])  # four tips sampled through time
START_PARENTS = np.array([4, 4, 5, 6, 5, 6, -1])  # a rooted start on the four tips


def serial_prior(clock: str = "none") -> DatedPosterior:
    """The sampler's posterior with no data (prior only) on `TIPS`: the constant coalescent with N = 1."""
    return DatedPosterior(None, ModelCoordinates(jp.parse_model("JC"), frozenset()), jnp.asarray(TIPS),
                          jnp.zeros(0, jnp.int32), jnp.zeros((2, 0)), (), jnp.float64, len(TIPS), clock, "coalescent",
                          population_size=1.0, prior_only=True)


def serial_start(chains: int) -> tuple[np.ndarray, np.ndarray]:
    """`chains` copies of a start time tree on `TIPS`: `(parents, heights)`, `[chains, 7]` each."""
    return np.tile(START_PARENTS, (chains, 1)), np.tile([*TIPS, 1.3, 1.8, 2.5], (chains, 1))


def serial_coalescent(tips, draws: int, seed: int = 0):
    """Ranked-topology frequencies (as clade sets) and root heights of the coalescent with theta = 1 and tips
    sampled at `tips`, by direct simulation backwards in time (independent of the sampler)."""
    rng = np.random.default_rng(seed)
    counts, roots = collections.Counter(), []
    order = list(np.argsort(tips))
    for _ in range(draws):
        pending, lineages, clades, t = list(order), [], [], 0.0
        while True:
            while pending and tips[pending[0]] <= t:
                lineages.append(1 << int(pending.pop(0)))
            k = len(lineages)
            if k == 1 and not pending:
                break
            wait = rng.exponential(2 / (k * (k - 1))) if k > 1 else np.inf
            if pending and t + wait >= tips[pending[0]]:
                t = tips[pending[0]]
                continue
            t += wait
            i, j = rng.choice(k, 2, replace=False)
            clades.append(lineages[i] | lineages[j])
            lineages = [x for q, x in enumerate(lineages) if q not in (i, j)] + [clades[-1]]
        counts[frozenset(clades[:-1])] += 1
        roots.append(t)
    return {k: v / draws for k, v in counts.items()}, np.asarray(roots)


@pytest.fixture(scope="module")
def coalescent_reference():
    return serial_coalescent(TIPS, 40_000)


@pytest.mark.parametrize("moves, generations", [
    # 30,000 generations gave 0.004-0.0105 over four seeds: too close to the bound to tell a wrong kernel
    ({"narrow_exchange": 1, "subtree_slide": 1, "node_height": 1, "root_height": 1}, 60_000),
    ({"wide_exchange": 1, "wilson_balding": 1, "hmc": 1}, 30_000),
    # alone it mixes slowly: at 120,000 the root height's sd came within 0.3-3.2% of simulation over four seeds
    ({"subtree_slide": 1}, 240_000),
])
def test_tree_moves_and_hmc_recover_the_serial_coalescent(moves, generations, coalescent_reference):
    """Prior only, theta = 1, tips at four heights: every ranked topology's frequency within 0.01 of direct
    simulation (measured 0.004-0.006), root height mean and sd within 3%. Each move set alone must be a correct
    (and irreducible) kernel, so a wrong Hastings ratio or Jacobian in any move shows: without its log K terms
    the subtree slide misses by 0.015 (0.003 with them), Wilson-Balding without its height ranges by 0.056."""
    chains = 8
    every = generations // 3000
    settings = DatedSettings(chains=chains, generations=generations, sample_every=every, moves=moves, block=3000,
                             tune=3000)
    posterior = serial_prior()
    state = init(*serial_start(chains), {}, posterior)
    _, _, samples = run_block(state, jax.random.PRNGKey(1), posterior, settings, np.int32(3000),
                              np.int32(settings.tune_generations))
    kept = slice(300, None)
    found = topology_frequencies(np.asarray(samples.parents)[kept], np.asarray(samples.heights)[kept])
    expected, roots = coalescent_reference
    assert set(found) == set(expected)
    worst = max(abs(found[k] - f) for k, f in expected.items())
    assert worst < 0.01, worst
    root = np.asarray(samples.heights)[kept].max(-1).ravel()
    assert root.mean() == pytest.approx(roots.mean(), rel=0.03)
    assert root.std() == pytest.approx(roots.std(), rel=0.03)


def topology_frequencies(parents, heights) -> dict:
    """The frequency of every unranked rooted topology (its set of clades, the root's left out) among samples
    `[..., M]`."""
    m = parents.shape[-1]
    n = (m + 1) // 2
    everyone = (1 << n) - 1  # the root's clade (the root is any internal node)
    found = collections.Counter(frozenset(set(clade_masks(p, h)[n:]) - {everyone})
                                for p, h in zip(parents.reshape(-1, m), heights.reshape(-1, m)))
    return {k: v / sum(found.values()) for k, v in found.items()}


def test_heated_dated_chains_sample_their_heated_coalescents():
    """Metropolis coupling of the dated sampler, prior only, theta = 1: 4 runs x 3 heats at beta = 1, 2/3, 1/2. The
    coalescent density with N = 1 to the power beta is the coalescent with N = 1 / beta (`exp(-beta C(k,2) dt)` per
    interval), which on tips `TIPS` is the N = 1 coalescent on tips `beta TIPS` with heights divided by `beta`. So
    the chain holding heat `k`, whichever it is, must sample that tree distribution: every heat's topology
    frequencies within 0.015 of direct simulation (its own 40,000 draws; measured 0.005-0.010) and root-height mean
    within 4%, with heats swapped between chains. The swap rule's sign reversed misses by 0.097."""
    runs, heats = 4, 3
    generations = 45_000
    every = generations // 3000
    settings = DatedSettings(chains=runs, heats=heats, temperature=0.5, generations=generations, sample_every=every,
                             moves={"narrow_exchange": 1, "subtree_slide": 1, "root_height": 1, "hmc": 1},
                             block=3000, tune=3000)
    posterior = serial_prior()
    state = init(*serial_start(runs * heats), {}, posterior, heats)
    step = build_kernel(posterior, settings, np.int32(settings.tune_generations))

    def by_heat(state):
        pick = tempered.in_heat_order(state, heats)
        return pick(state.chains.position.parents), pick(state.chains.position.heights)

    state, _, (sampled_parents, sampled_heights) = jax.jit(
        lambda state, key: sample_blocks(step, state, key, 3000, 3000, every, by_heat))(state, jax.random.PRNGKey(5))
    swaps = np.asarray(state.swaps_accepted).sum(0)
    assert swaps[0, 1] > 0 and swaps[1, 2] > 0
    kept = slice(300, None)
    for k, beta in enumerate(np.asarray(tempered.heats(heats, 0.5))):
        expected, roots = serial_coalescent(TIPS * beta, 40_000, seed=k)
        found = topology_frequencies(np.asarray(sampled_parents)[kept, :, k], np.asarray(sampled_heights)[kept, :, k])
        worst = max(abs(found.get(c, 0.0) - f) for c, f in expected.items())
        assert worst < 0.015, (k, worst)
        root = np.asarray(sampled_heights)[kept, :, k].max(-1).ravel()
        assert root.mean() == pytest.approx(roots.mean() / beta, rel=0.04), k


def random_histories(num_tips: int, draws: int, seed: int = 0) -> dict:
    """Ranked-history frequencies (clades in the order they form, the root's left out) under Yule and birth–death
    conditioned on the tips, by direct simulation: lineages joined in uniformly random pairs (Edwards 1970)."""
    rng = np.random.default_rng(seed)
    counts = collections.Counter()
    for _ in range(draws):
        lineages, clades = [1 << k for k in range(num_tips)], []
        while len(lineages) > 1:
            i, j = rng.choice(len(lineages), 2, replace=False)
            clades.append(lineages[i] | lineages[j])
            lineages = [x for q, x in enumerate(lineages) if q not in (i, j)] + [clades[-1]]
        counts[tuple(clades[:-1])] += 1
    return {k: v / draws for k, v in counts.items()}


def birth_death_roots(num_tips: int, draws: int, turnover: bool, seed: int = 0):
    """Root heights (and turnovers) of birth–death with net diversification 1 (Yule with birth rate 1, or turnover
    ~ Uniform(0, 1)) conditioned on the tips with a uniform prior on the origin, by direct simulation: i.i.d.
    node ages (Gernhard 2008) by inverting G(x) = lambda (1 - e^-x) / (lambda + (1 - lambda) e^-x) (rho = 1)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(size=draws) if turnover else np.zeros(draws)
    u = rng.uniform(size=(draws, num_tips - 1))
    birth = 1 / (1 - a[:, None])
    ages = -np.log(birth * (1 - u) / (birth + u * (1 - birth)))
    return ages.max(1)


@pytest.fixture(scope="module")
def history_reference():
    return random_histories(4, 40_000)


def ranked_histories(parents, heights, num_tips: int) -> collections.Counter:
    """How often each ranked history (non-root clades by increasing height) appears in samples `[S, M]`."""
    found = collections.Counter()
    for p, h in zip(parents, heights):
        masks = clade_masks(p, h)
        found[tuple(masks[num_tips + i] for i in np.argsort(h[num_tips:]))[:-1]] += 1
    return found


@pytest.mark.parametrize("tree_prior, fixed, moves", [
    ("yule", (("log_birth_rate", 0.0),), {"narrow_exchange": 15, "wide_exchange": 3, "subtree_slide": 15,
                                          "wilson_balding": 3, "node_height": 15, "root_height": 3}),
    ("birth-death", (("log_net_diversification", 0.0),), {"narrow_exchange": 1, "wilson_balding": 1, "hmc": 1}),
])
def test_tree_moves_and_hmc_recover_yule_and_birth_death(tree_prior, fixed, moves, history_reference):
    """Prior only, four contemporaneous tips, net diversification 1 (Yule: birth rate 1, BEAST's tree moves;
    birth–death: turnover sampled by HMC, with two tree moves): each of the 18 ranked histories within 0.01 of its
    frequency by direct simulation (1/18 each), root height mean and sd within 3% (400,000 simulated); the
    turnover keeps its Uniform(0, 1) prior (mean 1/2, sd 0.289, within 3%), which holds only if the density
    integrates to one over histories and times for every turnover and the logit's Jacobian is right."""
    n, m, chains, generations = 4, 7, 16, 30_000
    settings = DatedSettings(chains=chains, generations=generations, sample_every=generations // 3000,
                             block=3000, tune=3000, moves=moves)
    posterior = DatedPosterior(None, ModelCoordinates(jp.parse_model("JC"), frozenset()), jnp.zeros(n),
                               jnp.zeros(0, jnp.int32), jnp.zeros((2, 0)), (), jnp.float64, n, "none", tree_prior,
                               prior_only=True, fixed=fixed)
    params = {"logit_turnover": jnp.zeros(chains)} if tree_prior == "birth-death" else {}
    parents = np.array([4, 4, 5, 6, 5, 6, -1])
    heights = np.array([0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.8])
    state = init(np.tile(parents, (chains, 1)), np.tile(heights, (chains, 1)), params, posterior)
    _, _, samples = run_block(state, jax.random.PRNGKey(2), posterior, settings, np.int32(3000),
                              np.int32(settings.tune_generations))
    kept = slice(300, None)
    p, h = np.asarray(samples.parents)[kept].reshape(-1, m), np.asarray(samples.heights)[kept].reshape(-1, m)
    found = ranked_histories(p, h, n)
    assert len(history_reference) == 18 and set(found) == set(history_reference)
    worst = max(abs(found[k] / len(p) - f) for k, f in history_reference.items())
    assert worst < 0.01, worst
    roots = birth_death_roots(n, 400_000, tree_prior == "birth-death")
    assert h.max(-1).mean() == pytest.approx(roots.mean(), rel=0.03)
    assert h.max(-1).std() == pytest.approx(roots.std(), rel=0.03)
    if tree_prior == "birth-death":
        turnover = jax.nn.sigmoid(np.asarray(samples.params["logit_turnover"])[kept]).ravel()
        assert turnover.mean() == pytest.approx(0.5, rel=0.03)
        assert turnover.std() == pytest.approx(np.sqrt(1 / 12), rel=0.03)


def test_ratio_coordinates_round_trip_and_log_jacobian():
    """On a tree whose root is not the last node: heights -> z -> heights, and the log-Jacobian equals
    log |det dh/dz| from automatic differentiation."""
    parents = jnp.array([7, 7, 5, 8, 5, 8, -1, 6, 6])  # tips 0-4; internal 5-8, the root is node 6
    tips = jnp.array([0.0, 1.0, 0.3, 0.0, 2.0])
    heights = jnp.array([*tips, 2.5, 6.0, 1.5, 4.0])
    anchors = node_anchors(parents, tips)
    np.testing.assert_allclose(anchors, [0, 1, 0.3, 0, 2, 2, 2, 1, 2.0])
    z = ratio_coordinates(parents, anchors, heights, 5)
    np.testing.assert_allclose(ratio_heights(parents, anchors, z, 5), heights, rtol=1e-12)
    inner = np.arange(5, 9)
    jac = jax.jacfwd(lambda x: ratio_heights(parents, anchors, z.at[inner].set(x), 5)[inner])(z[inner])
    assert float(ratio_log_jacobian(parents, anchors, heights, z, 5)) == pytest.approx(
        float(jnp.linalg.slogdet(jac)[1]), rel=1e-10)
    flat = heights.at[:5].set(0.0)  # contemporaneous: tip 0 is as old as the root's anchor, a log(0) to mask
    z = ratio_coordinates(parents, jnp.zeros(9), flat, 5)
    gradient = jax.jit(jax.grad(lambda z: ratio_log_jacobian(parents, jnp.zeros(9), ratio_heights(
        parents, jnp.zeros(9), z, 5), z, 5)))(z)
    assert np.all(np.isfinite(gradient))


def _dated_data(num_sites=1500, seed=5):
    """Six tips over 20 years, root 45 years back, rate 5e-3 per year: a topology the data resolve."""
    return dated_simulation(6, 45.0, 5e-3, num_sites, seed)


def test_free_topology_posterior_agrees_with_nuts_on_the_true_topology():
    """JC, strict clock, constant coalescent: with the topology resolved by the data, the free-topology sampler's
    posterior medians of root height and clock rate equal NUTS's on the fixed true tree (the validated
    fixed-topology sampler, same priors; 1,000 draws) within 4 Monte-Carlo standard errors, and it puts
    posterior > 0.95 on every true clade."""
    alignment, tree, tips, time = _dated_data()
    prepared = prepare(alignment, tree, Analysis("JC", clock="strict"), tips)
    mcmc = MCMC(NUTS(prepared.model, init_strategy=init_to_value(values=prepared.init)), num_warmup=300,
                num_samples=1000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), prepared.data)
    nuts = {name: np.asarray(mcmc.get_samples()[name]) for name in ("root_height", "clock_rate")}
    result = dated_mcmc(alignment, "JC", tips, settings=DatedSettings(chains=4, generations=20_000, sample_every=20),
                        seed=1)
    free = {"root_height": result.samples.column("rootHeight", 0.1), "clock_rate": result.samples.column(
        "clock.rate", 0.1)}
    ess = {row["name"]: row["ess"] for row in result.summary()}
    for name, column in (("root_height", "rootHeight"), ("clock_rate", "clock.rate")):
        a, b = nuts[name], free[name].ravel()
        error = np.hypot(a.std() / np.sqrt(len(a) / 3), b.std() / np.sqrt(ess[column]))  # NUTS ESS ~ n/3 or more
        assert abs(np.median(a) - np.median(b)) < 4 * error, (name, np.median(a), np.median(b), error)
    from jaxphylo.inference.dated import clade_frequencies

    frequency = clade_frequencies(result.samples.kept_trees(0.1))
    parent = tree.topology.parent_array
    true = clade_masks(parent, np.concatenate([tips, np.arange(1.0, 6.0) + 100]))[6:]
    assert all(frequency.get(mask, 0.0) > 0.95 for mask in true), [frequency.get(mask, 0.0) for mask in true]


def test_resumed_free_topology_run_writes_the_same_bytes(tmp_path):
    """A run stopped after its first block and resumed ends with the files of one that never stopped (heated
    chains: the heats and swap counts are part of the checkpoint)."""
    from jaxphylo.runtime import Interrupted

    alignment, _, tips, _ = _dated_data(300)
    settings = DatedSettings(chains=2, heats=2, generations=400, sample_every=20, block=5)

    class StopOnce:
        calls = 0

        @property
        def reason(self):
            StopOnce.calls += 1
            return "test stop" if StopOnce.calls == 3 else None

    dated_mcmc(alignment, "JC", tips, settings=settings, out=tmp_path / "whole")
    with pytest.raises(Interrupted):
        dated_mcmc(alignment, "JC", tips, settings=settings, out=tmp_path / "parts", stop=StopOnce())
    dated_mcmc(alignment, "JC", tips, settings=settings, out=tmp_path / "parts", resume=True)
    for name in ("chain1.log", "chain2.trees", "mcc.tree"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "parts" / name).read_bytes(), name
    swaps = [json.loads((tmp_path / run / "summary.json").read_text())["swap_rates"] for run in ("whole", "parts")]
    assert swaps[0] == swaps[1]


def test_incremental_dated_chains_follow_the_full_recomputation():
    """Kept partials change the cost, not the chain: from one seed (HKY+G4, relaxed clock: tree moves, HMC over
    heights, rates and model parameters) the incremental run and the full recomputation keep the same trees and
    their log L agrees to 1e-9 (the last bits may differ: a node's scale factors are summed in another order)."""
    alignment, _, tips, _ = _dated_data(300)
    runs = [dated_mcmc(alignment, "HKY+G4", tips, clock="relaxed", seed=3, settings=DatedSettings(
        chains=2, generations=300, sample_every=10, block=10, incremental=incremental)) for incremental in (True, False)]
    assert runs[0].acceptance == runs[1].acceptance
    for mine, reference in zip(runs[0].samples.kept_trees(0.0), runs[1].samples.kept_trees(0.0), strict=True):
        for x, y in zip(mine, reference, strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(runs[0].samples.column("likelihood", 0.0), runs[1].samples.column("likelihood", 0.0),
                               rtol=1e-9, atol=0)


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_sample_without_a_tree_samples_the_topology(tmp_path):
    """`jaxphylo sample ALN --clock strict --dates D --heats 2`: a start tree from the data and the dates, Tracer
    logs of the run's cold chain with age(root), NEXUS time trees with height and rate annotations, an MCC tree
    that DendroPy reads and the heat swaps in summary.json; without --clock, or with --heats on a fixed topology,
    a one-line error."""
    import dendropy

    alignment, _, tips, _ = _dated_data(300)
    (tmp_path / "aln.fasta").write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    (tmp_path / "dates.tsv").write_text("taxon\tdate\n" + "".join(f"{t}\t{2000 - h}\n" for t, h in
                                                                   zip(alignment.taxa, tips)))
    out = tmp_path / "run"
    done = cli("sample", str(tmp_path / "aln.fasta"), "--dates", str(tmp_path / "dates.tsv"), "--clock", "strict",
               "-m", "HKY+G4", "--chains", "1", "--heats", "2", "--warmup", "5", "--samples", "20",
               "--sample-every", "20", "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    swaps = np.asarray(json.loads((out / "summary.json").read_text())["swap_rates"])
    assert swaps.shape == (1, 2, 2) and 0 < swaps[0, 0, 1] <= 1 and not (out / "chain2.log").exists()
    assert "age(root)" in done.stdout and "clock.rate" in done.stdout and "kappa" in done.stdout
    header = (out / "chain1.log").read_text().splitlines()[0].split("\t")
    assert header[:6] == ["state", "posterior", "likelihood", "prior", "rootHeight", "age(root)"]
    trees = dendropy.TreeList.get(path=str(out / "chain1.trees"), schema="nexus")
    assert len(trees) == 25 and trees[0].is_rooted
    assert all(node.annotations.get_value("rate") is not None for node in trees[0].postorder_node_iter()
               if node.parent_node)
    mcc = dendropy.Tree.get(path=str(out / "mcc.tree"), schema="nexus")
    root = mcc.seed_node.annotations
    assert root.get_value("posterior") is not None and root.get_value("height_95%_HPD") is not None
    bad = cli("sample", str(tmp_path / "aln.fasta"), "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "add --clock" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "start.nwk").write_text(trees[0].as_string(schema="newick", suppress_annotations=True))
    bad = cli("sample", str(tmp_path / "aln.fasta"), str(tmp_path / "start.nwk"), "--heats", "3", "--out",
              str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--heats is an option of --topology free" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_given_start_tree_is_renumbered_to_the_alignment():
    """A start tree whose taxa come in another order than the alignment's: the sampler's arrays put every tip
    at its own height and keep the tree's clades and node heights; another taxon set is a one-line error."""
    from jaxphylo import InputError
    from jaxphylo.inference.dated import given_start

    alignment, tree, tips, time = _dated_data(50)
    order = [3, 0, 5, 1, 4, 2]
    shuffled = jp.Alignment(tuple(alignment.taxa[i] for i in order), tuple(alignment.sequences[i] for i in order),
                            alignment.alphabet)
    parents, heights = given_start(shuffled, tree, tips[order])
    np.testing.assert_allclose(heights[:6], tips[order])
    expected = jp.inference.heights_from_tree(tree, time)
    assert np.allclose(np.sort(heights[6:]), np.sort(expected))
    names = lambda mask, taxa: frozenset(t for k, t in enumerate(taxa) if mask >> k & 1)  # noqa: E731
    mine = {names(m, shuffled.taxa) for m in clade_masks(parents, heights)[6:]}
    theirs = {names(m, tree.taxa) for m in clade_masks(tree.topology.parent_array,
                                                       np.concatenate([tips, expected]))[6:]}
    assert mine == theirs
    with pytest.raises(InputError, match="differ in taxon 't5'"):
        given_start(jp.Alignment(alignment.taxa[:5], alignment.sequences[:5], alignment.alphabet), tree, tips[:5])


def test_relaxed_clock_parameters_follow_their_priors():
    """Prior only (no likelihood), relaxed clock, coalescent with theta = 1: HMC over the clock's parameters and
    the node heights, with the tree moves, recovers ucld.stdev ~ Exponential(3) (mean and sd 1/3), the
    per-branch deviates' N(0, 1), and the CTMC reference prior's E[rate x tree length in time] = 1/2 (the rate
    is Gamma(1/2, tree length) given the tree)."""
    m, chains = 7, 8
    settings = DatedSettings(chains=chains, generations=30_000, sample_every=10, block=3000, tune=3000)
    posterior = serial_prior("relaxed")
    params = {"model": {}, "log_clock_rate": jnp.zeros(chains), "log_rate_spread": jnp.full(chains, -1.0),
              "rate_z": jnp.zeros((chains, m))}
    state = init(*serial_start(chains), params, posterior)
    _, _, samples = run_block(state, jax.random.PRNGKey(3), posterior, settings, np.int32(3000),
                              np.int32(settings.tune_generations))
    kept = slice(300, None)
    spread = np.exp(np.asarray(samples.params["log_rate_spread"])[kept]).ravel()
    assert spread.mean() == pytest.approx(1 / 3, rel=0.1)
    assert spread.std() == pytest.approx(1 / 3, rel=0.15)
    p, h = np.asarray(samples.parents)[kept], np.asarray(samples.heights)[kept]
    z = np.asarray(samples.params["rate_z"])[kept][p >= 0]
    assert z.mean() == pytest.approx(0.0, abs=0.05) and z.std() == pytest.approx(1.0, rel=0.05)
    length = np.where(p >= 0, np.take_along_axis(h, np.maximum(p, 0), -1) - h, 0.0).sum(-1)
    rate = np.exp(np.asarray(samples.params["log_clock_rate"])[kept])
    assert (rate * length).mean() == pytest.approx(0.5, rel=0.1)


def test_sample_with_a_yule_or_birth_death_prior(tmp_path, capsys):
    """`jaxphylo sample ALN --clock strict --tree-prior yule` (contemporaneous tips: heights in substitutions):
    a Tracer log with `yule.birthRate`; birth–death logs BEAST's `birthDeath.BminusDRate` and
    `birthDeath.DoverB`; tips of different ages are refused in one line naming --tree-prior, before a dry run."""
    from jaxphylo import cli
    from jaxphylo.inference.dated import column_names

    alignment, _, tips, _ = _dated_data(200)
    aln = tmp_path / "aln.fasta"
    aln.write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    out = tmp_path / "run"
    assert cli.main(["sample", str(aln), "--clock", "strict", "--tree-prior", "yule", "-m", "JC", "--chains", "1",
                     "--warmup", "2", "--samples", "8", "--sample-every", "10", "--out", str(out),
                     "--no-progress"]) == 0
    rows = [line.split("\t") for line in (out / "chain1.log").read_text().splitlines()]
    assert rows[0][:5] == ["state", "posterior", "likelihood", "prior", "rootHeight"] and "age(root)" not in rows[0]
    rate = rows[0].index("yule.birthRate")
    assert len(rows) == 11 and all(float(row[rate]) > 0 for row in rows[1:])
    assert "yule.birthRate" in capsys.readouterr().out
    coordinates = ModelCoordinates(jp.parse_model("JC"), frozenset())
    assert column_names("none", "birth-death", 10, coordinates, False)[-2:] == ["birthDeath.BminusDRate",
                                                                                  "birthDeath.DoverB"]
    (tmp_path / "dates.tsv").write_text("taxon\tdate\n" + "".join(f"{t}\t{2000 - h}\n" for t, h in
                                                                   zip(alignment.taxa, tips)))
    assert cli.main(["sample", str(aln), "--clock", "strict", "--tree-prior", "birth-death", "--dates",
                     str(tmp_path / "dates.tsv"), "--dry-run", "--out", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err.strip()
    assert "contemporaneous" in error and "--tree-prior coalescent" in error and "\n" not in error


def test_summary_tree_with_a_child_above_its_parent_is_valid_newick():
    """An MCC tree's median heights can put a node above its parent (short runs): the Newick must still hold
    every tip once, with that branch clipped to zero (a height sort had dropped a child and left `,)`)."""
    from io import StringIO

    from Bio import Phylo

    from jaxphylo.inference.dated import time_tree_newick

    parents = np.array([4, 4, 5, 6, 5, 6, -1])  # ((0,1)4,2)5,3)6
    heights = np.array([0.0, 0.0, 0.0, 0.0, 2.0, 1.5, 3.0])  # node 4 above its parent 5
    newick = time_tree_newick(parents, heights)
    tree = Phylo.read(StringIO(newick + ";"), "newick")
    assert sorted(c.name for c in tree.get_terminals()) == ["1", "2", "3", "4"]
    assert "," + ")" not in newick
    lengths = {c.name: c.branch_length for c in tree.get_terminals()}
    assert lengths["1"] == lengths["2"] == 2.0 and lengths["4"] == 3.0
    assert min(c.branch_length for c in tree.find_clades() if c.branch_length is not None) == 0.0
