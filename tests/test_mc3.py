"""MC³ over trees: every move against the prior alone, a 5-taxon posterior against numerical integration,
heat swaps, resume to the same bytes, and the `mcmc` command.

Tolerances: prior checks use 16 independent chains of 2,000 samples each
(every 5th generation: autocorrelated); a topology frequency within 0.015 of
1/15 and tree-length moments within 5% (mean) and 15% (variance) are 4-5
Monte Carlo standard errors of such runs, while a wrong Hastings ratio (for
example dropping the SPR's `T / A`, or `m` instead of `m^2` in the node
slider) moves the tree length by 20% or more.
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo.runtime import Interrupted
from jaxphylo.inference.mc3 import MC3Settings, RunSamples, consensus_newick, mc3
from jaxphylo.tree import kernel_splits

from conftest import StopAfter, sigterm_at_random_moment

TAXA = tuple(f"t{i}" for i in range(5))


def topology_key(parent, taxa=TAXA):
    return frozenset(s for s in kernel_splits(np.asarray(parent), taxa) if s is not None)


def prior_run(moves, model="JC", samples=2000, tune=0, branch_rate=10.0):
    alignment = jp.simulate(jp.random_topology_tree(TAXA, seed=1), jp.parse_model("JC"), 20, seed=1)
    settings = MC3Settings(runs=16, chains=1, generations=5 * samples, sample_every=5, tune=tune, moves=moves,
                           block=500, branch_rate=branch_rate)
    return mc3(alignment, model, settings=settings, prior_only=True, seed=3)


def assert_uniform_topologies(result):
    """Each of the 15 topologies within 0.015 of 1/15, pooled over the runs."""
    counts = {}
    for run in result.runs:
        for sample in run.splits:
            counts[frozenset(sample)] = counts.get(frozenset(sample), 0) + 1
    frequencies = np.array(list(counts.values())) / sum(counts.values())
    assert len(frequencies) == 15 and np.max(np.abs(frequencies - 1 / 15)) < 0.015, frequencies


def assert_prior_trees(result, rate=10.0):
    """Uniform topologies and the tree length (column 2) ~ Gamma(7, rate) (mean within 5%, variance within 15%)."""
    assert_uniform_topologies(result)
    lengths = np.concatenate([np.asarray(run.columns)[:, 2] for run in result.runs])
    assert lengths.mean() == pytest.approx(7 / rate, rel=0.05)
    assert lengths.var() == pytest.approx(7 / rate**2, rel=0.15)


@pytest.mark.parametrize("moves, rate", [
    ({"nni": 1, "branch_multiplier": 1}, 10.0),
    ({"spr": 1, "branch_multiplier": 1}, 10.0),
    ({"spr": 1, "node_slider": 1}, 10.0),
    ({"nni": 1, "tree_length": 1, "branch_multiplier": 1}, 5.0),
    ({"espr": 1, "branch_multiplier": 1}, 10.0),
    ({"etbr": 1, "node_slider": 1}, 10.0),
    ({"hmc": 1, "nni": 1}, 10.0),
])
def test_each_move_recovers_the_prior(moves, rate):
    """Uniform topologies (15 for 5 taxa) and i.i.d. Exponential(rate) edges: tree length ~ Gamma(7, rate)."""
    result = prior_run(moves, branch_rate=rate)
    assert_prior_trees(result, rate)
    edges = np.concatenate([np.asarray(run.tip_lengths).ravel() for run in result.runs])
    assert np.mean(edges > 3 / rate) == pytest.approx(np.exp(-3.0), abs=0.01)  # P(Exp(rate) > 3 / rate)


@pytest.mark.parametrize("moves", [{"spr": 1, "branch_multiplier": 1, "node_slider": 1},
                                   {"etbr": 1, "tree_length": 1, "hmc": 1}])
def test_moves_on_unlinked_part_lengths_recover_the_prior(moves, tmp_path):
    """-Q: every part its own edges ([M, K]), the topology shared; each part's tree length ~ Gamma(7, 10) and
    the topologies uniform, with each length variate drawn per part (a variate shared by the parts would
    leave the reverse move impossible)."""
    from jaxphylo.io import read_partitions

    alignment = jp.simulate(jp.random_topology_tree(TAXA, seed=1), jp.parse_model("JC"), 20, seed=1)
    (tmp_path / "p.nex").write_text("#nexus\nbegin sets;\ncharset a = 1-10;\ncharset b = 11-20;\nend;\n")
    model = jp.partitioned_model(read_partitions(tmp_path / "p.nex"), alignment, "JC", link="unlinked")
    result = prior_run(moves, model=model)
    names = result.column_names
    assert names[:5] == ["LnL", "LnPr", "TL", "TL.a", "TL.b"]
    assert_uniform_topologies(result)
    table = np.concatenate([np.asarray(run.columns) for run in result.runs])
    for part in (3, 4):
        assert table[:, part].mean() == pytest.approx(0.7, rel=0.05)
        assert table[:, part].var() == pytest.approx(0.07, rel=0.15)
    assert np.corrcoef(table[:, 3], table[:, 4])[0, 1] == pytest.approx(0.0, abs=0.1)  # independent parts


@pytest.mark.parametrize("moves", [{"parameters": 3, "nni": 1}, {"hmc": 1, "nni": 1}])
def test_parameter_moves_recover_the_model_priors(moves):
    """GTR+FO+I+G4 alone: Dirichlet(1) frequencies (marginal mean 1/4, sd 0.194) and exchangeabilities (1/6,
    0.141), Exponential(1) Gamma shape, Uniform(0, 1) +I (mean 1/2, sd 0.289); by MrBayes's moves (Dirichlet,
    multiplier, sliding window) and by the HMC move."""
    result = prior_run(moves, model="GTR+FO+I+G4", samples=3000, tune=2000)  # tuned, then 1,000 more discarded
    names = result.column_names
    table = np.concatenate([np.asarray(run.columns)[600:] for run in result.runs])
    column = lambda name: table[:, names.index(name)]  # noqa: E731
    assert column("gamma_shape").mean() == pytest.approx(1.0, abs=0.1)
    assert column("gamma_shape").std() == pytest.approx(1.0, rel=0.15)
    assert column("frequencies.1").mean() == pytest.approx(0.25, abs=0.02)
    assert column("frequencies.1").std() == pytest.approx(0.1936, rel=0.1)
    assert column("gtr_rates.6").mean() == pytest.approx(1 / 6, abs=0.015)
    assert column("gtr_rates.6").std() == pytest.approx(0.1409, rel=0.1)
    assert column("proportion_invariant").mean() == pytest.approx(0.5, abs=0.04)
    assert column("proportion_invariant").std() == pytest.approx(0.2887, rel=0.1)


@pytest.fixture(scope="module")
def five_taxa():
    """A 5-taxon alignment whose posterior spreads over several topologies (a short internal edge)."""
    tree = jp.parse_newick("((t0:0.1,t1:0.1):0.01,t2:0.1,(t3:0.1,t4:0.1):0.05);")
    return jp.simulate(tree, jp.parse_model("JC"), 60, seed=4)


def exact_topology_posterior(alignment, draws=40_000, seed=0):
    """P(topology | data) under JC, uniform topologies and Exponential(10) edges, by importance sampling each
    topology's marginal likelihood over its 7 edge lengths (a log-normal proposal around the ML lengths, each at
    least 0.01, log sd 1: near-zero ML lengths with a narrower one left the posterior's tail under-covered, and
    repeated estimates differed by 0.03)."""
    from itertools import permutations

    topologies = {}
    for x, a, b, c, d in permutations(TAXA):  # every unrooted 5-taxon tree: (x, a), (b, c), d at the centre
        tree = jp.parse_newick(f"(({x}:0.1,{a}:0.1):0.1,({b}:0.1,{c}:0.1):0.1,{d}:0.1);")
        batch = jp.TreeBatch.from_trees([tree])
        topologies.setdefault(topology_key(batch.parents[0], batch.taxa), tree)
    assert len(topologies) == 15
    rng = np.random.default_rng(seed)
    model = jp.parse_model("JC")
    log_z = {}
    for key, tree in topologies.items():
        fitted = jp.ml.fit(alignment, tree, "JC")
        centre = np.log(np.maximum(np.asarray(fitted.tree.branch_lengths), 0.01) + 0.005)
        lengths = np.exp(centre + 1.0 * rng.standard_normal((draws, centre.size)))
        lengths[:, -1] = 0.0  # the root's own (unused) branch
        log_proposal = (-0.5 * ((np.log(lengths[:, :-1]) - centre[:-1]) / 1.0) ** 2 - np.log(lengths[:, :-1])
                        - np.log(1.0 * np.sqrt(2 * np.pi))).sum(1)
        log_prior = (np.log(10.0) - 10.0 * lengths[:, :-1]).sum(1)
        batch = jp.TreeBatch.from_trees([fitted.tree])
        data = jp.likelihood.pattern_data(alignment, batch)
        trees = jp.TreeBatch(jnp.broadcast_to(batch.parents, (draws,) + batch.parents.shape[1:]),
                             jnp.asarray(_kernel_lengths(fitted.tree, lengths)), batch.taxa)
        log_l = np.asarray(jp.likelihood.batch_data_log_likelihoods(data, trees, model))
        log_w = log_l + log_prior - log_proposal
        log_z[key] = np.logaddexp.reduce(log_w) - np.log(draws)
    values = np.array(list(log_z.values()))
    return dict(zip(log_z, np.exp(values - np.logaddexp.reduce(values))))


def _kernel_lengths(tree, lengths):
    """Edge lengths of `tree` (its own branch order) placed where its kernel batch keeps them: `from_trees`
    gathers a tree's lengths by its topology alone, so the gather is read off once, from the lengths 1, 2, ...
    (what `from_trees` of every row gives, without building 10,000 trees)."""
    marked = jp.TreeBatch.from_trees([tree.with_branch_lengths(np.arange(1.0, lengths.shape[1] + 1))])
    source = np.rint(np.asarray(marked.branch_lengths[0])).astype(int) - 1  # -1: a length fixed at 0
    return np.where(source >= 0, lengths[:, np.maximum(source, 0)], 0.0)


def test_five_taxon_posterior_matches_numerical_integration(five_taxa):
    exact = exact_topology_posterior(five_taxa)
    result = mc3(five_taxa, "JC", runs=2, chains=3, generations=20_000, sample_every=10, seed=1)
    found = {}
    for run in result.runs:
        kept = run.splits[run.kept(0.25)]
        for sample in kept:
            key = frozenset(sample)
            found[key] = found.get(key, 0) + 1
    total = sum(found.values())
    difference = max(abs(found.get(k, 0) / total - p) for k, p in exact.items())
    assert max(exact.values()) < 0.7  # the test means something: the posterior is not one tree
    assert difference < 0.04, (sorted(exact.values())[-4:], difference)
    print(f"largest topology probability {max(exact.values()):.3f}, largest difference {difference:.4f}")


def test_heat_swaps_are_tried_between_every_pair_and_reported(five_taxa):
    result = mc3(five_taxa, "JC", runs=2, chains=3, generations=2000, sample_every=20, seed=2)
    rates = result.swap_rates
    assert rates.shape == (2, 3, 3) and np.all(rates[:, 0, 1] > 0) and np.all(rates <= 1)
    assert result.acceptance.keys() >= {"nni", "spr", "branch_multiplier", "tree_length", "node_slider"}


def test_stopped_and_resumed_run_ends_with_the_same_files(five_taxa, tmp_path):
    settings = MC3Settings(runs=2, chains=2, generations=1200, sample_every=20, block=10)
    whole = mc3(five_taxa, "HKY+G4", settings=settings, seed=5, out=tmp_path / "whole")
    with pytest.raises(Interrupted, match="after 20 generations"):  # the first block is one sample (`block_size`)
        mc3(five_taxa, "HKY+G4", settings=settings, seed=5, out=tmp_path / "parts", stop=StopAfter(1))
    with pytest.raises(jp.InputError, match="holds a run"):
        mc3(five_taxa, "HKY+G4", settings=settings, seed=5, out=tmp_path / "parts")
    with pytest.raises(Interrupted):
        mc3(five_taxa, "HKY+G4", settings=settings, seed=5, out=tmp_path / "parts", resume=True, stop=StopAfter(2))
    resumed = mc3(five_taxa, "HKY+G4", settings=settings, seed=5, out=tmp_path / "parts", resume=True)
    assert resumed.generations == whole.generations == 1200
    for name in ("run1.trees", "run2.log", "splits.tsv", "consensus.tree", "map.tree", "checkpoint.pkl"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    other = MC3Settings(runs=2, chains=2, generations=1200, sample_every=20, block=10, temperature=0.2)
    with pytest.raises(jp.InputError, match="settings.temperature was '0.1' there"):
        mc3(five_taxa, "HKY+G4", settings=other, seed=5, out=tmp_path / "parts", resume=True)


def test_consensus_roots_at_the_first_taxon_when_it_is_not_the_least_name():
    """Samples keep each split as the side without the least taxon name ("a"); the consensus is rooted at the
    alignment's first taxon ("c"). A split holding "c" must enter as its complement, or the tree comes out
    with a one-taxon clade and the wrong topology (it did, for every alignment whose first name is not least)."""
    taxa = ("c", "a", "b", "d", "e")
    truth = jp.parse_newick("((c:1,d:1):1,(a:1,b:1):1,e:1);")
    sample = {split: 0.5 for split in jp.ml.splits(truth)}
    assert frozenset("cd") in sample and frozenset("cde") in sample  # the kernel's sides, both holding "c"
    runs = [RunSamples([0], [sample], [np.ones(5)], [np.zeros(3)])]
    tree = jp.parse_newick(consensus_newick(runs, taxa, 0.0))
    assert tree.topology.num_nodes == 2 * 5 - 2 and jp.ml.robinson_foulds(tree, truth) == 0


def test_mcmc_command_writes_mrbayes_style_outputs(five_taxa, tmp_path):
    path = tmp_path / "five.fasta"
    path.write_text("".join(f">{t}\n{s}\n" for t, s in zip(five_taxa.taxa, five_taxa.sequences)))
    result = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "mcmc", str(path), "-m", "JC", "--generations",
                             "2000", "--sample-every", "20", "--out", str(tmp_path / "run"), "--stop-asdsf", "0.5",
                             "--branch-rate", "5", "--priors", "mrbayes"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "ASDSF" in result.stdout and "swap acceptance" in result.stdout and "generation" in result.stderr
    tree = jp.read_tree(tmp_path / "run" / "consensus.tree")
    assert set(tree.taxa) == set(TAXA)
    assert (tmp_path / "run" / "run1.trees").read_text().rstrip().endswith("End;")
    dry = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "mcmc", str(path), "-m", "JC", "--dry-run",
                          "--out", str(tmp_path / "unused")], capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0 and "5 taxa" in dry.stderr and "one likelihood-and-gradient" in dry.stderr, dry.stderr
    assert not (tmp_path / "unused").exists()
    for wrong in (["-m", "HKY+Q"], ["-m", "JC", "--branch-rate", "0"]):
        bad = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "mcmc", str(path)] + wrong,
                             capture_output=True, text=True, timeout=600)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_mcmc_sigterm_at_a_random_moment_exits_saved_and_resumes_to_the_same_bytes(five_taxa, tmp_path):
    """SIGTERM anywhere in `jaxphylo mcmc` (start-up, compilation, a block): exit 75 within 30 s; `--resume`
    ends with the files of an uninterrupted run."""
    import os
    import time
    from pathlib import Path

    path = tmp_path / "five.fasta"
    path.write_text("".join(f">{t}\n{s}\n" for t, s in zip(five_taxa.taxa, five_taxa.sequences)))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    command = [sys.executable, "-m", "jaxphylo.cli", "mcmc", str(path), "-m", "JC", "--generations", "6000",
               "--sample-every", "20", "--block", "5", "--chains", "2"]
    began = time.perf_counter()
    whole = subprocess.run(command + ["--out", str(tmp_path / "whole")], capture_output=True, text=True, env=env,
                           timeout=600)
    seconds = time.perf_counter() - began
    assert whole.returncode == 0, whole.stderr
    # Within the first 60% of the uninterrupted run (at most 12 s): with the tests' compilation cache the cut run
    # compiles nothing the whole one did not, and takes less than its time.
    _, delay = sigterm_at_random_moment(command + ["--out", str(tmp_path / "cut")], 2.0,
                                        min(12.0, max(4.0, 0.6 * seconds)), env=env)
    resumed = subprocess.run(command + ["--out", str(tmp_path / "cut"), "--resume"], capture_output=True, text=True,
                             env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    for name in ("run1.trees", "run2.log", "splits.tsv", "consensus.tree", "summary.json", "checkpoint.pkl"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), \
            f"{name} (SIGTERM at {delay:.1f} s)"


def test_a_longer_run_compiles_nothing_new(five_taxa):
    """The device program depends on what a generation does, not on how many there are: a run of another length
    (another tuning length too) in the same process compiles nothing."""
    mc3(five_taxa, "JC", runs=1, chains=2, generations=200, sample_every=20, seed=3)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    result = mc3(five_taxa, "JC", runs=1, chains=2, generations=400, sample_every=20, seed=4)
    assert result.generations == 400 and compiles == []


def test_incremental_chains_follow_the_full_recomputation(five_taxa):
    """Keeping partials changes the cost of a generation, not the chain: from one seed, the incremental run and
    the full recomputation (the reference) visit the same trees with log L equal to 1e-9 (the last bits differ
    where a node's rescaling and the sum of scale factors are ordered differently)."""
    common = dict(runs=1, chains=2, generations=600, sample_every=20, block=10)
    runs = [mc3(five_taxa, "HKY+G4", settings=MC3Settings(incremental=inc, **common), seed=8) for inc in (True, False)]
    (a,), (b,) = (r.runs for r in runs)
    assert a.splits == b.splits and runs[0].acceptance == runs[1].acceptance
    np.testing.assert_allclose(np.asarray(a.columns)[:, 0], np.asarray(b.columns)[:, 0], rtol=1e-9, atol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_fused_generations_recover_the_prior(fused, monkeypatch):
    """`fused_generations`: after every generation, 8 more per chain (NNI and branch multiplier, weights 1:1), in
    one launch of the fused kernel (`kernels.fused_generations`, interpreted on a CPU: fused=True) or one at a
    time (the fallback); on an alignment of missing data (log L = 0 for every tree, so the kept partials are used
    and the target is the prior): tree length ~ Gamma(7, 10) and uniform topologies, as for every move. Eight in
    nine generations are the block's, so a wrong block moves the tree length far outside the bounds (dropping
    the multiplier's log m in the kernel gave a mean 16% low)."""
    from jaxphylo.likelihood import kernels

    monkeypatch.setattr(kernels, "fuses_generations", lambda states, patterns, categories: fused)
    simulated = jp.simulate(jp.random_topology_tree(TAXA, seed=1), jp.parse_model("JC"), 20, seed=1)
    alignment = jp.Alignment(TAXA, ("N" * 20,) * 5, simulated.alphabet)
    settings = MC3Settings(runs=16, chains=1, generations=5 * 2000, sample_every=5, tune=0, block=500,
                           moves={"nni": 1, "branch_multiplier": 1}, fused_generations=8)
    result = mc3(alignment, "JC", settings=settings, seed=3)
    assert_prior_trees(result)
    np.testing.assert_allclose(np.asarray([run.columns for run in result.runs])[..., 0], 0.0, atol=1e-10)
    assert 0.3 < result.acceptance["branch_multiplier"] < 0.9 and 0.9 < result.acceptance["nni"] <= 1.0


def test_fused_generations_keep_the_chains_precision_in_float32(five_taxa, monkeypatch):
    """Under `precision="float32"` the partials and `P` are float32 but lengths, log L and the accept rule keep
    the chains' float64: the fused block must hand back the state's dtypes (or the block's loop does not trace)
    and log L must be the sampled trees' (float32 partials: 1e-5 relative)."""
    from jaxphylo.likelihood import kernels

    monkeypatch.setattr(kernels, "fuses_generations", lambda states, patterns, categories: True)
    settings = MC3Settings(runs=1, chains=2, generations=200, sample_every=20, block=5, fused_generations=4)
    result = mc3(five_taxa, "JC", settings=settings, seed=2, precision="float32")
    (run,) = result.runs
    columns = np.asarray(run.columns)
    assert columns.dtype == np.float64 and np.all(np.isfinite(columns))
    assert result.acceptance["nni"] > 0 and result.acceptance["branch_multiplier"] > 0


def test_fused_generations_settings_are_checked():
    with pytest.raises(jp.InputError, match="--fused-generations must not be negative"):
        MC3Settings(fused_generations=-1)
    with pytest.raises(jp.InputError, match="needs a positive weight on nni or branch_multiplier"):
        MC3Settings(fused_generations=4, moves={"spr": 1.0})
