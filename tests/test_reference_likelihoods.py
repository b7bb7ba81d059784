"""Log-likelihoods against independent programs: IQ-TREE 2 and PAML codeml.

Tolerance |delta| < max(1e-3, 1e-7 |logL|): IQ-TREE prints four decimals
(rounding error 5e-5) and works in its own float64 arithmetic with per-site
scaling; a real disagreement in a model or in data handling moves a
log-likelihood by far more than 1e-3 (a 1% change in one frequency moves DS1's
by about 0.5). codeml prints six decimals, the same tolerance applies.
"""

import subprocess

import numpy as np
import pytest

import jaxphylo as jp
from conftest import dataset, iqtree_log_likelihood, require, write_fasta

pytestmark = pytest.mark.reference

FREQ = "+F{0.3,0.2,0.2,0.3}"
NUCLEOTIDE_MODELS = [
    "JC", "K80{2.7}", "F81" + FREQ, "HKY{2.5}" + FREQ, "TN{3.1,1.7}" + FREQ,
    "GTR{1.2,3.4,0.8,1.1,4.0}" + FREQ,
]
RATE_TERMS = ["", "+G4{0.5}", "+I{0.15}", "+I{0.1}+G4{0.8}", "+R3{0.2,0.1,0.5,0.8,0.3,2.0}"]
AMINO_ACID_MODELS = ["LG", "WAG", "JTT", "LG+F"]


def tolerance(value):
    return max(1e-3, 1e-7 * abs(value))


def check(alignment_path, tree_path, model, tmp_path, data_type=None, iqtree_model=None, iqtree_options=(), **read):
    """Our log L of `model` against IQ-TREE's of `iqtree_model` (default: the same string) run with `iqtree_options`."""
    alignment = jp.read_alignment(alignment_path, data_type=data_type, **read)
    tree = jp.read_tree(tree_path)
    ours = float(jp.log_likelihood(alignment, tree, jp.parse_model(model, alignment=alignment)))
    iq_type = {"protein": "AA", "dna": "DNA"}.get(alignment.alphabet.name)
    reference = iqtree_log_likelihood(alignment_path, tree_path, iqtree_model or model, tmp_path, iq_type,
                                      iqtree_options)
    assert abs(ours - reference) < tolerance(reference), (model, ours, reference)
    return ours


@pytest.mark.parametrize("rates", RATE_TERMS)
@pytest.mark.parametrize("model", NUCLEOTIDE_MODELS)
def test_nucleotide_models_on_real_data(model, rates, tmp_path):
    folder = dataset("DS1")
    check(folder / "alignment.fasta", folder / "tree.nwk", model + rates, tmp_path)


@pytest.mark.parametrize("model", ["HKY{2.5}" + FREQ + "+G4m{0.5}",
                                   "GTR{1.2,3.4,0.8,1.1,4.0}" + FREQ + "+I{0.1}+G4m{0.8}"])
def test_median_gamma_against_iqtree_gamma_median(model, tmp_path):
    """+G4m is IQ-TREE 2's +G4 run with `--gamma-median` (the mean-rate +G4 differs by ~12 log units here)."""
    folder = dataset("DS1")
    check(folder / "alignment.fasta", folder / "tree.nwk", model, tmp_path, iqtree_model=model.replace("G4m", "G4"),
          iqtree_options=("--gamma-median",))


@pytest.mark.parametrize("name", ["primates_mtDNA", "dengue4_env", "rsv2"])
def test_empirical_frequencies_on_more_real_data(name, tmp_path):
    folder = dataset(name)
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tree_path = folder / "tree.nwk"
    if not tree_path.exists():  # no published tree: a random one on the same taxa
        tree = jp.random_topology_tree(alignment.taxa, seed=3)
        tree_path = tmp_path / "tree.nwk"
        jp.write_tree(tree, tree_path)
    check(folder / "alignment.fasta", tree_path, "GTR{1.5,4.0,0.7,1.2,5.0}+F+I{0.2}+G4{0.6}", tmp_path)


@pytest.mark.parametrize("model", NUCLEOTIDE_MODELS[::2])
def test_nucleotide_models_on_simulated_data_with_gaps(model, tmp_path):
    taxa = [f"s{i}" for i in range(40)]
    tree = jp.random_topology_tree(taxa, seed=5, mean_branch_length=0.15)
    truth = jp.parse_model(model + "+G4{0.7}")
    alignment = jp.simulate(tree, truth, 500, seed=9, missing=0.05)
    tree_path = tmp_path / "tree.nwk"
    jp.write_tree(tree, tree_path)
    check(write_fasta(alignment, tmp_path / "aln.fasta"), tree_path, model + "+G4{0.7}", tmp_path)


@pytest.fixture(scope="module")
def protein_alignment(tmp_path_factory):
    """Real amino-acid data: the carnivore mitochondrial genes translated (NCBI table 2)."""
    from Bio.Data import CodonTable

    table = CodonTable.unambiguous_dna_by_id[2]

    folder = dataset("carnivores")
    dna = jp.read_alignment(folder / "alignment.fasta")
    path = tmp_path_factory.mktemp("protein") / "carnivores_aa.fasta"
    with open(path, "w") as handle:
        for name, sequence in zip(dna.taxa, dna.sequences):
            codons = [sequence[i:i + 3] for i in range(0, 1200, 3)]
            protein = "".join(table.forward_table.get(c, "X") if "-" not in c else "-" for c in codons)
            handle.write(f">{name.replace(' ', '_')}\n{protein.replace('*', 'X')}\n")
    tree_text = (folder / "tree.nwk").read_text()
    for name in dna.taxa:  # IQ-TREE turns spaces into underscores
        tree_text = tree_text.replace(f"'{name}'", name.replace(" ", "_"))
    (path.parent / "tree.nwk").write_text(tree_text)
    return path, path.parent / "tree.nwk"


@pytest.mark.parametrize("rates", ["", "+G4{0.5}", "+I{0.2}+G4{0.9}"])
@pytest.mark.parametrize("model", AMINO_ACID_MODELS)
def test_amino_acid_models_on_real_data(model, rates, protein_alignment, tmp_path):
    alignment_path, tree_path = protein_alignment
    check(alignment_path, tree_path, model + rates, tmp_path, data_type="protein")


@pytest.fixture(scope="module")
def codeml_case(tmp_path_factory):
    """Carnivores, codon columns with gaps or stops removed (codeml's cleandata=1), plain names."""
    require("codeml")
    folder = dataset("carnivores")
    work = tmp_path_factory.mktemp("codeml")
    dna = jp.read_alignment(folder / "alignment.fasta")
    sense = set(jp.codon_alphabet(2).states)
    keep = [i for i in range(0, len(dna.sequences[0]), 3) if all(s[i:i + 3] in sense for s in dna.sequences)]
    names = [f"T{i}" for i in range(len(dna.taxa))]
    with open(work / "aln.phy", "w") as handle:
        handle.write(f"{len(names)} {3 * len(keep)}\n")
        for name, sequence in zip(names, dna.sequences):
            handle.write(f"{name}  {''.join(sequence[i:i + 3] for i in keep)}\n")
    text = (folder / "tree.nwk").read_text()
    for name, short in zip(dna.taxa, names):
        text = text.replace(f"'{name}'", short)
    (work / "tree.nwk").write_text(text)
    return work


def codeml_log_likelihood(work, codon_freq, kappa, omega, alpha):
    control = f"""seqfile = aln.phy
treefile = tree.nwk
outfile = out.txt
noisy = 0
verbose = 0
runmode = 0
seqtype = 1
CodonFreq = {codon_freq}
clock = 0
model = 0
NSsites = 0
icode = 1
fix_kappa = 1
kappa = {kappa}
fix_omega = 1
omega = {omega}
fix_alpha = 1
alpha = {alpha}
ncatG = 4
getSE = 0
RateAncestor = 0
cleandata = 1
fix_blength = 2
method = 0
"""
    (work / "codeml.ctl").write_text(control)
    subprocess.run(["codeml", "codeml.ctl"], cwd=work, check=True, capture_output=True, timeout=600)
    line = next(l for l in (work / "out.txt").read_text().splitlines() if l.startswith("lnL"))
    return float(line.split(":")[-1].split()[0])


@pytest.mark.parametrize("frequencies,codon_freq", [("+FQ", 0), ("+F1X4", 1), ("+F3X4", 2), ("+F", 3)])
@pytest.mark.parametrize("kappa,omega,alpha", [(2.5, 0.3, 0), (1.5, 1.4, 0.5)])
def test_gy94_against_codeml(codeml_case, frequencies, codon_freq, kappa, omega, alpha):
    alignment = jp.read_alignment(codeml_case / "aln.phy", data_type="codon", genetic_code=2)
    tree = jp.read_tree(codeml_case / "tree.nwk")
    model = f"GY{{kappa={kappa},omega={omega}}}{frequencies}" + (f"+G4{{{alpha}}}" if alpha else "")
    ours = float(jp.log_likelihood(alignment, tree, jp.parse_model(model, alignment=alignment)))
    reference = codeml_log_likelihood(codeml_case, codon_freq, kappa, omega, alpha)
    assert abs(ours - reference) < tolerance(reference), (model, ours, reference)


@pytest.mark.parametrize("model", ["GTR{1.2,3.4,0.8,1.1,4.0}" + FREQ + "+I{0.1}+G4{0.5}", "LG+G4{0.5}"])
def test_float32_within_1e3_relative_of_float64(model, protein_alignment):
    if model.startswith("LG"):
        alignment = jp.read_alignment(protein_alignment[0], data_type="protein")
        tree = jp.read_tree(protein_alignment[1])
    else:
        folder = dataset("DS1")
        alignment = jp.read_alignment(folder / "alignment.fasta")
        tree = jp.read_tree(folder / "tree.nwk")
    parsed = jp.parse_model(model, alignment=alignment)
    double = float(jp.log_likelihood(alignment, tree, parsed))
    single = float(jp.log_likelihood(alignment, tree, parsed, precision="float32"))
    assert abs(single - double) < 1e-3 * abs(double)
    assert np.isfinite(single)
