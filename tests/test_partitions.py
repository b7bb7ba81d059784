"""Partitioned analyses: the three partition file formats, the three link modes, one kernel call per group,
gradients against central finite differences, and agreement with IQ-TREE 2 (`-p/-q/-Q FILE -te TREE`).

IQ-TREE runs take under a second each here, so they run in the tests. With `-p`, IQ-TREE's `-blfix` still
fits the part rates and a common scale of the tree, so the comparison takes the tree IQ-TREE writes
(`PREFIX.treefile`, 10 digits) and the part rates of its checkpoint (`part_rates`); with `-Q` it fits
each part's lengths (`-blfix` would leave them all equal), read from `PREFIX.parttrees`.
"""

import collections
import dataclasses
import gzip
import subprocess

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import dataset, require

import jaxphylo as jp
from jaxphylo import InputError, ModelError
from jaxphylo.io import PartitionScheme, SiteRange, read_partitions
from jaxphylo.likelihood import kernels
from jaxphylo.models import part_alignments
from jaxphylo.likelihood import partitioned_data, partitioned_data_log_likelihoods

LASSA_MODELS = ("HKY{3.0}+F+G4{0.4}", "HKY{4.0}+F+G4{0.3}", "GTR{1.0,5.0,0.8,1.2,6.0}+F+G4{1.5}")
DS1_MODELS = ("HKY{2.5}+F+G4{0.3}", "GTR{1.2,3.1,0.9,1.1,4.2}+F+I{0.2}+G4{0.7}")


def write(path, text):
    path.write_text(text)
    return path


# ---------------------------------------------------------------- formats


def test_nexus_sets_ranges_strides_and_dot(tmp_path):
    path = write(tmp_path / "sets.nex", """#NEXUS
[a comment; with a semicolon]
begin sets;
    charset first = 1 3-4 9;
    charset codon2 = 2 - .\\3;   [spaces around - and \\ are fine]
    charset both = first 12-13;
end;
""")
    scheme = read_partitions(path)
    assert scheme.names == ("first", "codon2", "both")
    assert scheme.ranges[1] == (SiteRange(2, None, 3),) and scheme.models == (None,) * 3
    assert scheme.lines == (4, 5, 6) and scheme.format == "nexus"
    with pytest.raises(InputError, match=r"sets.nex: line 6: site 1 is in part 'first' and in part 'both'"):
        scheme.sites(20)
    path = write(tmp_path / "ok.nex", "#nexus\nbegin sets;\n charset a = 1-6\\2, 7;\n charset b = 2-.\\2;\nend;\n")
    a, b = read_partitions(path).sites(10)
    assert a.tolist() == [0, 2, 4, 6] and b.tolist() == [1, 3, 5, 7, 9]
    assert read_partitions(path).unassigned(12).tolist() == [8, 10]  # left out, as IQ-TREE does
    with pytest.raises(InputError, match=r"ok.nex: line 3: part 'a' has site 7 \(range 7\) beyond the alignment's 6"):
        read_partitions(path).sites(6)


def test_iqtree_charpartition(tmp_path):
    path = write(tmp_path / "models.nex", """#nexus
begin sets;
  charset pos1 = 1-.\\3;
  charset pos2 = 2-.\\3;
  charset pos3 = 3-.\\3;
  charset cds = CODON, 1-9;
  charpartition mine = HKY{3.0}+F+G4{0.4}:pos1, GTR{1.0,5.0,0.8,1.2,6.0}+F+G4{1.5}: pos3{3.2}, pos2;
end;
""")
    scheme = read_partitions(path)
    assert scheme.names == ("pos1", "pos3", "pos2")  # the charpartition's parts, in its order
    assert scheme.models == ("HKY{3.0}+F+G4{0.4}", "GTR{1.0,5.0,0.8,1.2,6.0}+F+G4{1.5}", None)
    assert [s.tolist() for s in scheme.sites(7)] == [[0, 3, 6], [2, 5], [1, 4]]
    standard = write(tmp_path / "standard.nex", "#NEXUS\nbegin sets;\ncharpartition genes = a: 1-3, b: 4-6;\nend;\n")
    assert read_partitions(standard).names == ("a", "b")
    codon = write(tmp_path / "codon.nex", "#NEXUS\nbegin sets;\n charset cds = CODON2, 1-9;\nend;\n")
    assert read_partitions(codon).data_types == ("codon",) and read_partitions(codon).genetic_codes == (2,)
    bad = write(tmp_path / "bad.nex", "#NEXUS\nbegin sets;\n charset a = 1-5;\n\n charpartition p = HKY:a, GTR:nope;\nend;\n")
    with pytest.raises(InputError, match=r"bad.nex: line 5: charpartition names unknown charset 'nope'"):
        read_partitions(bad)


def test_raxml_style(tmp_path):
    path = write(tmp_path / "parts.txt", "DNA, gene1 = 1-500, 501-1000\\3\n# a comment\nWAG, p2 = 1001-1100\n"
                                        "CODON2, cds = 1101-1199\nAA, p4 = 1200 - 1210\n")
    scheme = read_partitions(path)
    assert scheme.names == ("gene1", "p2", "cds", "p4") and scheme.format == "raxml"
    assert scheme.data_types == ("dna", None, "codon", "protein") and scheme.genetic_codes[2] == 2
    assert scheme.models == ("GTR", "WAG", None, None)  # IQ-TREE: a DNA line is GTR
    assert len(scheme.sites()[0]) == 500 + 167 and scheme.lines == (1, 3, 4, 5)
    for text, message in [
        ("DNA, g = 1-10\nDNA, h = 10-20\n", r"line 2: site 10 is in part 'g' and in part 'h'"),
        ("DNA, g = 1-10\nDNA g = 11-20\n", r"line 2: expected 'TYPE, NAME = RANGES'"),
        ("DNA, g = 1-10\nDNA, h = 20-11\n", r"line 2: malformed site range '20-11'"),
        ("DNA, g = 1-1x0\n", r"line 1: malformed site range '1-1x0'"),
        ("DNA, g = 0-5\n", r"line 1: malformed site range '0-5'"),
        ("BIN, g = 1-5\n", r"line 1: data type 'BIN' is not supported"),
        ("DNA, g = 1-5\nDNA, g = 6-9\n", r"line 2: part 'g' is defined twice"),
        ("\n\n", r"no partitions defined"),
    ]:
        with pytest.raises(InputError, match=message):
            read_partitions(write(tmp_path / "bad.txt", text))


# ---------------------------------------------------------------- the model and its likelihood


@pytest.fixture(scope="module")
def example():
    alignment_path, tree_path = jp.example_paths()
    return jp.read_alignment(alignment_path), jp.read_tree(tree_path)


def example_scheme(tmp_path):
    return read_partitions(write(tmp_path / "ex.nex", """#NEXUS
begin sets;
  charset a = 1-300;
  charset b = 301-.\\2;
  charset c = 302-.\\2;
  charpartition p = HKY{2.0}+F+G4{0.5}:a, GTR{1.5,3.0,0.7,1.1,2.5}+FO+I{0.1}+G4{0.8}:b, K80+G4{0.9}:c;
end;
"""))


def separate_sum(alignment, tree, model):
    """The sum over parts, each by the one-model likelihood on its own alignment and lengths: the reference."""
    lengths = model.part_branch_lengths(tree.branch_lengths)
    return sum(float(jp.likelihood.log_likelihood(part, tree.with_branch_lengths(t), m))
               for part, t, m in zip(part_alignments(alignment, model), lengths, model.models))


def count_primitives(jaxpr, counter):
    for equation in jaxpr.eqns:
        counter[equation.primitive.name] += 1
        for value in equation.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count_primitives(inner, counter)
    return counter


def test_link_modes_sum_the_parts_in_one_call_per_group(example, tmp_path, monkeypatch):
    alignment, tree = example
    scheme = example_scheme(tmp_path)
    rates = jnp.array([0.5, 2.0, 1.0])
    proportional = jp.partitioned_model(scheme, alignment, link="proportional", rates=rates)
    counts = np.array(proportional.site_counts)
    assert counts.tolist() == [300, 150, 150]
    normalised = np.asarray(proportional.normalised_rates())
    assert np.isclose(np.sum(counts * normalised) / counts.sum(), 1.0)
    assert np.allclose(normalised / normalised[2], rates / rates[2])
    lengths = np.stack([np.asarray(tree.branch_lengths) * f for f in (0.5, 1.0, 3.0)])
    unlinked = jp.partitioned_model(scheme, alignment, link="unlinked").with_branch_lengths(lengths)
    values = {m.link: float(jp.log_likelihood(alignment, tree, m))
              for m in (proportional, jp.partitioned_model(scheme, alignment, link="equal"), unlinked)}
    assert values["unlinked"] == pytest.approx(separate_sum(alignment, tree, unlinked), abs=1e-8)
    assert len(set(values.values())) == 3
    for link, factors in (("proportional", normalised), ("equal", np.ones(3))):  # t_k = r~_k t, and t_k = t
        same = unlinked.with_branch_lengths(factors[:, None] * np.asarray(tree.branch_lengths)[None])
        assert values[link] == pytest.approx(float(jp.log_likelihood(alignment, tree, same)), abs=1e-8)
    # HKY+G4 and K80+G4 (4 states, 4 categories) share one kernel call; GTR+I+G4 (5 categories) has its own.
    data = partitioned_data(alignment, tree, proportional)
    assert [(g.parts, g.tip_codes.shape[0]) for g in data.groups] == [((0, 2), 2), ((1,), 1)]
    jaxpr = jax.make_jaxpr(lambda m: partitioned_data_log_likelihoods(data, tree, m))(proportional)
    assert count_primitives(jaxpr.jaxpr, collections.Counter())["custom_vjp_call"] == 2
    # The JAX kernel (the GPU path) under vmap gives the same as the C++ CPU kernel.
    monkeypatch.setattr(kernels.cpu, "available", lambda: False)
    assert float(jp.log_likelihood(alignment, tree, unlinked)) == pytest.approx(values["unlinked"], abs=1e-8)


def test_mixed_data_types():
    """Codon, DNA and protein parts of one alignment, each in its own group."""
    lassa = jp.read_alignment(dataset("lassa_S_hmc_clock") / "alignment.fasta")
    taxa = lassa.taxa[:12]
    dna = jp.Alignment(taxa, lassa.sequences[:12], jp.DNA, "lassa12")
    amino = "ACDEFGHIKLMNPQRSTVWY"
    rng = np.random.default_rng(3)
    protein = ["".join(rng.choice(list(amino), 60)) for _ in taxa]
    mixed = jp.Alignment(taxa, tuple(s[:1470] + p for s, p in zip(dna.sequences, protein)), jp.PROTEIN, "mixed")
    tree = jp.bionj(jp.distances(dna, "k2p"), taxa)
    scheme = PartitionScheme(("gpc", "third", "aa"),
                             ((SiteRange(1, 1470),), (SiteRange(1203, 1470, 3),), (SiteRange(1471, None),)),
                             ("GY{kappa=2.0,omega=0.3}+F3X4", "HKY+G4", "WAG+G4{0.7}"),
                             ("codon", "dna", "protein"), (1, 1, 1))
    with pytest.raises(InputError, match=r"^<memory>: site 1203 is in part 'gpc' and in part 'third'$"):
        jp.partitioned_model(scheme, mixed)
    scheme = PartitionScheme(scheme.names, ((SiteRange(1, 1200),),) + scheme.ranges[1:], scheme.models,
                             scheme.data_types, scheme.genetic_codes)
    model = jp.partitioned_model(scheme, mixed, rates=[1.0, 2.0, 0.5])
    assert [m.alphabet.num_states for m in model.models] == [61, 4, 20]
    assert model.site_counts == (400, 90, 60)
    assert len(partitioned_data(mixed, tree, model).groups) == 3
    per_part = np.asarray(jp.partitioned_log_likelihoods(mixed, tree, model))
    lengths = model.part_branch_lengths(tree.branch_lengths)
    parts = part_alignments(mixed, model)
    for k in (0, 2):  # the codon and the protein part, each against the one-model likelihood
        reference = jp.likelihood.log_likelihood(parts[k], tree.with_branch_lengths(lengths[k]), model.models[k])
        assert per_part[k] == pytest.approx(float(reference), abs=1e-8)


def test_errors(example, tmp_path):
    alignment, tree = example
    scheme = read_partitions(write(tmp_path / "p.txt", "DNA, a = 1-300\nDNA, b = 301-700\n"))
    with pytest.raises(InputError, match=r"p.txt: line 2: part 'b' has site 700 \(range 301-700\) beyond the "
                                         r"alignment's 600 sites"):
        jp.partitioned_model(scheme, alignment)
    scheme = read_partitions(write(tmp_path / "q.nex", "#NEXUS\nbegin sets;\ncharset a = 1-300;\ncharset b = 301-600;\n"
                                                      "charpartition p = HKY:a, HKYX+G4:b;\nend;\n"))
    with pytest.raises(ModelError, match="^part 'b': .*HKYX"):
        jp.partitioned_model(scheme, alignment)
    scheme = read_partitions(write(tmp_path / "r.txt", "DNA, a = 1-300\nDNA, b = 301-600\n"))
    with pytest.raises(ModelError, match="link must be one of"):
        jp.partitioned_model(scheme, alignment, link="linked")
    with pytest.raises(InputError, match=r"do not fit 2 parts"):
        model = jp.partitioned_model(scheme, alignment, "HKY").with_branch_lengths(np.ones((2, 5)))
        jp.log_likelihood(alignment, tree, model)


# ---------------------------------------------------------------- gradients


def test_gradients_match_central_differences(example, tmp_path):
    """Every float leaf: tree branch lengths, part rates, every part's parameters (proportional) and the
    per-part lengths (unlinked), against central differences along a random direction in each leaf."""
    alignment, tree = example
    scheme = example_scheme(tmp_path)
    proportional = jp.partitioned_model(scheme, alignment, rates=[0.7, 1.6, 1.1])
    data = partitioned_data(alignment, tree, proportional)
    scale = np.array([0.5, 1.0, 2.0])[:, None]
    unlinked = proportional.with_branch_lengths(scale * np.asarray(tree.branch_lengths)[None] + 0.01)
    params, static = eqx.partition((tree, proportional, unlinked), eqx.is_inexact_array)
    flat, unravel = jax.flatten_util.ravel_pytree(params)

    def value(x):  # both link modes; not jitted whole, so both reuse the one compiled program per part lengths
        t, p, u = eqx.combine(unravel(x), static)
        return jnp.sum(partitioned_data_log_likelihoods(data, t, p)) + jnp.sum(partitioned_data_log_likelihoods(data, t, u))

    gradient = np.asarray(jax.grad(value)(flat))
    assert np.all(np.isfinite(gradient))
    leaves = jax.tree.leaves(params)
    offsets = np.cumsum([0] + [np.size(leaf) for leaf in leaves])
    assert len(leaves) >= 12  # tree lengths, rates, 3 models x (rates/kappa, pi, shape, +I), unlinked lengths
    rng = np.random.default_rng(0)
    for start, stop in zip(offsets[:-1], offsets[1:]):
        direction = np.zeros(flat.size)
        direction[start:stop] = rng.normal(size=stop - start)
        h = 1e-6
        difference = (float(value(flat + h * direction)) - float(value(flat - h * direction))) / (2 * h)
        assert gradient @ direction == pytest.approx(difference, rel=1e-6, abs=1e-5), (start, stop)


# ---------------------------------------------------------------- IQ-TREE 2


def run_iqtree(alignment_path, option, partition_path, tree_path, prefix, blfix=True, model=None):
    require("iqtree2")
    command = ["iqtree2", "-s", str(alignment_path), option, str(partition_path), "-te", str(tree_path),
               "-pre", str(prefix), "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"]
    command += ["-blfix"] * blfix + (["-m", model] if model else [])
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    text = prefix.with_suffix(".iqtree").read_text()
    value = float(text.split("Log-likelihood of the tree:")[1].split()[0])
    checkpoint = gzip.open(prefix.with_suffix(".ckp.gz"), "rt").read()
    rates = None
    if "part_rates:" in checkpoint:
        rates = [float(x) for x in checkpoint.split("part_rates:")[1].splitlines()[0].split(",")]
    return value, rates


def splits(tree):
    """`{taxa on the side away from the first taxon: branch}` for every branch of an unrooted tree."""
    below = [set() for _ in range(tree.topology.num_nodes)]
    for node in range(tree.num_tips):
        below[node].add(tree.taxa[node])
    for node, up in enumerate(tree.topology.parent):  # children come before parents
        if up >= 0:
            below[up] |= below[node]
    everything, first = set(tree.taxa), tree.taxa[0]
    return {frozenset(s if first not in s else everything - s): k
            for k, s in enumerate(below) if tree.topology.parent[k] >= 0}


def lengths_from(tree, other):
    """`other`'s branch lengths on `tree`'s nodes (same unrooted topology)."""
    theirs = splits(other)
    lengths = np.zeros(tree.topology.num_nodes)
    for split, k in splits(tree).items():
        lengths[k] = float(other.branch_lengths[theirs[split]])
    return lengths


def iqtree_agreement(alignment_path, partition_path, tree_path, tmp_path, model=None):
    """`{link: (ours, IQ-TREE's)}` for -p, -q and -Q."""
    alignment = jp.read_alignment(alignment_path)
    scheme = read_partitions(partition_path)
    results = {}
    value, rates = run_iqtree(alignment_path, "-p", partition_path, tree_path, tmp_path / "p", model=model)
    ours = jp.partitioned_model(scheme, alignment, default_model=model or "GTR+G4", rates=rates)
    tree = jp.read_tree(tree_path)
    fitted = tree.with_branch_lengths(lengths_from(tree, jp.read_tree(tmp_path / "p.treefile")))
    results["proportional"] = (float(jp.log_likelihood(alignment, fitted, ours)), value)
    value, _ = run_iqtree(alignment_path, "-q", partition_path, tree_path, tmp_path / "q", model=model)
    ours = jp.partitioned_model(scheme, alignment, default_model=model or "GTR+G4", link="equal")
    results["equal"] = (float(jp.log_likelihood(alignment, tree, ours)), value)
    value, _ = run_iqtree(alignment_path, "-Q", partition_path, tree_path, tmp_path / "Q", blfix=False, model=model)
    text = (tmp_path / "Q.parttrees").read_text().split(";")
    lengths = np.stack([lengths_from(tree, jp.parse_newick(t + ";")) for t in text if t.strip()])
    ours = jp.partitioned_model(scheme, alignment, default_model=model or "GTR+G4").with_branch_lengths(lengths)
    results["unlinked"] = (float(jp.log_likelihood(alignment, tree, ours)), value)
    return results


@pytest.fixture(scope="module")
def lassa(tmp_path_factory):
    folder = dataset("lassa_S_hmc_clock")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tmp = tmp_path_factory.mktemp("lassa")
    jp.write_tree(jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa), tmp / "bionj.nwk")
    return folder / "alignment.fasta", tmp / "bionj.nwk"


def test_iqtree_lassa_codon_positions_charpartition(lassa, tmp_path):
    alignment_path, tree_path = lassa
    charsets = "".join(f"  charset pos{i} = {i}-.\\3;\n" for i in (1, 2, 3))
    entries = ", ".join(f"{m}:pos{i}" for i, m in enumerate(LASSA_MODELS, 1))
    partition = write(tmp_path / "pos.nex", f"#nexus\nbegin sets;\n{charsets}  charpartition mine = {entries};\nend;\n")
    results = iqtree_agreement(alignment_path, partition, tree_path, tmp_path)
    for link, (ours, theirs) in results.items():
        assert ours == pytest.approx(theirs, abs=1e-3), (link, ours, theirs)


def test_iqtree_lassa_raxml_file_and_nexus_sets(lassa, tmp_path):
    """The same codon positions as a RAxML-style file (-p) and a NEXUS sets block (-q), the model from -m.

    IQ-TREE reads a RAxML-style `DNA` line as GTR+F plus the terms of -m after its base (here +G4{0.6}),
    fitting GTR's rates even with -blfix: its fitted rates (checkpoint) go into our GTRs for the comparison.
    """
    alignment_path, tree_path = lassa
    model = "F81+F+G4{0.6}"
    alignment, tree = jp.read_alignment(alignment_path), jp.read_tree(tree_path)
    raxml = write(tmp_path / "pos.txt", "".join(f"DNA, pos{i} = {i}-3186\\3\n" for i in (1, 2, 3)))
    scheme = read_partitions(raxml)
    built = jp.partitioned_model(scheme, alignment, model)
    assert all(type(m.substitution).__name__ == "GTR" and jp.models.model_string(m).endswith("+G4{0.6}")
               for m in built.models)
    value, rates = run_iqtree(alignment_path, "-p", raxml, tree_path, tmp_path / "p", model=model)
    checkpoint = gzip.open(tmp_path / "p.ckp.gz", "rt").read()
    exchange = [checkpoint.split(f"pos{i}!ModelDNA!rates:")[1].splitlines()[0].split(",")[:5] for i in (1, 2, 3)]
    fixed = dataclasses.replace(scheme, models=tuple(f"GTR{{{','.join(x.strip() for x in e)}}}+F+G4{{0.6}}"
                                                     for e in exchange))
    ours = jp.partitioned_model(fixed, alignment, rates=rates)
    fitted = tree.with_branch_lengths(lengths_from(tree, jp.read_tree(tmp_path / "p.treefile")))
    assert float(jp.log_likelihood(alignment, fitted, ours)) == pytest.approx(value, abs=1e-3)
    sets = write(tmp_path / "pos.nex", "#NEXUS\nbegin sets;\n" + "".join(f"charset pos{i} = {i}-.\\3;\n" for i in (1, 2, 3))
                 + "end;\n")
    value, _ = run_iqtree(alignment_path, "-q", sets, tree_path, tmp_path / "q", model=model)
    ours = jp.partitioned_model(read_partitions(sets), alignment, model, link="equal")
    assert float(jp.log_likelihood(alignment, tree, ours)) == pytest.approx(value, abs=1e-3)


def test_iqtree_ds1_two_genes(tmp_path):
    folder = dataset("DS1")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tree_path = tmp_path / "bionj.nwk"
    jp.write_tree(jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa), tree_path)
    partition = write(tmp_path / "genes.nex", "#nexus\nbegin sets;\n  charset gene1 = 1-1000;\n  charset gene2 = 1001-1949;\n"
                      f"  charpartition genes = {DS1_MODELS[0]}:gene1, {DS1_MODELS[1]}:gene2;\nend;\n")
    results = iqtree_agreement(folder / "alignment.fasta", partition, tree_path, tmp_path)
    for link, (ours, theirs) in results.items():
        assert ours == pytest.approx(theirs, abs=1e-3), (link, ours, theirs)


def test_loglik_command_with_partitions(example, tmp_path):
    """`jaxphylo loglik ALN TREE -p FILE --part-rates ...`: the library's sum, per part on stderr."""
    import sys

    alignment, tree = example
    scheme = example_scheme(tmp_path)
    alignment_path, tree_path = jp.example_paths()
    for flag, link, extra in (("-p", "proportional", ["--part-rates", "0.5,2,1"]),):  # -q, -Q: same code path
        result = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "loglik", str(alignment_path), str(tree_path),
                                 "-m", "JC", flag, str(tmp_path / "ex.nex"), *extra], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        rates = jnp.array([0.5, 2.0, 1.0]) if link == "proportional" else None
        expected = float(jp.log_likelihood(alignment, tree, jp.partitioned_model(scheme, alignment, link=link,
                                                                                 rates=rates)))
        assert float(result.stdout) == pytest.approx(expected, abs=1e-6)
        assert result.stderr.count("# part ") == 3
    bad = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "loglik", str(alignment_path), str(tree_path), "-m",
                          "JC", "-p", str(tmp_path / "ex.nex"), "--part-rates", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--part-rates" in bad.stderr


# Primates mtDNA (898 sites) by codon position, in the frame its sites read: sites 2-454 and 660-896 hold codons
# with no stop under the vertebrate mitochondrial code (NCBI 2) in any of the 12 taxa, 455-456 the end of a
# gene (an incomplete stop); 457-659, between the two frames, is one non-coding part. Every part names its model,
# values in braces.
PRIMATES_POSITIONS = """#nexus
begin sets;
  charset pos1 = 2-456\\3 660-.\\3;
  charset pos2 = 3-456\\3 661-.\\3;
  charset pos3 = 1-456\\3 662-.\\3;
  charset noncoding = 457-659;
  charpartition mine = HKY{6.5}+F{0.32,0.30,0.12,0.26}+G4{0.45}:pos1, GTR{1.2,8.0,0.6,0.9,12.0}+F+G4{0.3}:pos2,
      TN{9.0,15.0}+F+I{0.05}+G4{1.8}:pos3, K80{4.0}+G4{0.6}:noncoding;
end;
"""


def loglik_output(capsys, *argv):
    from jaxphylo import cli

    assert cli.main(["loglik", *map(str, argv)]) == 0
    return float(capsys.readouterr().out)


def test_loglik_without_m_is_iqtrees_on_primates_codon_positions(tmp_path, capsys):
    """`jaxphylo loglik ALN TREE -q|-Q|-p FILE` with every part's model in FILE and no -m: IQ-TREE 2's log L
    (`iqtree2 -s ALN -q FILE -te TREE -blfix`, no -m either). With -blfix, -Q leaves every part the tree's
    lengths (so both give -q's value) and -p still fits the part rates and a common scale: ours takes IQ-TREE's
    tree and rates (`--part-rates`)."""
    alignment_path = dataset("primates_mtDNA") / "alignment.fasta"
    alignment = jp.read_alignment(alignment_path)
    tree_path = tmp_path / "bionj.nwk"
    jp.write_tree(jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa), tree_path)
    partition = write(tmp_path / "positions.nex", PRIMATES_POSITIONS)
    assert None not in read_partitions(partition).models
    for flag in ("-q", "-Q"):
        theirs, _ = run_iqtree(alignment_path, flag, partition, tree_path, tmp_path / flag[1])
        ours = loglik_output(capsys, alignment_path, tree_path, flag, partition)
        assert ours == pytest.approx(theirs, abs=1e-4), (flag, ours, theirs)  # IQ-TREE prints 4 decimals
    theirs, rates = run_iqtree(alignment_path, "-p", partition, tree_path, tmp_path / "p")
    ours = loglik_output(capsys, alignment_path, tmp_path / "p.treefile", "-p", partition,
                         "--part-rates", ",".join(map(str, rates)))
    assert ours == pytest.approx(theirs, abs=1e-4), (ours, theirs)


def test_raxml_file_without_m_is_iqtrees_models(tmp_path):
    """A RAxML-style file names a model per line (`DNA` is GTR); without -m IQ-TREE 2 takes each bare, +F and no
    rate variation (GTR+F, HKY+F): so do we, with the same empirical frequencies, and at IQ-TREE's fitted
    values (its .iqtree table) our log L is IQ-TREE's."""
    alignment_path = dataset("primates_mtDNA") / "alignment.fasta"
    alignment = jp.read_alignment(alignment_path)
    tree_path = tmp_path / "bionj.nwk"
    jp.write_tree(jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa), tree_path)
    raxml = write(tmp_path / "positions.txt", "DNA, pos1 = 2-456\\3, 660-898\\3\nDNA, pos2 = 3-456\\3, 661-898\\3\n"
                                             "HKY, pos3 = 1-456\\3, 662-898\\3\nDNA, noncoding = 457-659\n")
    scheme = read_partitions(raxml)
    ours = jp.partitioned_model(scheme, alignment, default_model=None, link="equal")
    theirs, _ = run_iqtree(alignment_path, "-q", raxml, tree_path, tmp_path / "q")
    table = (tmp_path / "q.iqtree").read_text().split("  ID  Model")[1].split("\n\n")[0].splitlines()[1:]
    fitted = [line.split()[3] for line in table]
    assert [line.split()[1] for line in table] == ["GTR+F", "GTR+F", "HKY+F", "GTR+F"]
    for model, string in zip(ours.models, fitted):
        assert jp.models.model_string(model).split("+")[1:] == string.split("+")[1:]  # the same +F{...}
    at_theirs = jp.partitioned_model(dataclasses.replace(scheme, models=tuple(fitted)), alignment, None, "equal")
    value = float(jp.log_likelihood(alignment, jp.read_tree(tree_path), at_theirs))
    assert value == pytest.approx(theirs, abs=1e-3), (value, theirs)  # their values have 6 digits


def test_a_part_without_a_model_needs_m(example, tmp_path, capsys):
    """Without -m every part must name its model: else every command stops with one line naming the part
    (and the line that defined it); -m fills it; without -m or a partition file, ml and mcmc ask for -m."""
    from jaxphylo import cli

    alignment, _ = example
    alignment_path, tree_path = map(str, jp.example_paths())
    nexus = write(tmp_path / "some.nex", "#NEXUS\nbegin sets;\n  charset a = 1-300;\n  charset b = 301-600;\n"
                                         "  charpartition p = HKY+G4:a, :b;\nend;\n")
    raxml = write(tmp_path / "some.txt", "DNA, a = 1-300\nCODON, b = 301-600\n")
    for path, where in ((nexus, r"some.nex: line 4: part 'b'"), (raxml, r"some.txt: line 2: part 'b'")):
        with pytest.raises(ModelError, match=f"/{where} names no model, and no default model was given$"):
            jp.partitioned_model(read_partitions(path), alignment, default_model=None)
        for argv in (["loglik", alignment_path, tree_path], ["ml", alignment_path], ["mcmc", alignment_path],
                     ["sample", alignment_path, tree_path]):
            for flag in ("-p", "-q", "-Q"):
                assert cli.main(argv + [flag, str(path)]) == 2, (argv, flag)
                error = capsys.readouterr().err
                assert error.count("\n") == 1 and f"{where} names no model; give -m MODEL" in error, error
    filled = jp.partitioned_model(read_partitions(nexus), alignment, default_model="JC")
    assert filled.model_strings == ("HKY+G4", "JC")
    for argv in (["ml", alignment_path], ["mcmc", alignment_path]):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"jaxphylo: error: {argv[0]} needs --model MODEL (or -p/-q/-Q FILE naming " \
                                          "every part's model)\n"


def test_phylo_ctmc_takes_a_partitioned_model(example, tmp_path):
    """`PhyloCTMC(tree, partitioned model)` in a NumPyro model: its log density is the sum over parts (from an
    Alignment or PartitionedData), and NumPyro's gradient in a part rate is the partitioned one's."""
    import numpyro
    from numpyro.infer import Predictive
    from numpyro.infer.util import log_density

    alignment, tree = example
    model = jp.partitioned_model(example_scheme(tmp_path), alignment, rates=[0.7, 1.6, 1.1])
    expected = float(jp.likelihood.partitioned_log_likelihood(alignment, tree, model))
    data = partitioned_data(alignment, tree, model)
    for observed in (alignment, data):
        assert float(jp.inference.PhyloCTMC(tree, model).log_prob(observed)) == pytest.approx(expected, abs=1e-9)

    def program(rate, obs=data):
        scaled = eqx.tree_at(lambda m: m.rates, model, model.rates.at[0].set(rate))
        numpyro.sample("alignment", jp.inference.PhyloCTMC(tree, scaled), obs=obs)

    gradient = jax.grad(lambda r: log_density(program, (r,), {}, {})[0])(0.7)
    direct = jax.grad(lambda r: jnp.sum(partitioned_data_log_likelihoods(
        data, tree, eqx.tree_at(lambda m: m.rates, model, model.rates.at[0].set(r)))))(0.7)
    assert float(gradient) == pytest.approx(float(direct), rel=1e-10) and float(gradient) != 0.0
    # Drawing: every part's own sites (300, 150, 150), grouped as the data are; log_prob takes the draw back, and
    # NumPyro's Predictive simulates partitioned alignments.
    drawn = jp.inference.PhyloCTMC(tree, model).sample(jax.random.PRNGKey(0), (2,))
    assert [g.parts for g in drawn.groups] == [g.parts for g in data.groups]
    sites = {k: int(np.sum(np.asarray(g.weights)[0, j])) for g in drawn.groups for j, k in enumerate(g.parts)}
    assert sites == {0: 300, 1: 150, 2: 150}
    one = jax.tree.map(lambda x: x[0], drawn)
    assert np.isfinite(float(jp.inference.PhyloCTMC(tree, model).log_prob(one)))
    assert not np.array_equal(np.asarray(drawn.groups[0].tip_codes[0]), np.asarray(drawn.groups[0].tip_codes[1]))
    predicted = Predictive(program, num_samples=3)(jax.random.PRNGKey(1), 0.7, obs=None)
    assert predicted["alignment"].groups[0].tip_codes.shape[0] == 3
    with pytest.raises(jp.InputError, match="observes an Alignment or PartitionedData"):
        jp.inference.PhyloCTMC(tree, model).log_prob(jnp.zeros(3))
