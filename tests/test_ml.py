"""Maximum likelihood: fits against IQ-TREE 2, exact NNI scores, search, support, compilations, the CLI.

Fit tolerance: our optimum may not be more than 0.01 below IQ-TREE's with
`--epsilon 1e-6` (its optimiser run to convergence; IQ-TREE prints four
decimals), nor suspiciously far above it (0.05: a different model would show
as more than that). NNI scores are checked against whole-tree likelihoods to
1e-8 (both float64; the only difference is the order of the sums).
"""

import json
import logging
from dataclasses import replace
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo import ml
from jaxphylo.runtime import Interrupted
from jaxphylo.tree import phase_widths
from jaxphylo.likelihood import batch_data_log_likelihoods, pattern_data
from jaxphylo.ml import apply_nnis, nni_scores, regraft_edges
from jaxphylo.tree import kernel_batch
from conftest import StopAfter, check_spr_scores, dataset, require, sigterm_at_random_moment, write_fasta


def iqtree_fit(alignment_path, tree_path, model, workdir, data_type=None) -> float:
    """IQ-TREE's maximum log L on a fixed topology (lengths and parameters optimised, tight tolerance)."""
    require("iqtree2")
    command = ["iqtree2", "-s", str(alignment_path), "-te", str(tree_path), "-m", model, "--epsilon", "1e-6",
               "-pre", str(workdir / "fit"), "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"]
    command += ["-st", data_type] if data_type else []
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    text = (workdir / "fit.iqtree").read_text()
    return float(re.search(r"Log-likelihood of the tree: (-?[\d.]+)", text).group(1))


def check_fit(alignment_path, tree_path, model, workdir, iq_type=None, **read):
    alignment = jp.read_alignment(alignment_path, **read)
    ours = ml.fit(alignment, jp.read_tree(tree_path), model)
    reference = iqtree_fit(alignment_path, tree_path, model, workdir, iq_type)
    assert reference - 0.01 < ours.log_likelihood < reference + 0.05, (model, ours.log_likelihood, reference)
    again = jp.log_likelihood(alignment, ours.tree, jp.parse_model(ours.model_string, alignment))
    assert float(again) == pytest.approx(ours.log_likelihood, abs=0.05)  # the written model string is the model
    return ours


@pytest.mark.parametrize("model", ["GTR+G4", "HKY+I+G4"])
def test_fit_reaches_iqtree_optimum_on_real_data(model, tmp_path):
    folder = dataset("DS1")
    check_fit(folder / "alignment.fasta", folder / "tree.nwk", model, tmp_path)


def test_fit_reaches_iqtree_optimum_for_a_protein_model(tmp_path):
    taxa = [f"p{i}" for i in range(10)]
    truth = jp.random_topology_tree(taxa, seed=2, mean_branch_length=0.15)
    alignment = jp.simulate(truth, jp.parse_model("LG+G4{0.7}"), 300, seed=3)
    jp.write_tree(truth, tmp_path / "tree.nwk")
    check_fit(write_fasta(alignment, tmp_path / "aln.fasta"), tmp_path / "tree.nwk", "LG+G4", tmp_path, "AA",
              data_type="protein")


def test_fit_keeps_values_in_braces_fixed_and_lengths_in_bounds():
    truth = jp.random_topology_tree([f"t{i}" for i in range(8)], seed=1, mean_branch_length=0.1)
    alignment = jp.simulate(truth, jp.parse_model("HKY{4}+F{0.3,0.2,0.2,0.3}+G4{0.5}"), 400, seed=1)
    result = ml.fit(alignment, truth, "HKY{4}+G4", optimizer="adam", max_iterations=50)
    assert set(result.parameters) == {"gamma_shape"}
    assert float(result.model.substitution.kappa) == 4.0
    lengths = np.asarray(result.tree.branch_lengths)[:-1]
    assert (lengths >= 1e-6).all() and (lengths <= 10).all()
    with pytest.raises(jp.ModelError, match="optimizer"):
        ml.fit(alignment, truth, "HKY", optimizer="newton")


def test_a_fit_leaves_a_rate_on_the_boundary_and_polishes_short_branches():
    """A model whose GTR rate an earlier fit drove to 1e-15 (the search's refits start from the last model):
    the fit reaches the fresh fit's optimum instead of staying there (rsv2's search ended 1.7 log L low)."""
    truth = jp.random_topology_tree([f"t{i}" for i in range(10)], seed=3, mean_branch_length=0.1)
    alignment = jp.simulate(truth, jp.parse_model("GTR{1,3,1,0.5,4,1}+F{0.3,0.2,0.2,0.3}"), 600, seed=5)
    free = frozenset({"exchangeabilities", "frequencies"})
    fits = [ml.fit(alignment, truth, jp.parse_model(f"GTR{{1,3,1,{rate},4,1}}+F{{0.3,0.2,0.2,0.3}}"), estimate=free)
            for rate in ("0.5", "1e-15")]
    assert fits[1].log_likelihood == pytest.approx(fits[0].log_likelihood, abs=1e-2)  # the fits' tolerance
    c_to_g = [float(f.model.substitution.rates[3] / f.model.substitution.rates[5]) for f in fits]  # G<->T = 1
    assert c_to_g[1] == pytest.approx(c_to_g[0], rel=0.02)
    # Without the Newton polish of the lengths these fits stopped 0.19 below the string's: one branch at 2e-4,
    # its optimum 3.3e-3, where L-BFGS's logit coordinate barely moves.
    assert fits[0].log_likelihood == pytest.approx(ml.fit(alignment, truth, "GTR+FO").log_likelihood, abs=1e-2)


def nine_taxa_two_trees():
    """A 9-taxon JC alignment, an HKY+G4 model, two random kernel trees, their pattern data and weights."""
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(9)], seed=4), jp.parse_model("JC"),
                            200, seed=2)
    model = jp.parse_model("HKY{2.5}+F{0.3,0.2,0.2,0.3}+G4{0.3}")
    trees = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=k) for k in (7, 8)])
    data = pattern_data(alignment, trees)
    weights = jnp.broadcast_to(data.weights, (2, data.weights.shape[0]))
    return model, trees, data, weights


def test_nni_scores_equal_whole_tree_likelihoods():
    model, trees, data, weights = nine_taxa_two_trees()
    scores = jax.jit(nni_scores, static_argnums=(5, 6))(trees.parents, trees.branch_lengths, model, data, weights,
                                                        phase_widths(9), jnp.float64)
    now = batch_data_log_likelihoods(data, trees, model)
    k_edges = scores.gains.shape[1]
    assert int(scores.valid.sum()) == 2 * (9 - 3)  # every internal edge of an unrooted binary tree
    for k in np.flatnonzero(np.asarray(scores.valid[0])):
        for which in (0, 1):
            chosen = jnp.zeros((2, k_edges), bool).at[:, k].set(scores.valid[:, k])
            parents, lengths = apply_nnis(trees.parents, trees.branch_lengths, scores, chosen,
                                          jnp.full((2, k_edges), which))
            after = batch_data_log_likelihoods(data, jp.TreeBatch(parents, lengths, trees.taxa), model)
            np.testing.assert_allclose(after - now, np.where(scores.valid[:, k], scores.gains[:, k, which], 0),
                                       atol=1e-8)


def test_rell_scores_equal_per_pattern_likelihoods_under_resampled_counts():
    """UFBoot's RELL values (`nni_scores(..., rell=counts)`) against the per-pattern path SH-aLRT uses: each
    tree's own value is `counts @ log L_p`, and its best neighbour per replicate is the best valid (edge, swap)
    of `counts @ (log L_p after - log L_p now)`, to 1e-8 (float64, sums in another order); a floor on the
    neighbours' log L leaves out exactly those below it."""
    model, trees, data, weights = nine_taxa_two_trees()
    counts = jnp.asarray(ml.UFBoot(ml.UFBootSettings(), np.asarray(data.weights), None, 3, trees.taxa).counts[:7])
    score = jax.jit(nni_scores, static_argnums=(5, 6, 7))
    plain = score(trees.parents, trees.branch_lengths, model, data, weights, phase_widths(9), jnp.float64, True)
    rell = score(trees.parents, trees.branch_lengths, model, data, weights, phase_widths(9), jnp.float64, False,
                 counts).rell
    per_tree = jp.likelihood.batch_pattern_log_likelihoods(model, trees.parents, trees.branch_lengths, data,
                                                           phase_widths(9), jnp.float64)
    np.testing.assert_allclose(rell.tree, per_tree @ counts.T, rtol=1e-10)
    np.testing.assert_allclose(rell.log_likelihood, batch_data_log_likelihoods(data, trees, model), rtol=1e-10)
    resampled = jnp.einsum("bejp,rp->brej", plain.pattern_gains, counts)
    resampled = jnp.where(plain.valid[:, None, :, None], resampled, -jnp.inf).reshape(2, 7, -1)
    np.testing.assert_allclose(rell.gain, resampled.max(-1), atol=1e-8)
    np.testing.assert_array_equal(jnp.take_along_axis(resampled, rell.move[..., None], -1)[..., 0], rell.gain)
    # A floor between the neighbours' log L: those below it are never a replicate's best.
    after = rell.log_likelihood[:, None, None] + plain.gains  # [B, E, 2]
    floor = float(jnp.median(after[jnp.isfinite(after)]))
    floored = score(trees.parents, trees.branch_lengths, model, data, weights, phase_widths(9), jnp.float64, False,
                    counts, floor).rell
    kept = jnp.where((after >= floor)[:, None].reshape(2, 1, -1), resampled, -jnp.inf)
    np.testing.assert_allclose(floored.gain, kept.max(-1), atol=1e-8)


def _ufboot_scores(own, tree_rell):
    """Scores as `UFBoot.observe` reads them, for trees whose neighbours are all left out."""
    from types import SimpleNamespace

    own, tree_rell = np.atleast_1d(own).astype(float), np.atleast_2d(tree_rell).astype(float)
    b, r = tree_rell.shape
    return SimpleNamespace(rell=SimpleNamespace(log_likelihood=own, tree=tree_rell, gain=np.full((b, r), -np.inf),
                                                move=np.zeros((b, r), int)),
                           nodes=np.zeros((b, 1, 5), int), lengths=np.zeros((b, 1, 2)), gains=np.zeros((b, 1, 2)))


def test_ufboot_keeps_the_best_tree_per_replicate_and_shares_ties():
    """A replicate keeps the tree with the highest RELL log L; a tree within the tie tolerance replaces the kept
    one with probability 1/(c + 1), c the ties accepted so far, a tree met again too (UFBoot2's rule as IQ-TREE
    applies it), and a tree far below every kept tree's log L is no candidate (IQ-TREE's cutoff)."""
    taxa = [f"t{i}" for i in range(6)]
    a, b, c = (kernel_batch([jp.random_topology_tree(taxa, seed=k)]) for k in (1, 3, 4))
    assert len({frozenset(ml.splits(t)) for t in (a.to_trees()[0], b.to_trees()[0], c.to_trees()[0])}) == 3
    boot = ml.UFBoot(ml.UFBootSettings(2000), np.array([3.0, 2.0, 5.0]), None, 0, taxa)
    r = boot.replicates
    observe = lambda t, own, value: boot.observe(t.parents, t.branch_lengths, _ufboot_scores(own, value))  # noqa
    observe(a, -100.0, np.full(r, -100.0))
    observe(b, -100.2, np.full(r, -100.1))  # a tie (within 0.5): kept by about half
    share_b = np.mean([k == boot.key(np.asarray(b.parents[0])) for k in boot.keys])
    assert 0.45 < share_b < 0.55, share_b
    observe(a, -100.0, np.full(r, -100.0))  # `a` again: a third offer, kept by 1/3 of b's and 1/2 of a's
    share_b = np.mean([k == boot.key(np.asarray(b.parents[0])) for k in boot.keys])
    assert 0.30 < share_b < 0.37, share_b
    observe(c, -102.0, np.full(r, -50.0))  # far better RELL, but more than 1 below every kept tree's log L
    assert boot.best.max() < -99
    values = np.where(np.arange(r) < r // 4, -90.0, -120.0)
    observe(c, -100.5, values)  # within the cutoff: a quarter of the replicates now prefer it
    supports = boot.split_supports()
    for split in ml.splits(c.to_trees()[0]):
        assert supports[split] >= 25.0
    assert sum(k == boot.key(np.asarray(c.parents[0])) for k in boot.keys) == r // 4
    saved = boot.state()
    again = ml.UFBoot(ml.UFBootSettings(2000), np.array([3.0, 2.0, 5.0]), None, 0, taxa)
    again.restore(saved)
    assert again.split_supports() == supports


def test_ufboot_offers_the_neighbour_of_a_tree_below_the_cutoff():
    """A tree below the cutoff is no candidate, but its NNI neighbours above it are (IQ-TREE saves every
    neighbour it evaluates by the neighbour's own log L): replicates keep those neighbours."""
    model, trees, data, weights = nine_taxa_two_trees()
    score = jax.jit(nni_scores, static_argnums=(5, 6, 7))
    plain = score(trees.parents[:1], trees.branch_lengths[:1], model, data, weights[:1], phase_widths(9), jnp.float64,
                  True)
    own = float(batch_data_log_likelihoods(data, trees, model)[0])
    best_gain = float(jnp.max(plain.gains))
    assert best_gain > 0.01
    boot = ml.UFBoot(ml.UFBootSettings(), np.asarray(data.weights), None, 3, trees.taxa)
    boot.original[:] = own + ml._ufboot.CUTOFF_MARGIN + best_gain / 2  # the floor: halfway to the best neighbour
    floor = boot.floor(jnp.float64)
    scores = score(trees.parents[:1], trees.branch_lengths[:1], model, data, weights[:1], phase_widths(9),
                   jnp.float64, False, boot.device_counts(jnp.float64), floor)
    boot.observe(trees.parents[:1], trees.branch_lengths[:1], scores)
    itself = boot.key(np.asarray(trees.parents[0]))
    kept = [k for k in range(boot.replicates) if boot.keys[k] is not None]
    assert len(kept) == boot.replicates and all(boot.keys[k] != itself for k in kept)
    assert np.all(boot.original >= float(floor) - 1e-9)


def test_ufboot_settles_when_supports_stop_moving():
    """The search may stop once two checks `check_every` perturbed trees apart correlate by `min_correlation`,
    or at `max_perturbed`."""
    taxa = [f"t{i}" for i in range(6)]
    a, b = (kernel_batch([jp.random_topology_tree(taxa, seed=k)]) for k in (1, 3))  # two topologies
    boot = ml.UFBoot(ml.UFBootSettings(1000, check_every=50, max_perturbed=400), np.array([3.0, 2.0, 5.0]), None, 0,
                     taxa)
    boot.observe(a.parents, a.branch_lengths, _ufboot_scores(-10.0, np.full(1000, -10.0)))
    assert not boot.settled(10)  # the first check only records the supports
    assert not boot.settled(40)  # fewer than 50 trees since
    boot.observe(b.parents, b.branch_lengths, _ufboot_scores(-10.0, np.where(np.arange(1000) < 600, -1.0, -20.0)))
    assert not boot.settled(60)  # the supports moved
    assert boot.settled(110)  # and then stayed
    assert boot.settled(400)


def test_spr_scores_equal_whole_tree_likelihoods():
    """The lazy SPR scores are exact for the tree they describe (every other branch keeps its length)."""
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(9)], seed=4), jp.parse_model("JC"),
                            200, seed=2)
    model = jp.parse_model("HKY{2.5}+F{0.3,0.2,0.2,0.3}+G4{0.3}")
    trees = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=7)])
    data = pattern_data(alignment, trees)
    log_l = lambda p, l: batch_data_log_likelihoods(data, jp.TreeBatch(p, l, trees.taxa), model)  # noqa: E731
    scores = check_spr_scores(alignment, model, data, trees, trees.branch_lengths, 3, log_l)
    assert np.all(np.asarray(scores.lengths) >= 1e-6)
    # Past the tree's longest path every radius scores the same regrafts, and a radius of 30 enumerates
    # levels of at most `2N - 6` slots (its 2^31 binary paths exhausted 24 GB on rsv2).
    wide, widest = (jax.jit(ml.spr_scores, static_argnums=(5, 6, 7))(
        trees.parents[0], trees.branch_lengths[0], model, data, data.weights, phase_widths(9), jnp.float64, r)
        for r in (8, 30))
    np.testing.assert_array_equal(wide.gains, widest.gains)
    np.testing.assert_array_equal(wide.nodes, widest.nodes)


@pytest.mark.parametrize("method", ["lbfgs", "newton"])
def test_length_optimisers_split_large_batches_into_groups(monkeypatch, method):
    """Trees beyond what one call may hold are re-fitted in groups (the last one padded): the same optima."""
    alignment = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(7)], seed=4), jp.parse_model("JC"),
                            150, seed=2)
    trees = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=k) for k in (1, 2, 3)])
    data = pattern_data(alignment, trees)
    problem = ml.Problem(jp.parse_model("HKY{2}+F{0.3,0.2,0.2,0.3}"), data,
                                 jnp.broadcast_to(data.weights, (3, data.weights.shape[0])), phase_widths(7),
                                 jnp.float64, method)
    fixed = jp.tree.fixed_branches(trees.parents)
    whole = ml.optimise_lengths(trees.parents, trees.branch_lengths, fixed, problem, 1e-6)
    monkeypatch.setattr(ml._lengths, "LENGTHS_BYTES", 1)  # one tree per call
    grouped = ml.optimise_lengths(trees.parents, trees.branch_lengths, fixed, problem, 1e-6)
    assert grouped[0].shape == whole[0].shape and grouped[1].shape == (3,)
    np.testing.assert_allclose(grouped[1], whole[1], atol=1e-5)


@pytest.mark.parametrize("radius", [1, 4])
def test_regraft_edges_are_those_within_the_radius(radius):
    """The device's regraft slots of every pruning are exactly the edges 1..radius edges from the joined one."""
    tree = jp.random_topology_tree([f"t{i}" for i in range(12)], seed=3)
    batch = kernel_batch([tree])
    parent, lengths = np.asarray(batch.parents[0]), np.asarray(batch.branch_lengths[0])
    found = regraft_edges(batch.parents[0], batch.branch_lengths[0], radius)
    assert len(found) == 3 * (12 - 2)  # every pruning of the unrooted tree
    neighbours, _ = jp.tree.unrooted(parent, lengths)
    for (u, v), edges in found.items():
        s1, s2 = (k for k in neighbours[u] if k != v)
        pruned = {k: set(around) - {u} for k, around in enumerate(neighbours) if k not in (u,)}
        pruned[s1].add(s2), pruned[s2].add(s1)
        distance, frontier, expected = {s1: 0, s2: 0}, [s1, s2], set()
        while frontier:  # breadth-first from the joined edge's ends, never into v's side
            x = frontier.pop(0)
            for y in pruned[x] - {v}:
                if {x, y} != {s1, s2} and distance[x] < radius and y not in distance:
                    expected.add(frozenset((x, y)))
                    distance[y] = distance[x] + 1
                    frontier.append(y)
        assert edges == expected, (u, v)


# Small settings: the default search (100 starts, 20 climbed, SPR radius widening from 5) is for real data; these keep
# the tests' compilations and climbs small, with every stage of the search still run.
SMALL = ml.SearchSettings(starts=6, top=2, batch=2, patience=4, max_radius=5)


@pytest.fixture(scope="module")
def simulated():
    """A 12-taxon tree with clear signal, its alignment, and the search result (shared: one compilation)."""
    truth = jp.random_topology_tree([f"s{i}" for i in range(12)], seed=11, mean_branch_length=0.08)
    truth = truth.with_branch_lengths(np.asarray(truth.branch_lengths) + 0.04)  # no branch too short to resolve
    alignment = jp.simulate(truth, jp.parse_model("HKY{3}+F{0.3,0.2,0.2,0.3}+G4{0.8}"), 1500, seed=5)
    return truth, alignment, SMALL, ml.search(alignment, "HKY+G4", settings=SMALL, seed=1)


def test_search_recovers_the_simulated_tree(simulated):
    truth, alignment, _, result = simulated
    assert ml.robinson_foulds(result.tree, truth) == 0
    assert result.log_likelihood >= ml.fit(alignment, truth, "HKY+G4").log_likelihood - 1e-3
    assert float(result.model.substitution.kappa) == pytest.approx(3.0, rel=0.2)
    rounds, best, candidates, trees = zip(*result.trace)
    assert list(best) == sorted(best) or max(best) <= result.log_likelihood + 1e-3
    assert trees[0] >= SMALL.starts and 1 <= max(candidates) <= SMALL.candidates


def test_search_from_a_random_start_and_several_starts(simulated):
    truth, alignment, settings, result = simulated
    again = ml.search(alignment, "HKY+G4", start="random", starts=3, settings=settings, seed=3)
    assert ml.robinson_foulds(again.tree, truth) == 0
    assert again.log_likelihood == pytest.approx(result.log_likelihood, abs=0.02)


def test_search_log_likelihood_is_iqtrees_on_the_same_tree_and_model(simulated, tmp_path):
    """`iqtree2 -te OURS -m MODEL{fitted} -blfix` (nothing left for IQ-TREE to fit) prints our final log L.
    Tolerance 0.01: IQ-TREE prints 4 decimals and our model string keeps 6 significant digits, whose rounding
    moves log L by far less at an optimum (a second-order change)."""
    require("iqtree2")
    _, alignment, _, result = simulated
    write_fasta(alignment, tmp_path / "sim.fasta")
    jp.write_tree(result.tree, tmp_path / "ours.nwk")
    subprocess.run(["iqtree2", "-s", str(tmp_path / "sim.fasta"), "-te", str(tmp_path / "ours.nwk"), "-m",
                    result.model_string.replace("HKY85", "HKY"), "-blfix", "-nt", "1", "-pre", str(tmp_path / "fix"),
                    "-redo", "-quiet"], check=True, capture_output=True, timeout=300)
    text = (tmp_path / "fix.iqtree").read_text()
    reference = float(re.search(r"Log-likelihood of the tree: (-?[\d.]+)", text).group(1))
    assert result.log_likelihood == pytest.approx(reference, abs=0.01)


@pytest.mark.parametrize("seed", [0, 1])
def test_parsimony_builder_scores_equal_brute_force_fitch(seed, tmp_path):
    """The stepwise-addition builder's Fitch lengths (packed bit sets, every insertion scored at once) equal
    the plain Fitch score of the trees it returns; for DNA with gaps and ambiguity codes and for protein
    (20 states), and each tree is a complete binary tree over all taxa."""
    rng = np.random.default_rng(seed)
    for symbols, data_type in (("ACGTACGTACGTRY-N", "dna"), ("ACDEFGHIKLMNPQRSTVWY-X", "protein")):
        taxa = [f"t{i}" for i in range(9)]
        rows = ["".join(rng.choice(list(symbols), 40)) for _ in taxa]
        (tmp_path / "aln.fasta").write_text("".join(f">{t}\n{r}\n" for t, r in zip(taxa, rows)))
        alignment = jp.read_alignment(tmp_path / "aln.fasta", data_type=data_type)
        batch, lengths = jp.tree.parsimony_trees(alignment, 12, seed=seed)
        trees = batch.to_trees()
        assert [jp.tree.parsimony_score(alignment, t) for t in trees] == list(lengths)
        assert all(sorted(t.taxa) == sorted(taxa) and len(jp.tree.splits(t)) == len(taxa) - 3 for t in trees)


def test_stop_rule_counts_perturbed_trees():
    """A round's trees add to the count unless its best is a new tree above the best before it, by any amount
    (IQ-TREE's rule); IQ-TREE's 100 unsuccessful trees are 5 rounds of 20, or one round of 128."""
    count, rounds = 0, 0
    while count < 100:  # a known tree re-fitted higher is no success
        count, rounds = ml.unsuccessful_trees(count, -10.0, -10.0 + 5e-4, 20, new_best=False), rounds + 1
    assert rounds == 5
    assert ml.unsuccessful_trees(0, -10.0, -10.0, 128, new_best=True) >= 100
    assert ml.unsuccessful_trees(80, -10.0, -10.0 + 1e-4, 20, new_best=True) == 0


def test_spr_radius_widens_by_five_while_a_widened_radius_gains(monkeypatch):
    """RAxML-NG's schedule: the first radius (5) always tries 10; a radius that made an SPR move tries 5 more when
    it finds no further one (15, 20, ...); a widened radius that made none ends the climb; `max_radius` caps it."""
    from jaxphylo.ml import _climb

    monkeypatch.setattr(_climb, "spr_step", lambda *args: (None, None, None, False))  # no regraft gains
    tree = (np.zeros(23, np.int32), np.zeros(23), -1.0)  # 12 taxa: 23 nodes

    def after_failure(radius, gained, **settings):
        climb = _climb.Climb(*(np.zeros((2, 23)),) * 2, np.zeros(2), phase="spr", best=tree, radius=radius,
                             gained=gained)
        climb.step(None, ml.SearchSettings(**settings))
        return climb.phase, climb.radius

    assert after_failure(5, False) == ("spr", 10)  # the first radius
    assert after_failure(10, False) == ("done", 10)  # widened, no move there
    assert after_failure(10, True) == ("spr", 15) and after_failure(15, True) == ("spr", 20)
    assert after_failure(20, True) == ("done", 20)  # 25 is past the tree's 23 nodes: no longer path
    assert after_failure(10, True, max_radius=10) == ("done", 10)


def test_search_width_never_asks_for_more_trees_than_memory_holds(monkeypatch):
    """The width of a round is cut to the trees whose proposals fit in the free memory: 1,000 taxa x 9,872
    patterns asked an H200 for 151.5 GiB at the old floor of 32 trees. Small trees keep their widths."""
    from jaxphylo.ml import _search

    def width(node_bytes, num_nodes, free, backend, **settings):
        monkeypatch.setattr(_search, "node_bytes", lambda *args: node_bytes)
        monkeypatch.setattr(_search, "device_free_memory", lambda device: (free, 2 * free))
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        return _search.search_width(ml.SearchSettings(**settings), None, None, None, num_nodes)

    big, small = dict(node_bytes=1 << 20, num_nodes=1999), dict(node_bytes=1 << 10, num_nodes=51)
    assert width(**big, free=40 << 30, backend="gpu") == width(**big, free=40 << 30, backend="cpu") == 5
    assert width(**big, free=1 << 30, backend="gpu") == 1  # one tree even when it may not fit: the run says so
    assert width(**small, free=40 << 30, backend="gpu") == 256
    assert width(**small, free=40 << 30, backend="cpu") == ml.SearchSettings().top
    assert width(**big, free=40 << 30, backend="gpu", batch=7) == 7  # asked for: the user's call


def test_candidate_set_counts_resolutions_of_a_polytomy_as_one_tree():
    """Trees that differ only on a zero-length branch are one candidate (the better kept); a tree that differs
    on a branch of positive length is another."""
    newick = ["((A:0.1,B:0.1):0.2,((C:0.1,D:0.1):1e-6,E:0.1):0.2,F:0.1);",  # CD|ABEF on a zero-length branch
              "((A:0.1,B:0.1):0.2,((C:0.1,E:0.1):1e-6,D:0.1):0.2,F:0.1);",  # CE|ABDF instead: the same polytomy
              "((A:0.1,C:0.1):0.2,((B:0.1,D:0.1):0.05,E:0.1):0.2,F:0.1);"]  # other splits, all of positive length
    batch = kernel_batch([jp.parse_newick(text) for text in newick])
    assert len({frozenset(ml.splits(jp.parse_newick(text))) for text in newick}) == 3  # three binary topologies
    candidates = ml.CandidateSet(5, batch.taxa)
    candidates.add(batch.parents, batch.branch_lengths, np.array([-10.0, -9.999, -12.0]))
    assert sorted(ll for ll, _, _ in candidates.trees.values()) == [-12.0, -9.999]
    assert np.array_equal(np.asarray(candidates.best()[1]), np.asarray(batch.parents[1]))


def test_a_search_compiles_a_fixed_set_of_programs(simulated):
    """A second search with other moves and more rounds compiles nothing new: topologies are data."""
    _, alignment, settings, _ = simulated
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            ml.search(alignment, "HKY+G4", start="random", settings=replace(SMALL, patience=8), seed=9)
    finally:
        logger.removeHandler(handler)
    compiled = [r for r in records if "Compiling" in r and "search" not in r]
    heavy = [r for r in compiled
             if any(k in r for k in ("lengths", "propose", "perturb", "tree_log", "minimise", "nni", "spr"))]
    assert heavy == [], heavy


def test_supports_are_high_on_true_branches(simulated):
    truth, alignment, settings, result = simulated
    alrt = ml.sh_alrt(alignment, result, replicates=1000)
    boot, replicates = ml.bootstrap(alignment, result, replicates=20, settings=settings)
    true_splits = set(ml.splits(truth))
    assert set(alrt) == set(boot) == true_splits  # every internal branch of the ML tree (= the true tree) labelled
    assert min(boot.values()) >= 95 and min(alrt.values()) >= 90, (boot, alrt)
    assert len(replicates) == 20
    labelled = ml.with_supports(result.tree, boot)
    assert sum(label is not None for label in labelled.topology.labels) == len(true_splits)


def test_interrupted_search_resumes_to_the_uninterrupted_result(simulated, tmp_path):
    """Stopped before its first fit and then at random NNI/SPR rounds, resumed each time: the same result
    and the same final checkpoint bytes as a search never stopped."""
    _, alignment, settings, result = simulated
    path, whole = tmp_path / "search.ckpt", tmp_path / "whole.ckpt"
    run = lambda **kw: ml.search(alignment, "HKY+G4", settings=settings, seed=1, **kw)  # noqa: E731
    assert run(checkpoint=whole).log_likelihood == result.log_likelihood
    with pytest.raises(Interrupted, match="after 0 rounds"):
        run(checkpoint=path, stop=StopAfter(0))
    with pytest.raises(jp.InputError, match="holds a saved search"):
        run(checkpoint=path)
    rng, stops = np.random.default_rng(4), 0
    while True:
        try:
            resumed = run(checkpoint=path, resume=True, stop=StopAfter(int(rng.integers(0, 4))))
            break
        except Interrupted:
            stops += 1
    assert stops >= 3
    assert resumed.log_likelihood == result.log_likelihood
    np.testing.assert_array_equal(resumed.tree.branch_lengths, result.tree.branch_lengths)
    assert resumed.tree.topology == result.tree.topology
    assert resumed.trace == result.trace
    assert path.read_bytes() == whole.read_bytes()
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])
    with pytest.raises(jp.InputError, match="truncated checkpoint"):
        run(checkpoint=path, resume=True)


def test_ufboot_search_supports_resume_and_bnni(simulated, tmp_path):
    """`search(..., ufboot=...)`: the ML tree (the true one) with UFBoot supports that are the split frequencies
    of the 1,000 replicate trees (high here: clear signal); stopped at random rounds and resumed, the same
    supports and checkpoint bytes as a search never stopped; `-bnni` climbs every replicate's tree."""
    truth, alignment, settings, result = simulated
    boot = ml.UFBootSettings(1000, check_every=8, max_perturbed=24)
    run = lambda **kw: ml.search(alignment, "HKY+G4", settings=settings, seed=1, **kw)  # noqa: E731
    whole = run(checkpoint=tmp_path / "whole.ckpt", ufboot=boot)
    assert ml.robinson_foulds(whole.tree, truth) == 0
    assert whole.log_likelihood == pytest.approx(result.log_likelihood, abs=1e-3)
    assert set(whole.ufboot) == set(ml.splits(truth)) and min(whole.ufboot.values()) >= 90, whole.ufboot
    assert len(whole.ufboot_trees) == 1000
    found = [set(ml.splits(t)) for t in whole.ufboot_trees]
    for split, value in whole.ufboot.items():
        assert value == pytest.approx(100 * np.mean([split in f for f in found]))
    assert whole.trace[-1][3] >= result.trace[-1][3] + boot.check_every  # perturbed on until the supports settled
    path, rng, stops = tmp_path / "search.ckpt", np.random.default_rng(2), 0
    with pytest.raises(Interrupted):
        run(checkpoint=path, ufboot=boot, stop=StopAfter(int(rng.integers(3, 12))))
    while True:
        try:
            resumed = run(checkpoint=path, ufboot=boot, resume=True, stop=StopAfter(int(rng.integers(3, 12))))
            break
        except Interrupted:
            stops += 1
    assert resumed.ufboot == whole.ufboot and resumed.log_likelihood == whole.log_likelihood
    assert path.read_bytes() == (tmp_path / "whole.ckpt").read_bytes()
    refined = run(ufboot=replace(boot, bnni=True))
    assert len(refined.ufboot_trees) == 1000 and min(refined.ufboot.values()) >= 90


def test_a_start_with_a_non_finite_likelihood_stops_the_search_with_its_cause(simulated):
    _, alignment, settings, _ = simulated
    with pytest.raises(jp.ModelError, match="log-likelihood of start tree 1 is nan: site pattern"):
        ml.search(alignment, "HKY{3}+F{0.5,0.5,0,0}+G4{0.8}", settings=settings, seed=1)


def test_interrupted_bootstrap_resumes_to_the_same_trees(simulated, tmp_path):
    """Stopped inside its batches' NNI climbs and resumed each time: the trees of an uninterrupted bootstrap.
    All six replicates climbed as one batch give the same trees as two batches of three."""
    _, alignment, settings, result = simulated
    whole_path, path = tmp_path / "whole.ckpt", tmp_path / "boot.ckpt"
    options = dict(replicates=6, settings=settings, seed=2, batch=3)
    whole, trees = ml.bootstrap(alignment, result, checkpoint=whole_path, **options)
    with pytest.raises(Interrupted, match="after 0 of 6 replicates"):
        ml.bootstrap(alignment, result, checkpoint=path, stop=StopAfter(1), **options)
    stops = 0
    for reads in (1, 2, 1, 3):  # stopped inside the first batch's climb, after it, inside the second's
        try:
            resumed, again = ml.bootstrap(alignment, result, checkpoint=path, stop=StopAfter(reads), **options)
        except Interrupted:
            stops += 1
    resumed, again = ml.bootstrap(alignment, result, checkpoint=path, **options)
    assert stops >= 2 and resumed == whole
    for a, b in zip(trees, again):
        assert a.topology == b.topology
        np.testing.assert_array_equal(a.branch_lengths, b.branch_lengths)
    assert path.read_bytes() == whole_path.read_bytes()
    one_batch, once = ml.bootstrap(alignment, result, **{**options, "batch": 6})
    assert one_batch == whole
    for a, b in zip(trees, once):
        assert a.topology == b.topology
        np.testing.assert_allclose(a.branch_lengths, b.branch_lengths, rtol=1e-6, atol=1e-9)
    with pytest.raises(jp.InputError, match="bootstrap batch"):
        ml.bootstrap(alignment, result, **{**options, "batch": 0})


def test_splits_do_not_depend_on_the_order_of_taxa():
    tree = jp.parse_newick("((b:1,c:1):1,(a:1,d:1):1,(e:1,f:1):1);")
    same = jp.parse_newick("((f:1,e:1):1,(d:1,a:1):1,(c:1,b:1):1);")
    other = jp.parse_newick("((b:1,d:1):1,(a:1,c:1):1,(e:1,f:1):1);")
    assert ml.robinson_foulds(tree, same) == 0 and ml.robinson_foulds(tree, other) == 4


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    return subprocess.run([sys.executable, "-m", "jaxphylo.cli", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env=env)


ML_COMMAND = ("ml", "sim.fasta", "-m", "HKY+G4", "--patience", "1", "--batch", "2", "--ninit", "6", "--ntop", "2",
              "--alrt", "100", "--bootstrap", "2")
ML_FILES = ("sim.fasta.treefile", "sim.fasta.json", "sim.fasta.log", "sim.fasta.ckpt", "sim.fasta.boot.ckpt")


@pytest.fixture(scope="module")
def ml_command_run(simulated, tmp_path_factory):
    """The `ml` command run once, uninterrupted, with SH-aLRT and bootstrap: its folder and its result."""
    truth, alignment, _, _ = simulated
    folder = tmp_path_factory.mktemp("ml_command")
    write_fasta(alignment, folder / "sim.fasta")
    began = time.perf_counter()
    return folder, run_cli(*ML_COMMAND, cwd=folder), time.perf_counter() - began


def test_ml_command_writes_tree_json_and_log(simulated, ml_command_run):
    truth = simulated[0]
    folder, result, _ = ml_command_run
    assert result.returncode == 0, result.stderr
    assert "round" in result.stderr
    summary = json.loads((folder / "sim.fasta.json").read_text())
    assert summary["log_likelihood"] == pytest.approx(float(result.stdout))
    assert summary["model"].startswith("HKY85{") and summary["search_rounds"] >= 1
    tree = jp.read_tree(folder / "sim.fasta.treefile")
    assert ml.robinson_foulds(tree, truth) == 0
    assert all(label is None or "/" in label for label in tree.topology.labels)
    log = (folder / "sim.fasta.log").read_text()
    assert log.startswith("# jaxphylo ml") and " s;" not in log and "peak memory" in result.stderr
    again = run_cli(*ML_COMMAND, cwd=folder)
    assert again.returncode == 2 and "holds a saved search" in again.stderr


def test_ml_sigterm_at_a_random_moment_exits_saved_and_resumes_to_the_same_bytes(ml_command_run, tmp_path):
    """SIGTERM anywhere in `ml` (start-up, the search's climbs, SH-aLRT, the bootstrap): exit 75 within 30 s;
    `--resume` then writes the bytes of the uninterrupted run, checkpoints included."""
    reference, whole, seconds = ml_command_run
    shutil.copy(reference / "sim.fasta", tmp_path / "sim.fasta")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    # Within the first 60% of the reference run (at most 40 s): with the tests' compilation cache this run
    # compiles nothing the reference did not, and takes less than the reference's time.
    _, delay = sigterm_at_random_moment([sys.executable, "-m", "jaxphylo.cli", *ML_COMMAND], 3.0,
                                        min(40.0, max(6.0, 0.6 * seconds)),
                                        cwd=tmp_path, env=env)
    resumed = run_cli(*ML_COMMAND, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == whole.stdout
    for name in ML_FILES:
        assert (tmp_path / name).read_bytes() == (reference / name).read_bytes(), f"{name} (SIGTERM at {delay:.1f} s)"


def test_ml_command_writes_ufboot_supports_and_trees(simulated, tmp_path):
    """`jaxphylo ml -B 1000`: supports on the tree (`SH-aLRT/UFBoot` with `--alrt`, IQ-TREE's order) and every
    replicate's tree in PREFIX.ufboot."""
    truth, alignment, _, _ = simulated
    write_fasta(alignment, tmp_path / "sim.fasta")
    done = run_cli("ml", "sim.fasta", "-m", "HKY+G4", "--patience", "1", "--batch", "2", "--ninit", "6", "--ntop", "2",
                   "--alrt", "100", "-B", "1000", "-nstep", "4", "-nm", "8", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    tree = jp.read_tree(tmp_path / "sim.fasta.treefile")
    assert ml.robinson_foulds(tree, truth) == 0
    labels = [x for x in tree.topology.labels if x is not None]
    assert len(labels) == len(truth.taxa) - 3 and all(float(x.split("/")[1]) >= 90 for x in labels), labels
    replicates = (tmp_path / "sim.fasta.ufboot").read_text().strip().splitlines()
    assert len(replicates) == 1000 and all(line.endswith(";") for line in replicates)
    assert json.loads((tmp_path / "sim.fasta.json").read_text())["support_labels"] == "SH-aLRT/UFBoot"


@pytest.mark.parametrize("args,message", [
    (("-m", "HKY+Q"), "unknown term"),
    (("-m", "HKY", "-B", "500"), "at least 1000 replicates"),
    (("-m", "HKY", "--bnni"), "give -B too"),
    (("-m", "HKY", "--tree", "OTHER"), "taxon 'x' is not in"),
])
def test_ml_bad_input_is_one_line(tmp_path, args, message):
    (tmp_path / "aln.fasta").write_text(">a\nACGTACGT\n>b\nACGTACGA\n>c\nACCTACGA\n>d\nTCGTACGA\n")
    (tmp_path / "other.nwk").write_text("((a:1,b:1):1,(c:1,x:1):1);")
    args = tuple(str(tmp_path / "other.nwk") if a == "OTHER" else a for a in args)
    result = run_cli("ml", str(tmp_path / "aln.fasta"), *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_model_string_round_trips():
    alignment = jp.simulate(jp.random_topology_tree(["a", "b", "c", "d"]), jp.parse_model("JC"), 50)
    for text in ["GTR+G4", "HKY+I+G4", "TN+R3", "K80{3}", "JC", "F81+FQ"]:
        model = jp.parse_model(text, alignment)
        written = jp.models.model_string(model)
        assert jp.models.model_string(jp.parse_model(written, alignment)) == written


def test_ml_dry_run_prints_the_cost_and_writes_nothing(tmp_path):
    alignment, _ = jp.example_paths()
    result = run_cli("ml", str(Path(alignment).resolve()), "-m", "HKY+G4", "--dry-run", "--out", str(tmp_path / "x"))
    assert result.returncode == 0, result.stderr
    # (The plan no longer prints a batch line: jaxphylo.likelihood.plan writes one tree's cost.)
    assert "16 taxa" in result.stderr
    assert "one likelihood-and-gradient" in result.stderr
    assert list(tmp_path.iterdir()) == []
