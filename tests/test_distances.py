"""Distances, neighbour-joining and BIONJ against brute force, Biopython and additive matrices."""

import itertools

import numpy as np
import pytest
from Bio import Phylo
from Bio.Align import MultipleSeqAlignment
from Bio.Phylo.TreeConstruction import DistanceCalculator, DistanceMatrix, DistanceTreeConstructor
from Bio.Seq import Seq
from Bio.SeqRecord import SeqRecord

import jaxphylo as jp
from conftest import dataset


def brute_force(alignment, method):
    """Column-by-column loops over every pair: independent of the matrix-product code."""
    codes, table, _ = alignment.encoded()
    state = np.where(table.sum(1) == 1, table.argmax(1), -1)[codes]
    counts = state[state >= 0]
    pi = np.bincount(counts, minlength=4) / counts.size
    n = len(alignment.taxa)
    out = np.zeros((n, n))
    for i, j in itertools.combinations(range(n), 2):
        both = (state[i] >= 0) & (state[j] >= 0)
        x, y = state[i][both], state[j][both]
        p = np.mean(x != y)
        ts1 = np.mean(((x == 0) & (y == 2)) | ((x == 2) & (y == 0)))
        ts2 = np.mean(((x == 1) & (y == 3)) | ((x == 3) & (y == 1)))
        q = p - ts1 - ts2
        if method == "p":
            d = p
        elif method == "jc69":
            d = -0.75 * np.log(1 - 4 * p / 3)
        elif method == "poisson":
            d = -np.log(1 - p)
        elif method == "k2p":
            d = -0.5 * np.log(1 - 2 * (ts1 + ts2) - q) - 0.25 * np.log(1 - 2 * q)
        elif method == "tn93":
            a, c, g, t = pi
            r, yy = a + g, c + t
            d = (-2 * a * g / r * np.log(1 - r * ts1 / (2 * a * g) - q / (2 * r))
                 - 2 * c * t / yy * np.log(1 - yy * ts2 / (2 * c * t) - q / (2 * yy))
                 - 2 * (r * yy - a * g * yy / r - c * t * r / yy) * np.log(1 - q / (2 * r * yy)))
        else:  # logdet
            f = np.zeros((4, 4))
            np.add.at(f, (x, y), 1.0)
            f /= f.sum()
            d = -0.25 * (np.log(np.linalg.det(f)) - 0.5 * np.log(np.prod(f.sum(1)) * np.prod(f.sum(0))))
        out[i, j] = out[j, i] = d
    return out


@pytest.fixture(scope="module")
def dna():
    tree = jp.random_topology_tree([f"t{i}" for i in range(12)], seed=4, mean_branch_length=0.08)
    return jp.simulate(tree, jp.parse_model("HKY{4}+F{.3,.2,.2,.3}+G4{0.8}"), 400, seed=5, missing=0.05)


@pytest.mark.parametrize("method", ["p", "jc69", "k2p", "tn93", "logdet"])
def test_dna_distances_match_brute_force(dna, method):
    np.testing.assert_allclose(jp.distances(dna, method, block_size=5), brute_force(dna, method), rtol=1e-10, atol=1e-12)


def test_protein_distances_match_brute_force_and_biopython():
    tree = jp.random_topology_tree([f"t{i}" for i in range(8)], seed=2, mean_branch_length=0.1)
    protein = jp.simulate(tree, jp.parse_model("LG+G4{1.0}"), 150, seed=3)
    codes, table, _ = protein.encoded()
    for method in ("p", "poisson"):
        ours = jp.distances(protein, method)
        state = table.argmax(1)[codes]
        p = np.mean(state[:, None] != state[None], axis=-1)
        np.testing.assert_allclose(ours, p if method == "p" else -np.log(1 - p), rtol=1e-12, atol=1e-14)
    records = MultipleSeqAlignment([SeqRecord(Seq(s), id=t) for t, s in zip(protein.taxa, protein.sequences)])
    biopython = DistanceCalculator("identity").get_distance(records)
    np.testing.assert_allclose(jp.distances(protein, "p"), np.array([[biopython[a, b] for b in protein.taxa]
                                                                      for a in protein.taxa]), atol=1e-12)


def test_site_weights_give_the_resampled_alignments_distances(dna):
    """A bootstrap replicate's distances from the alignment's columns weighted by how often the replicate drew
    them equal those of the resampled alignment, bit for bit (integer counts are exact in the products), for
    every DNA method and for proteins; bad weights are one-line input errors."""
    rng = np.random.default_rng(0)
    protein = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(8)], seed=2, mean_branch_length=0.1),
                          jp.parse_model("LG+G4{1.0}"), 150, seed=3)
    for alignment, methods in ((dna, ("p", "jc69", "k2p", "tn93", "logdet")), (protein, ("p", "poisson"))):
        columns = rng.integers(0, alignment.num_sites, alignment.num_sites)
        resampled = jp.Alignment(alignment.taxa, tuple("".join(s[c] for c in columns) for s in alignment.sequences),
                                 alignment.alphabet, "resampled")
        weights = np.bincount(columns, minlength=alignment.num_sites)
        for method in methods:
            assert np.array_equal(jp.distances(alignment, method, site_weights=weights, block_size=5),
                                  jp.distances(resampled, method, block_size=5)), method
    for bad in (np.ones(3), -np.ones(dna.num_sites), np.full(dna.num_sites, 0.5)):
        with pytest.raises(jp.InputError, match="site_weights must be 400 integers"):
            jp.distances(dna, site_weights=bad)


def test_dna_p_distance_matches_biopython_identity_without_gaps():
    tree = jp.random_topology_tree([f"t{i}" for i in range(9)], seed=7)
    dna = jp.simulate(tree, jp.parse_model("JC"), 300, seed=8)
    records = MultipleSeqAlignment([SeqRecord(Seq(s), id=t) for t, s in zip(dna.taxa, dna.sequences)])
    biopython = DistanceCalculator("identity").get_distance(records)
    expected = np.array([[biopython[a, b] for b in dna.taxa] for a in dna.taxa])
    np.testing.assert_allclose(jp.distances(dna, "p"), expected, atol=1e-12)


def test_pairwise_deletion_and_saturation_are_documented_values():
    aln = jp.Alignment(("a", "b", "c", "d"), ("ACGTACGTNN", "ACGTACGAAC", "TGCATGCAGT", "----------"), jp.DNA)
    with pytest.raises(jp.InputError, match="'a' and 'd' share no unambiguous site"):
        jp.distances(aln)
    aln = jp.Alignment(("a", "b", "c"), ("ACGTACGTNN", "ACGTACGAAC", "TGCATGCAGT"), jp.DNA)
    d = jp.distances(aln, "p")
    assert d[0, 1] == pytest.approx(1 / 8)  # the two N columns are deleted for this pair only
    jc = jp.distances(aln, "jc69")
    assert np.isinf(jc[0, 2]) and np.isinf(jc[1, 2])  # p >= 3/4: saturated
    assert jp.distances(aln, "jc69", saturated=5.0)[0, 2] == 5.0
    with pytest.raises(jp.ModelError, match="unknown dna distance 'poisson'"):
        jp.distances(aln, "poisson")


def splits(tree):
    """Non-trivial bipartitions of an unrooted tree, as frozensets of the side without the first name."""
    topo, taxa = tree.topology, tree.taxa
    first = min(taxa)
    below = [set() for _ in topo.parent]
    for node in range(topo.num_nodes):
        if node < topo.num_tips:
            below[node].add(taxa[node])
        if topo.parent[node] >= 0:
            below[topo.parent[node]] |= below[node]
    out = set()
    for side in below:
        side = side if first not in side else set(taxa) - side
        if 1 < len(side) < len(taxa) - 1:
            out.add(frozenset(side))
    return out


def leaf_lengths(tree):
    return {t: float(tree.branch_lengths[i]) for i, t in enumerate(tree.taxa)}


def test_neighbor_joining_matches_biopython(dna):
    d = jp.distances(dna, "jc69")
    ours = jp.neighbor_joining(d, dna.taxa, allow_negative=True)
    lower = [[float(d[i, j]) for j in range(i + 1)] for i in range(len(d))]
    bio = DistanceTreeConstructor().nj(DistanceMatrix(list(dna.taxa), lower))
    bio_tree = jp.parse_newick(Phylo.BaseTree.Tree.format(bio, "newick"))
    assert splits(ours) == splits(bio_tree)
    assert leaf_lengths(ours) == pytest.approx(leaf_lengths(bio_tree), abs=1e-8)  # Newick keeps 8 decimals
    assert float(ours.tree_length) == pytest.approx(float(bio_tree.tree_length), abs=1e-7)


def additive(tree):
    """Path lengths between tips of `tree`: an additive matrix that NJ and BIONJ must recover."""
    topo = tree.topology
    lengths = np.asarray(tree.branch_lengths)
    depth = np.zeros(topo.num_nodes)
    ancestors = [[] for _ in range(topo.num_nodes)]
    for node in reversed(range(topo.num_nodes)):
        up = topo.parent[node]
        if up >= 0:
            depth[node] = depth[up] + lengths[node]
            ancestors[node] = [up] + ancestors[up]
    n = topo.num_tips
    d = np.zeros((n, n))
    for i, j in itertools.combinations(range(n), 2):
        common = next(a for a in ancestors[i] if a in ancestors[j])
        d[i, j] = d[j, i] = depth[i] + depth[j] - 2 * depth[common]
    return d


@pytest.mark.parametrize("build", [jp.neighbor_joining, jp.bionj])
def test_exact_on_additive_matrices(build):
    truth = jp.random_topology_tree([f"t{i}" for i in range(15)], seed=11, mean_branch_length=0.2)
    d = additive(truth)
    tree = build(d, truth.taxa)
    assert splits(tree) == splits(truth)
    np.testing.assert_allclose(additive(tree), d, atol=1e-10)


def reference_bionj_first_step(d):
    """Gascuel (1997), first agglomeration written out with scalar loops, for a cross-check."""
    n = len(d)
    r = [sum(d[i][k] for k in range(n)) for i in range(n)]
    best = min(((n - 2) * d[i][j] - r[i] - r[j], i, j) for i in range(n) for j in range(i + 1, n))
    _, i, j = best
    vi = d[i][j] / 2 + (r[i] - r[j]) / (2 * (n - 2))
    vj = d[i][j] - vi
    lam = 0.5 + sum(d[j][k] - d[i][k] for k in range(n) if k not in (i, j)) / (2 * (n - 2) * d[i][j])
    lam = min(1.0, max(0.0, lam))
    reduced = {k: lam * (d[i][k] - vi) + (1 - lam) * (d[j][k] - vj) for k in range(n) if k not in (i, j)}
    return i, j, vi, vj, reduced


def test_bionj_first_step_and_differs_from_nj_on_noisy_data(dna):
    d = jp.distances(dna, "jc69") + 0.01 * (np.random.default_rng(2).random((12, 12)) ** 2)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0)
    i, j, vi, vj, reduced = reference_bionj_first_step(d.tolist())
    # The first join is BIONJ's cherry with lengths vi, vj; check it in the finished tree.
    small = np.ix_([i, j] + sorted(reduced), [i, j] + sorted(reduced))
    taxa = [dna.taxa[k] for k in [i, j] + sorted(reduced)]
    tree = jp.bionj(d[small], taxa, allow_negative=True)
    assert tree.topology.parent[0] == tree.topology.parent[1]
    assert float(tree.branch_lengths[0]) == pytest.approx(vi, abs=1e-12)
    assert float(tree.branch_lengths[1]) == pytest.approx(vj, abs=1e-12)
    # The reduced distances: with the cherry replaced by one taxon, the rest of the tree follows from them.
    rest = sorted(reduced)
    shrunk = np.zeros((len(rest) + 1, len(rest) + 1))
    shrunk[1:, 1:] = d[np.ix_(rest, rest)]
    shrunk[0, 1:] = shrunk[1:, 0] = [reduced[k] for k in rest]
    expected = jp.bionj(shrunk, ["cherry"] + [dna.taxa[k] for k in rest], allow_negative=True)
    whole = jp.bionj(d[small], taxa, allow_negative=True)
    cherry = {frozenset(s) - {dna.taxa[i], dna.taxa[j]} | ({"cherry"} if {dna.taxa[i], dna.taxa[j]} <= s else set())
              for s in splits(whole)}
    assert {frozenset(s) for s in splits(expected)} <= cherry | {frozenset(set(expected.taxa) - s) for s in cherry}


def test_bad_matrices_are_input_errors():
    with pytest.raises(jp.InputError, match="saturated"):
        jp.neighbor_joining(np.array([[0, np.inf, 1], [np.inf, 0, 1], [1, 1, 0]]), ["a", "b", "c"])
    with pytest.raises(jp.InputError, match="not symmetric"):
        jp.bionj(np.array([[0, 1, 1], [2, 0, 1], [1, 1, 0]]), ["a", "b", "c"])
    with pytest.raises(jp.InputError, match="3 rows but 2 taxa"):
        jp.bionj(np.zeros((3, 3)), ["a", "b"])


def test_nj_start_tree_feeds_the_likelihood():
    folder = dataset("DS1")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tree = jp.bionj(jp.distances(alignment, "k2p", saturated=5.0), alignment.taxa)
    value = float(jp.log_likelihood(alignment, tree, jp.parse_model("HKY+G4{0.5}", alignment=alignment)))
    assert np.isfinite(value)
