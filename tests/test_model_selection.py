"""Model selection (`jaxphylo.ml.select_model`): criteria, candidate sets, a simulated choice, IQ-TREE 2's choice."""

import math
import re
import subprocess
import sys

import numpy as np
import pytest

import jaxphylo as jp
from jaxphylo import InputError, ModelError
from jaxphylo.ml import select_model
from jaxphylo.ml.selection import (
    akaike_weights, default_candidates, fit_free_rate_sequences, information_criteria, parse_candidate,
)

from conftest import dataset, require


def test_criteria_by_hand():
    # log L = -1000, k = 10, n = 100: AIC = 20 + 2000; AICc adds 2*10*11/89; BIC = 10 ln 100 + 2000
    ic = information_criteria(-1000.0, 10, 100)
    assert ic["AIC"] == pytest.approx(2020.0)
    assert ic["AICc"] == pytest.approx(2020.0 + 220.0 / 89.0)
    assert ic["BIC"] == pytest.approx(10 * math.log(100) + 2000.0)
    assert information_criteria(-5.0, 9, 10)["AICc"] == math.inf
    # Akaike weights: exp(-D/2) normalised; D = 0, 2, 4
    w = akaike_weights([100.0, 102.0, 104.0])
    expected = np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()
    np.testing.assert_allclose(w, expected)


def test_df_as_iqtree_counts_it():
    # IQ-TREE 2 on primates_mtDNA (12 taxa: 21 branches): GTR+F 29, SYM+G4 27, TPM2+F+G4 27, GTR+F+R3 33, JC 21
    aln = jp.Alignment(tuple(f"t{i}" for i in range(12)), ("ACGT",) * 12, jp.DNA)
    df = {s: parse_candidate(s, aln).df(12) for s in ("GTR+F", "SYM+G4", "TPM2+F+G4", "GTR+F+R3", "JC", "HKY+I+G4")}
    assert df == {"GTR+F": 29, "SYM+G4": 27, "TPM2+F+G4": 27, "GTR+F+R3": 33, "JC": 21, "HKY+I+G4": 27}
    protein = jp.Alignment(tuple(f"t{i}" for i in range(12)), ("ARND",) * 12, jp.PROTEIN)
    assert parse_candidate("LG+F+G4", protein).df(12) == 21 + 19 + 1  # IQ-TREE: LG+F+G4 41
    assert parse_candidate("WAG+R2", protein).df(12) == 23


def test_candidate_sets_and_narrowing():
    aln = jp.Alignment(("a", "b", "c"), ("ACGT",) * 3, jp.DNA)
    full = default_candidates(aln)
    assert len(full) == 22 * 13  # IQ-TREE: "ModelFinder will test up to 286 DNA models"
    assert [c.name for c in full[:6]] == ["GTR+F", "GTR+F+I", "GTR+F+G4", "GTR+F+I+G4", "GTR+F+R2", "GTR+F+R3"]
    assert "TPM2+F+G4" in {c.name for c in full} and "K2P+I" in {c.name for c in full}
    narrow = default_candidates(aln, mset="TN,hky,GTR", mrate="E,G")
    assert [c.name for c in narrow] == ["TN+F", "TN+F+G4", "HKY+F", "HKY+F+G4", "GTR+F", "GTR+F+G4"]
    assert [c.rate for c in default_candidates(aln, mset="K2P", mrate="I+G,R")] == \
        ["+I+G4"] + [f"+R{k}" for k in range(2, 11)]
    protein = jp.Alignment(("a", "b", "c"), ("ARND",) * 3, jp.PROTEIN)
    assert [c.name for c in default_candidates(protein, mset="LG,WAG", mrate="G")] == \
        ["LG+G4", "LG+F+G4", "WAG+G4", "WAG+F+G4"]
    with pytest.raises(ModelError, match="unknown DNA model"):
        default_candidates(aln, mset="HKY,XYZ")
    with pytest.raises(ModelError, match="unknown rate type"):
        default_candidates(aln, mrate="G,Q")
    with pytest.raises(ModelError, match="criterion"):
        select_model(aln, criterion="DIC")
    with pytest.raises(InputError, match="at least 3 taxa"):
        select_model(jp.Alignment(("a", "b"), ("ACGT",) * 2, jp.DNA))


def test_free_rate_stopping_rule():
    """+R k (and +I+R k apart) in increasing k, one step of every sequence per batch; a sequence stops at the first
    k whose criterion is strictly worse than at k - 1 (that k still fitted); a tie goes on; none goes past +R10."""
    aln = jp.Alignment(("a", "b", "c"), ("ACGT",) * 3, jp.DNA)
    candidates = default_candidates(aln, mset="GTR,HKY,JC", mrate="R,I+R")
    given = {"GTR+F+R2": 100.0, "GTR+F+R3": 90.0, "GTR+F+R4": 95.0,
             "GTR+F+I+R2": 50.0, "GTR+F+I+R3": 50.0, "GTR+F+I+R4": 49.0, "GTR+F+I+R5": 60.0,
             "HKY+F+I+R2": 10.0, "HKY+F+I+R3": 11.0, "JC+R2": 5.0, "JC+R3": 6.0, "JC+I+R2": 5.0, "JC+I+R3": 5.5}
    given.update({f"HKY+F+R{k}": 100.0 - k for k in range(2, 11)})  # always better: up to -cmax
    batches = []
    fit_free_rate_sequences(candidates, lambda batch: batches.append([c.name for c in batch]),
                            lambda c: given[c.name])
    fitted = [name for batch in batches for name in batch]
    assert sorted(fitted) == sorted(given) and len(fitted) == len(set(fitted))
    assert batches[0] == ["GTR+F+R2", "GTR+F+I+R2", "HKY+F+R2", "HKY+F+I+R2", "JC+R2", "JC+I+R2"]
    assert batches[3] == ["GTR+F+I+R5", "HKY+F+R5"] and batches[-1] == ["HKY+F+R10"] and len(batches) == 9


def test_free_rate_start_is_the_discrete_gamma():
    """+R k starts from Yang's k Gamma category means, computed on the host (no program per k): the model's own."""
    from jaxphylo.ml.selection import gamma_category_means
    from jaxphylo.models import discrete_gamma_rates

    for shape in (0.0202, 0.3, 1.0, 7.5, 990.0):
        np.testing.assert_allclose(gamma_category_means(shape, 3),
                                   np.asarray(discrete_gamma_rates(np.float64(shape), 3)), rtol=1e-12)


def _iqtree_rows(log_text):
    """[(number, model, BIC)] of the ModelFinder table of an IQ-TREE 2 .log, in the order tested."""
    rows = re.findall(r"^\s*(\d+)\s+(\S+)\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$", log_text, re.M)
    return [(int(number), name, float(bic)) for number, name, bic in rows]


def test_candidates_and_free_rate_rule_as_iqtree(tmp_path):
    """IQ-TREE 2's own run (-mset JC,HKY,GTR -mrate E,I,G,I+G,R,I+R, fixed tree) on data simulated under
    HKY+I+R4: its candidate list (the count it announces; each tested model's number is its place in ours) is
    ours, and our +R k rule, given IQ-TREE's BIC values, asks for exactly the +R and +I+R models it tested."""
    require("iqtree2")
    taxa = tuple(f"t{i}" for i in range(10))
    tree = jp.random_topology_tree(taxa, seed=4)
    model = jp.parse_model("HKY{4}+F{0.3,0.2,0.2,0.3}+I{0.2}+R4{0.3,0.05,0.3,0.5,0.25,1.5,0.15,3.5}")
    alignment = jp.simulate(tree, model, 4000, seed=5)
    (tmp_path / "sim.fasta").write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    jp.write_tree(tree, tmp_path / "sim.nwk")
    subprocess.run(["iqtree2", "-s", str(tmp_path / "sim.fasta"), "-te", str(tmp_path / "sim.nwk"), "-m", "MF",
                    "-mset", "JC,HKY,GTR", "-mrate", "E,I,G,I+G,R,I+R", "-nt", "1", "-seed", "1", "-redo", "-quiet",
                    "-pre", str(tmp_path / "iq")], check=True, capture_output=True, timeout=300)
    text = (tmp_path / "iq.log").read_text()
    ours = default_candidates(alignment, mset="JC,HKY,GTR", mrate="E,I,G,I+G,R,I+R")
    assert int(re.search(r"ModelFinder will test up to (\d+) DNA models", text).group(1)) == len(ours) == 3 * 22
    rows = _iqtree_rows(text)
    assert [ours[number - 1].name for number, _, _ in rows] == [name for _, name, _ in rows]
    tested = {name: bic for _, name, bic in rows}
    assert "HKY+F+R4" in tested and "HKY+F+R5" not in tested  # the data take the rule past +R3
    free = [c for c in ours if c.categories]
    asked = []
    fit_free_rate_sequences(free, lambda batch: asked.extend(c.name for c in batch), lambda c: tested[c.name])
    assert sorted(asked) == sorted(name for name in tested if "+R" in name)
    # the rate types of a given -mrate are all fitted for every model (IQ-TREE filters only its default set)
    assert {name.split("+", 1)[0] for name in tested if name.endswith("+I+G4")} == {"JC", "HKY", "GTR"}


@pytest.fixture(scope="module")
def simulated_selection():
    """12 taxa x 2000 sites simulated under TN93+G4 (kappas 6 and 2, shape 0.5), four candidate families x {E, G}."""
    taxa = tuple(f"t{i}" for i in range(12))
    tree = jp.bionj(np.abs(np.subtract.outer(np.arange(12.0), np.arange(12.0))) * 0.03 + 0.05 * (1 - np.eye(12)),
                    taxa)
    model = jp.parse_model("TN93{6,2}+F{0.35,0.15,0.2,0.3}+G4{0.5}")
    alignment = jp.simulate(tree, model, 2000, seed=3)
    return select_model(alignment, mset="JC,HKY,TN,GTR", mrate="E,G")


def test_bic_picks_the_simulating_family(simulated_selection, tmp_path):
    result = simulated_selection
    assert result.best == "TN+F+G4"
    assert result.best_model == "TN93+F+G4"
    assert result.model_string.startswith("TN93{")  # fitted values in braces, parseable again
    jp.parse_model(result.model_string)
    rows = {f.model: f for f in result.fits}
    assert rows["GTR+F+G4"].log_likelihood >= rows["TN+F+G4"].log_likelihood - 0.05  # nested: never worse
    assert sum(f.weight for f in result.fits) == pytest.approx(1.0)
    path = tmp_path / "sim.models.tsv"
    result.to_tsv(path)
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == ["model", "log_likelihood", "df", "AIC", "AICc", "BIC", "weight_BIC"]
    assert len(lines) == 1 + 8 and lines[1].startswith("TN+F+G4\t")


def _iqtree_table(log_text):
    """{model: log L} from the ModelFinder table of an IQ-TREE 2 .log."""
    rows = re.findall(r"^\s*\d+\s+(\S+)\s+([\d.]+)\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s*$", log_text, re.M)
    return {name: -float(value) for name, value in rows}


def test_narrowed_set_against_iqtree(tmp_path):
    folder = dataset("primates_mtDNA")
    require("iqtree2")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    result = select_model(alignment, mset="HKY,TN,GTR", mrate="E,G")
    jp.write_tree(result.tree, tmp_path / "bionj.nwk")
    subprocess.run(["iqtree2", "-s", str(folder / "alignment.fasta"), "-te", str(tmp_path / "bionj.nwk"), "-m", "MF",
                    "-mset", "HKY,TN,GTR", "-mrate", "E,G", "-nt", "1", "-seed", "1", "-redo", "-quiet",
                    "-pre", str(tmp_path / "iq")], check=True, capture_output=True, timeout=300)
    text = (tmp_path / "iq.log").read_text()
    theirs = _iqtree_table(text)
    assert set(theirs) == {f.model for f in result.fits}
    for fit in result.fits:
        assert fit.log_likelihood == pytest.approx(theirs[fit.model], abs=0.05), fit.model
    chosen = re.search(r"Best-fit model: (\S+) chosen according to BIC", text).group(1)
    assert result.best == chosen


def test_models_command_selects_a_model_per_part(tmp_path):
    """`jaxphylo models ALN -p FILE`: two genes simulated under JC and under HKY+F+G4 (kappa 6, shape 0.3) on
    one tree; each part gets its own family, and the written best scheme reads back with those models."""
    taxa = tuple(f"t{i}" for i in range(8))
    tree = jp.random_topology_tree(taxa, seed=1)
    first = jp.simulate(tree, jp.parse_model("JC"), 300, seed=1)
    second = jp.simulate(tree, jp.parse_model("HKY{6.0}+F{0.4,0.1,0.1,0.4}+G4{0.3}"), 900, seed=2)
    path = tmp_path / "genes.fasta"
    path.write_text("".join(f">{t}\n{a}{b}\n" for t, a, b in zip(taxa, first.sequences, second.sequences)))
    (tmp_path / "genes.txt").write_text("DNA, jc_gene = 1-300\nDNA, hky_gene = 301-1200\n")
    result = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "models", str(path), "-p", str(tmp_path / "genes.txt"),
                             "--mset", "JC,HKY", "--mrate", "E,G", "--quiet"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Best-fit models according to BIC: jc_gene: JC, hky_gene: HKY+F+G4" in result.stdout, result.stdout
    scheme = jp.read_partitions(tmp_path / "genes.fasta.best_scheme.nex")
    assert scheme.names == ("jc_gene", "hky_gene") and scheme.models == ("JC69", "HKY85+F+G4")
    assert [len(c) for c in scheme.sites(1200)] == [300, 900]
    assert (tmp_path / "genes.fasta.hky_gene.models.tsv").read_text().splitlines()[1].startswith("HKY+F+G4\t")
    (tmp_path / "codon.txt").write_text("CODON, c = 1-300\nDNA, d = 301-1200\n")
    codon = subprocess.run([sys.executable, "-m", "jaxphylo.cli", "models", str(path), "-p", str(tmp_path / "codon.txt")],
                           capture_output=True, text=True, timeout=600)
    assert codon.returncode == 2 and "part 'c' is codon data" in codon.stderr, codon.stderr
    assert len(codon.stderr.strip().splitlines()) == 1
