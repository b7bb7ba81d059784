"""Reading alignments and trees, and the errors bad files give."""

import numpy as np
import pytest

import jaxphylo as jp
from conftest import dataset


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_fasta_phylip_and_nexus_give_the_same_alignment(tmp_path):
    fasta = write(tmp_path, "a.fasta", ">alpha one\nACGTRY\n>b\nAC-T?N\n>c\nACGTAC\n")
    sequential = write(tmp_path, "a.phy", "3 6\nalpha_one ACG\nTRY\nb AC-T?N\nc ACGTAC\n")
    interleaved = write(tmp_path, "b.phy", "3 6\nalpha_one ACG\nb AC-\nc ACG\n\nTRY\nT?N\nTAC\n")
    nexus = write(tmp_path, "a.nex", "#NEXUS\nbegin data;\ndimensions ntax=3 nchar=6;\n"
                  "format datatype=dna missing=? gap=-;\nmatrix\n'alpha one' ACGTRY\nb AC-T?N\nc ACGTAC\n;\nend;\n")
    reads = [jp.read_alignment(p) for p in (fasta, sequential, interleaved, nexus)]
    for a in reads:
        assert a.sequences == reads[0].sequences
        assert a.alphabet == jp.DNA
    assert reads[0].taxa == ("alpha one", "b", "c")
    assert reads[3].taxa == ("alpha one", "b", "c")


def test_ambiguity_codes_become_partial_vectors(tmp_path):
    a = jp.read_alignment(write(tmp_path, "a.fasta", ">x\nARN-\n>y\nACGT\n"))
    partials = a.site_patterns().tip_partials()
    rows = {tuple(r) for r in partials.reshape(-1, 4)}
    assert (1, 0, 1, 0) in rows  # R = A or G
    assert (1, 1, 1, 1) in rows  # N and - are missing


def test_protein_ambiguity(tmp_path):
    a = jp.read_alignment(write(tmp_path, "p.fasta", ">x\nMKBZJX\n>y\nMKLLIV\n"))
    assert a.alphabet == jp.PROTEIN
    table = a.site_patterns().tip_table
    assert sorted(table.sum(axis=1)) == [1] * 5 + [2] * 3 + [20]  # M K L I V; B Z J; X


def test_site_patterns_compress_with_weights(tmp_path):
    a = jp.read_alignment(write(tmp_path, "a.fasta", ">x\nAAAC\n>y\nAAAG\n"))
    patterns = a.site_patterns()
    assert patterns.num_patterns == 2
    assert sorted(patterns.weights) == [1, 3]


def test_codons_and_genetic_codes(tmp_path):
    path = write(tmp_path, "c.fasta", ">x\nATGTGAAAR---\n>y\nATGTGGAAAAAN\n")
    # TGA is a stop in the standard code but Trp in the vertebrate mitochondrial code
    with pytest.raises(jp.InputError, match=r"c.fasta: stop codon 'TGA' in taxon 'x' at codon 2"):
        jp.read_alignment(path, data_type="codon", genetic_code=1)
    a = jp.read_alignment(path, data_type="codon", genetic_code=2)
    assert a.alphabet.num_states == 60 and a.num_sites == 4
    assert sorted(a.site_patterns().tip_table.sum(axis=1))[:3] == [1, 1, 1]
    with pytest.raises(jp.InputError, match="not a multiple of 3"):
        jp.read_alignment(write(tmp_path, "d.fasta", ">x\nATGA\n>y\nATGG\n"), data_type="codon")
    with pytest.raises(jp.InputError, match="unknown genetic code"):
        jp.read_alignment(path, data_type="codon", genetic_code=99)


@pytest.mark.parametrize("text,message", [
    (">x\nACGT\n>y\nACG\n", r"bad.fasta: sequences differ in length: 'x' has 4, 'y' has 3"),
    (">x\nACGT\n>x\nACGA\n", r"bad.fasta: duplicate taxon name 'x'"),
    (">x\nACGT\n>y\nAC!T\n", r"bad.fasta: unknown \w+ character '!' in taxon 'y' at site 3"),
    ("hello\n", r"bad.fasta: not a FASTA, PHYLIP or NEXUS alignment"),
    ("3 10\na ACGT\nb ACGT\n", r"bad.fasta: malformed PHYLIP: expected 3 sequences of 10 sites"),
])
def test_bad_alignments_name_file_and_culprit(tmp_path, text, message):
    with pytest.raises(jp.InputError, match=message):
        jp.read_alignment(write(tmp_path, "bad.fasta", text))


def test_missing_file(tmp_path):
    with pytest.raises(jp.InputError, match="nope.fasta: cannot read alignment"):
        jp.read_alignment(tmp_path / "nope.fasta")


def test_newick_unrooted_annotations_and_quoted_labels(tmp_path):
    tree = jp.parse_newick("((A:0.1,'B c':0.2)[&rate=1.5]:0.3,C:0.4,D_d:0.5);")
    assert not tree.topology.rooted
    assert tree.taxa == ("A", "B c", "C", "D_d")
    assert tree.topology.num_nodes == 6
    clade = tree.topology.parent[0]
    assert ("rate", "1.5") in tree.topology.annotations[clade]
    np.testing.assert_allclose(tree.branch_lengths[:4], [0.1, 0.2, 0.4, 0.5])


def test_nexus_translate_block(tmp_path):
    path = write(tmp_path, "t.nex", "#NEXUS\nbegin trees;\n translate 1 Alpha, 2 'Beta x', 3 Gamma;\n"
                 " tree t1 = [&R] ((1:0.1,2:0.2)[&height=3]:0.05,3:0.3);\nend;\n")
    tree = jp.read_tree(path)
    assert tree.taxa == ("Alpha", "Beta x", "Gamma") and tree.topology.rooted
    assert ("height", "3") in tree.topology.annotations[3]


@pytest.mark.parametrize("fmt", ["newick", "nexus"])
def test_write_and_read_back(tmp_path, fmt):
    tree = jp.parse_newick("((A:0.1,'B c':0.2)[&rate=1.5]:0.3,C:0.4,D_d:0.5);")
    path = tmp_path / f"t.{fmt}"
    jp.write_tree(tree, path, format=fmt)
    again = jp.read_tree(path)
    assert again.topology == tree.topology
    np.testing.assert_allclose(again.branch_lengths, tree.branch_lengths)
    assert again.topology.annotations == tree.topology.annotations


@pytest.mark.parametrize("text,message", [
    ("((A:0.1,B:0.2:0.3,C);", r"line 1, column \d+"),
    ("((A:0.1,B:-0.2):0.3,C:1);", r"branch above taxon 'B' has length -0.2"),
    ("((A:0.1,B:nan):0.3,C:1);", r"branch above taxon 'B' has length nan"),
    ("((A:0.1,B):0.3,C:1);", r"branch above taxon 'B' has no length"),
    ("((A:0.1,A:0.1):0.3,C:1);", r"taxon 'A' appears twice"),
])
def test_bad_trees_name_file_and_culprit(tmp_path, text, message):
    with pytest.raises(jp.InputError, match=message) as error:
        jp.read_tree(write(tmp_path, "bad.nwk", text))
    assert str(error.value).count("\n") == 0 and "bad.nwk: " in str(error.value)


def test_taxa_mismatch_between_tree_and_alignment(tmp_path):
    a = jp.read_alignment(write(tmp_path, "a.fasta", ">A\nACGT\n>B\nACGT\n>C\nACGA\n"))
    tree = jp.parse_newick("((A:0.1,B:0.2):0.1,D:0.3);")
    model = jp.parse_model("JC")
    with pytest.raises(jp.InputError, match="a.fasta: taxon 'D' is in the tree but not in the alignment"):
        jp.log_likelihood(a, tree, model)


def test_real_data_sets_read(tmp_path):
    folder = dataset("carnivores")
    a = jp.read_alignment(folder / "alignment.fasta")
    assert len(a.taxa) == 62 and a.num_sites == 10869 and a.site_patterns().num_patterns == 5565
    assert "Acinonyx jubatus" in a.taxa
    tree = jp.read_tree(folder / "tree.nwk")
    assert set(tree.taxa) == set(a.taxa)
    # the data README documents stop-codon cells (62 at codon 227) under table 2
    with pytest.raises(jp.InputError, match="stop codon"):
        jp.read_alignment(folder / "alignment.fasta", data_type="codon", genetic_code=2)
