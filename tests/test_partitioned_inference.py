"""Partitioned models in inference: ML fits against IQ-TREE 2 (`-p/-q/-Q FILE -te TREE`), the search's NNI
scores and Newton derivatives summed over parts, search + bootstrap + SH-aLRT, NUTS (`sample -p`) and MC³
(`mcmc -p`) on partitioned models.

The IQ-TREE fits run in a second each. Our fits stop when log L gains less than 1e-3 over five L-BFGS
iterations; on these data that leaves them up to 0.015 below a fully converged optimum (IQ-TREE's stop is
per round of its coordinate-wise optimiser), so the bar is `ours >= IQ-TREE - 0.02`.
"""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import check_spr_scores, require

import jaxphylo as jp
from jaxphylo import ml
from jaxphylo.tree import phase_widths
from jaxphylo.io import read_partitions
from jaxphylo.likelihood import batch_pattern_log_likelihoods
from jaxphylo.ml import apply_nnis, nni_scores, node_branch_derivatives
from jaxphylo.tree import kernel_batch
from jaxphylo.likelihood import partitioned_data


def write(path, text):
    path.write_text(text)
    return path


def two_genes(tmp_path, models="HKY+G4:g1, JC:g2", sites=(0, 600, 1200)):
    charsets = f"charset g1 = {sites[0] + 1}-{sites[1]};\ncharset g2 = {sites[1] + 1}-{sites[2]};\n"
    return write(tmp_path / "genes.nex", f"#nexus\nbegin sets;\n{charsets}charpartition m = {models};\nend;\n")


def iqtree_log_likelihood(alignment_path, flag, partition, tree_path, prefix):
    require("iqtree2")
    subprocess.run(["iqtree2", "-s", str(alignment_path), flag, str(partition), "-te", str(tree_path), "-pre",
                    str(prefix), "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"], check=True,
                   capture_output=True, timeout=300)
    return float(prefix.with_suffix(".iqtree").read_text().split("Log-likelihood of the tree:")[1].split()[0])


def test_partitioned_fit_reaches_iqtree_in_every_link_mode(tmp_path):
    """`ml.fit` on the example split in two genes (HKY+G4 and GTR+F+I): model, part rates (-p) and branch
    lengths (per part with -Q) against IQ-TREE's own fit on the same topology; -te through the CLI for -Q.
    (On this partition -q fits give -4652.9945 against IQ-TREE's -4652.9881.)"""
    alignment_path, tree_path = jp.example_paths()
    alignment, tree = jp.read_alignment(alignment_path), jp.read_tree(tree_path)
    partition = two_genes(tmp_path, "HKY+G4:g1, GTR+F+I:g2", (0, 300, 600))
    theirs = iqtree_log_likelihood(alignment_path, "-p", partition, tree_path, tmp_path / "p")
    result = ml.fit(alignment, tree, jp.partitioned_model(read_partitions(partition), alignment))
    assert theirs - 0.02 <= result.log_likelihood <= theirs + 0.05, (result.log_likelihood, theirs)
    assert float(jp.log_likelihood(alignment, result.tree, result.model)) == pytest.approx(result.log_likelihood,
                                                                                          abs=1e-6)
    assert set(result.parameters) == {"g1.kappa", "g1.gamma_shape", "g2.gtr_rates", "g2.proportion_invariant",
                                      "part_rates"}  # -q (equal lengths): the same code without part_rates
    theirs = iqtree_log_likelihood(alignment_path, "-Q", partition, tree_path, tmp_path / "Q")
    run = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "ml", str(alignment_path), "-m", "GTR+G4", "-Q",
                          str(partition), "-te", str(tree_path), "-o", str(tmp_path / "ours")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert theirs - 0.02 <= float(run.stdout) <= theirs + 0.05
    part_trees = [t for t in (tmp_path / "ours.parttrees").read_text().split(";") if t.strip()]
    assert len(part_trees) == 2 and json.loads((tmp_path / "ours.json").read_text())["model"].endswith(":g2")


def test_partitioned_nni_scores_and_newton_derivatives_are_exact(tmp_path):
    """Summed over parts of two groups (4 and 1 categories), each NNI's gain with its fitted central branch is
    the change of the whole partitioned log L, per pattern too (and so UFBoot's RELL values); Newton's
    derivatives equal finite differences.
    With linked lengths (one central branch, `r_k t` in part k) and unlinked ones (each part's own)."""
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(9)], seed=4), jp.parse_model("JC"),
                            300, seed=2)
    scheme = read_partitions(write(tmp_path / "p.nex", "#nexus\nbegin sets;\ncharset a = 1-100;\n"
                                   "charset b = 101-300\\2;\ncharset c = 102-300\\2;\ncharpartition m = "
                                   "HKY{2.5}+F{0.3,0.2,0.2,0.3}+G4{0.3}:a, JC+I{0.2}:b, GTR{1,2,1,1,3}+F+G4{1.2}:c;\n"
                                   "end;\n"))
    model = jp.partitioned_model(scheme, alignment, rates=[0.5, 1.5, 1.0])
    trees = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=k) for k in (7, 8)])
    data = partitioned_data(alignment, trees, model)
    weights = jnp.broadcast_to(data.weights, (2, data.weights.shape[0]))

    def log_l(parents, lengths, model=model):
        per = batch_pattern_log_likelihoods(model, parents, lengths, data, phase_widths(9), jnp.float64)
        return jnp.sum(weights * per, axis=-1)

    now = log_l(trees.parents, trees.branch_lengths)
    for b, t in enumerate(trees.to_trees(rooted=False)):
        assert float(now[b]) == pytest.approx(float(jp.log_likelihood(alignment, t, model)), abs=1e-8)
    scores = nni_scores(trees.parents, trees.branch_lengths, model, data, weights, phase_widths(9), jnp.float64,
                        True)
    edges = scores.gains.shape[1]
    for k in np.flatnonzero(np.asarray(scores.valid[0])):
        for which in (0, 1):
            chosen = jnp.zeros((2, edges), bool).at[:, k].set(scores.valid[:, k])
            after = log_l(*apply_nnis(trees.parents, trees.branch_lengths, scores, chosen, jnp.full((2, edges), which)))
            expected = np.where(scores.valid[:, k], scores.gains[:, k, which], 0)
            np.testing.assert_allclose(after - now, expected, atol=1e-8)
            per_pattern = jnp.sum(weights * scores.pattern_gains[:, k, which], axis=-1)
            np.testing.assert_allclose(np.where(scores.valid[:, k], per_pattern, 0), expected, atol=1e-8)
    # UFBoot's RELL values read the parts' patterns in the weights' layout: each tree's own is its per-pattern
    # log L times the counts, its best neighbour the best of the per-pattern gains times the counts.
    counts = jnp.asarray(np.random.default_rng(1).poisson(np.asarray(data.weights), (5, data.weights.shape[0])),
                         jnp.float64)
    rell = nni_scores(trees.parents, trees.branch_lengths, model, data, weights, phase_widths(9), jnp.float64,
                      rell=counts).rell
    per = batch_pattern_log_likelihoods(model, trees.parents, trees.branch_lengths, data, phase_widths(9), jnp.float64)
    np.testing.assert_allclose(rell.tree, per @ counts.T, rtol=1e-10)
    resampled = jnp.where(scores.valid[:, None, :, None],
                          jnp.einsum("bejp,rp->brej", scores.pattern_gains, counts), -jnp.inf).reshape(2, 5, -1)
    np.testing.assert_allclose(rell.gain, resampled.max(-1), atol=1e-8)
    first, second, value = node_branch_derivatives(trees.parents, trees.branch_lengths, model, data, weights,
                                                   phase_widths(9), jnp.float64)
    np.testing.assert_allclose(value, now, atol=1e-8)
    h = 1e-4
    for node in (2, 11):
        step = jnp.zeros_like(trees.branch_lengths).at[:, node].set(h)
        up, down = log_l(trees.parents, trees.branch_lengths + step), log_l(trees.parents, trees.branch_lengths - step)
        np.testing.assert_allclose(first[:, node], (up - down) / (2 * h), rtol=1e-5)  # O(h^2) truncation
        np.testing.assert_allclose(second[:, node], (up - 2 * now + down) / h**2, rtol=1e-3)
    # Unlinked (-Q): every part its own lengths [B, M, K], its own central branch and its own Newton slopes.
    model = jp.partitioned_model(scheme, alignment, link="unlinked")
    lengths = trees.branch_lengths[..., None] * jnp.asarray([0.5, 1.5, 3.0])
    now = log_l(trees.parents, lengths, model)
    tree, with_lengths = ml.searched_result(trees.parents[0], lengths[0], trees.taxa, model)
    assert float(now[0]) == pytest.approx(float(jp.log_likelihood(alignment, tree, with_lengths)), abs=1e-8)
    scores = nni_scores(trees.parents, lengths, model, data, weights, phase_widths(9), jnp.float64, True)
    assert scores.lengths.shape == (2, edges, 2, 3)
    for k in np.flatnonzero(np.asarray(scores.valid[0]))[:3]:
        chosen = jnp.zeros((2, edges), bool).at[:, k].set(scores.valid[:, k])
        after = log_l(*apply_nnis(trees.parents, lengths, scores, chosen, jnp.ones((2, edges), int)), model)
        np.testing.assert_allclose(after - now, np.where(scores.valid[:, k], scores.gains[:, k, 1], 0), atol=1e-8)
        per_pattern = jnp.sum(weights * scores.pattern_gains[:, k, 1], axis=-1)
        np.testing.assert_allclose(np.where(scores.valid[:, k], per_pattern, 0), after - now, atol=1e-8)
    first, _, value = node_branch_derivatives(trees.parents, lengths, model, data, weights, phase_widths(9),
                                              jnp.float64)
    np.testing.assert_allclose(value, now, atol=1e-8)
    step = jnp.zeros_like(lengths).at[:, 11, 2].set(h)
    up, down = log_l(trees.parents, lengths + step, model), log_l(trees.parents, lengths - step, model)
    np.testing.assert_allclose(first[:, 11, 2], (up - down) / (2 * h), rtol=1e-5)


def test_partitioned_spr_scores_are_exact(tmp_path):
    """Lazy SPR scores summed over the parts of two groups equal the regrafted trees' partitioned log L: with
    linked lengths (`r_k t` in part k, one set of new branches) and unlinked ones (each part fits its own)."""
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(8)], seed=4), jp.parse_model("JC"),
                            240, seed=2)
    scheme = read_partitions(write(tmp_path / "p.nex", "#nexus\nbegin sets;\ncharset a = 1-120;\n"
                                   "charset b = 121-240;\ncharpartition m = HKY{2.5}+F{0.3,0.2,0.2,0.3}+G4{0.3}:a, "
                                   "JC+I{0.2}:b;\nend;\n"))
    trees = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=7)])
    for model, lengths in ((jp.partitioned_model(scheme, alignment, rates=[0.5, 1.5]), trees.branch_lengths),
                           (jp.partitioned_model(scheme, alignment, link="unlinked"),
                            trees.branch_lengths[..., None] * jnp.asarray([0.5, 2.0]))):
        data = partitioned_data(alignment, trees, model)

        def log_l(parents, lengths, model=model, data=data):
            weights = jnp.broadcast_to(data.weights, (parents.shape[0], data.weights.shape[0]))
            return jnp.sum(weights * batch_pattern_log_likelihoods(model, parents, lengths, data, phase_widths(8),
                                                                    jnp.float64), axis=-1)

        scores = check_spr_scores(alignment, model, data, trees, lengths, 1, log_l)
        assert scores.lengths.shape[1:] == (3,) + lengths.shape[2:]


@pytest.fixture(scope="module")
def genes(tmp_path_factory):
    """Two genes on one 8-taxon tree: HKY+G4, and JC at three times the rate."""
    tmp = tmp_path_factory.mktemp("genes")
    truth = jp.random_topology_tree([f"s{i}" for i in range(8)], seed=11, mean_branch_length=0.08)
    truth = truth.with_branch_lengths(np.asarray(truth.branch_lengths) + 0.04)
    first = jp.simulate(truth, jp.parse_model("HKY{3}+F{0.3,0.2,0.2,0.3}+G4{0.8}"), 500, seed=5)
    second = jp.simulate(truth.with_branch_lengths(3 * np.asarray(truth.branch_lengths)), jp.parse_model("JC"), 500,
                         seed=6)
    write(tmp / "genes.fasta", "".join(f">{t}\n{x}{y}\n" for t, x, y in zip(first.taxa, first.sequences,
                                                                           second.sequences)))
    return truth, tmp / "genes.fasta", two_genes(tmp, sites=(0, 500, 1000))


def test_partitioned_search_bootstrap_and_alrt(genes, tmp_path):
    """`jaxphylo ml ALN -p FILE`: the true tree, the rate ratio, supports; bootstrap replicates resample within
    parts; a -Q search finds the tree with every part's lengths. (NNI only: SPR scores candidates by the same
    batched likelihood, which the test above checks.)"""
    truth, alignment_path, partition = genes
    run = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "ml", str(alignment_path), "-m", "HKY+G4", "-p",
                          str(partition), "--patience", "1", "--batch", "2", "--radius", "0", "--ninit", "4", "--ntop", "2",
                          "--bootstrap", "2",
                          "--alrt", "100",
                          "-o", str(tmp_path / "run")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    found = jp.read_tree(tmp_path / "run.treefile")
    assert ml.robinson_foulds(found, truth) == 0
    rates = summary["parameters"]["part_rates"]
    assert rates[1] / rates[0] == pytest.approx(3.0, rel=0.25) and np.mean(rates) == pytest.approx(1.0)
    assert summary["support_labels"] == "SH-aLRT/bootstrap" and summary["model"].startswith("HKY85")
    alignment = jp.read_alignment(alignment_path)
    model = jp.partitioned_model(read_partitions(partition), alignment)
    resampling = ml._support.Resampling(alignment, model, partitioned_data(alignment, truth, model))
    counts = resampling.counts(resampling.draw(4, seed=3))
    parts = partitioned_data(alignment, truth, model).part_of_pattern
    assert [set(counts[:, parts == k].sum(axis=1)) for k in (0, 1)] == [{500}, {500}]
    # -Q: every part its own lengths through the search (Newton steps, the GPU's default) and SH-aLRT.
    unlinked = jp.partitioned_model(read_partitions(partition), alignment, default_model="HKY+G4", link="unlinked")
    result = ml.search(alignment, unlinked, settings=ml.SearchSettings(patience=0, batch=2, radius=0, starts=1, top=2,
                                                                       lengths_method="newton"))
    assert ml.robinson_foulds(result.tree, truth) == 0 and result.model.branch_lengths.shape == (2, 14)
    assert result.log_likelihood == pytest.approx(float(jp.log_likelihood(alignment, result.tree, result.model)),
                                                  abs=1e-6)
    assert result.log_likelihood >= summary["log_likelihood"] - 1e-3  # -Q nests -p
    lengths = np.asarray(result.model.branch_lengths)
    assert lengths[1].sum() / lengths[0].sum() == pytest.approx(3.0, rel=0.25)
    assert set(ml.sh_alrt(alignment, result, replicates=100).values()) == {100.0}


def test_partitioned_sample_and_mcmc(genes, tmp_path):
    """MC³ (`mcmc -p`) runs on a partitioned model and logs every part's parameters, its batched likelihood with
    per-chain partitioned models equals the partitioned log L of each chain's tree (with -p, and with -Q every
    part's edges); NUTS's model (`sample -p`) has the partitioned log density."""
    from numpyro.infer.util import log_density

    from jaxphylo.inference import Analysis, prepare
    from jaxphylo.inference.mc3 import MC3Settings
    from jaxphylo.tree import from_view
    from jaxphylo.inference.mc3 import starting_state

    truth, alignment_path, partition = genes
    alignment = jp.read_alignment(alignment_path)
    model = jp.partitioned_model(read_partitions(partition), alignment, default_model="HKY+G4")
    posterior, tempered, _ = starting_state(alignment, model, MC3Settings(runs=1, chains=2), seed=1)
    state = tempered.chains.position
    params = jax.tree.map(lambda x: x + 0.1 * jnp.arange(2.0).reshape((2,) + (1,) * (x.ndim - 1)), state.params)
    values = posterior.log_likelihoods(state.up, state.edge, state.root, params)
    parents, lengths = jax.vmap(from_view)(state.up, state.edge, state.root)
    for b, tree in enumerate(jp.TreeBatch(parents, lengths, tuple(alignment.taxa)).to_trees(rooted=False)):
        chain_model = posterior.coordinates.model(jax.tree.map(lambda x: x[b], params))
        assert float(values[b]) == pytest.approx(float(jp.log_likelihood(alignment, tree, chain_model)), abs=1e-8)
    assert set(state.params) == {"g1.gamma_shape", "g1.kappa", "part_rates"}

    run = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "mcmc", str(alignment_path), "-m", "HKY+G4", "-p",
                          str(partition), "--runs", "1", "--chains", "2", "--generations", "200", "--sample-every",
                          "50", "-o", str(tmp_path / "mc3")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "part_rates.2" in run.stdout and "g1.kappa" in run.stdout
    # NUTS's model (what `sample -p` runs): its log density at the start is the partitioned log L plus the priors.
    analysis = Analysis(model="HKY+G4", partitions=str(partition))
    prepared = prepare(alignment, truth, analysis)
    density, trace = log_density(prepared.model, (prepared.data,), {}, prepared.init)
    start = prepared.substitution.with_parts(
        prepared.substitution.models, prepared.init["part_rates"])  # kappa, shape: the parsed model's starts
    expected = float(jp.log_likelihood(alignment, prepared.tree.with_branch_lengths(
        jnp.append(prepared.init["branch_lengths"], 0.0)), start))
    priors = sum(float(jnp.sum(site["fn"].log_prob(site["value"]))) for name, site in trace.items()
                 if site["type"] == "sample" and name != "alignment")
    assert float(density) == pytest.approx(expected + priors, abs=1e-8)
    assert {"g1.kappa", "g1.gamma_shape", "part_rates", "part_rate_multipliers"} <= set(trace)
    jp.write_tree(truth, tmp_path / "truth.nwk")
    bad = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "sample", str(alignment_path),
                          str(tmp_path / "truth.nwk"), "--clock", "strict", "-Q", str(partition)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "-p or -q" in bad.stderr, bad.stderr
    # MC³ with -Q: every chain's edges per part [B, M, K] (the moves' prior checks are in test_mc3.py).
    unlinked = jp.partitioned_model(read_partitions(partition), alignment, default_model="HKY+G4", link="unlinked")
    posterior, tempered, _ = starting_state(alignment, unlinked, MC3Settings(runs=1, chains=2), seed=1)
    state = tempered.chains.position
    edge = state.edge * jnp.asarray([1.0, 2.5])
    values = posterior.log_likelihoods(state.up, edge, state.root, params)
    parents, lengths = jax.vmap(from_view)(state.up, edge, state.root)
    for b in range(2):
        chain_model = posterior.coordinates.model(jax.tree.map(lambda x: x[b], params))
        tree, chain_model = ml.searched_result(parents[b], lengths[b], tuple(alignment.taxa), chain_model)
        assert float(values[b]) == pytest.approx(float(jp.log_likelihood(alignment, tree, chain_model)), abs=1e-8)


@pytest.mark.parametrize("command", ["ml", "sample", "mcmc"])
def test_commands_take_a_file_naming_every_model_without_m(genes, tmp_path, capsys, command):
    """`ml`, `sample` and `mcmc` with a partition file that names every part's model (K80:g1, JC:g2: one group,
    small programs) need no -m, as IQ-TREE does; tiny runs, one link mode each (ml -p, sample -Q, mcmc -q: MC³'s
    chains under -q once failed, their per-chain models' equal-length rates one vector for all chains)."""
    from jaxphylo import cli

    truth, alignment_path, _ = genes
    partition = two_genes(tmp_path, "K80:g1, JC:g2", (0, 500, 1000))
    jp.write_tree(truth, tmp_path / "truth.nwk")
    out = str(tmp_path / "out")
    argv = {"ml": ["-p", str(partition), "-te", str(tmp_path / "truth.nwk"), "-o", out],
            "sample": [str(tmp_path / "truth.nwk"), "-Q", str(partition), "--chains", "1", "--warmup", "20",
                       "--samples", "10", "--no-progress", "-o", out],
            "mcmc": ["-q", str(partition), "--runs", "1", "--chains", "2", "--generations", "100",
                     "--sample-every", "50", "-o", out]}[command]
    assert cli.main([command, str(alignment_path), *argv]) == 0
    printed = capsys.readouterr().out
    if command == "ml":
        summary = json.loads((tmp_path / "out.json").read_text())
        assert set(summary["parameters"]) == {"g1.kappa", "part_rates"}
        assert summary["model"].startswith("K80") and summary["model"].endswith("JC69:g2")
        assert float(printed) == pytest.approx(summary["log_likelihood"], abs=1e-6)
    elif command == "sample":  # -Q: every part's branch lengths, no part rates
        assert "g1.kappa" in printed and "part_branch_lengths" in printed and "part_rates" not in printed
    else:  # -q: one set of lengths, no part rates
        assert "g1.kappa" in printed and "part_rates" not in printed
