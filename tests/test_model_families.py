"""IQ-TREE's model families: every named reversible DNA model, the frequency terms and
the empirical amino-acid matrices, each against IQ-TREE 2 on real data.

Log-likelihoods: a fixed tree (BIONJ), fixed branch lengths and fixed model values
(`iqtree2 -te TREE -blfix -m MODEL{...}`). Tolerance 1e-4 absolute: IQ-TREE prints
log L with four decimals, so its rounding alone is up to 5e-5, and every difference
seen here is within that. A wrong rate class, frequency or matrix entry moves these
log-likelihoods by far more (in TIM2{0.6,3.3,5.2} on primates_mtDNA, swapping the AT
and CG rates moves log L by 17.6; tying AC to AG instead of AT, by 250).

Parameter counts: the free parameters that `estimated_parameters` and ML's
unconstrained coordinates give a model string must equal IQ-TREE's "Number of free
parameters" for the same string with branch lengths fixed (its df). Strings use
`+FO` where frequencies are free: IQ-TREE counts `+F`'s empirical frequencies as
parameters, while here (as in IQ-TREE's fitting) they are fixed, not estimated.
"""

import re
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import handlers

import jaxphylo as jp
from conftest import dataset, require
from jaxphylo import ModelError
from jaxphylo.models import ModelCoordinates, default_priors, sample_model
from jaxphylo.models import resolve_model
from jaxphylo.models import EMPIRICAL_MODELS, NAMED_DNA_MODELS, ConstrainedGTR, model_string

pytestmark = pytest.mark.reference

FREQ = "+F{0.3,0.2,0.2,0.3}"
# Rates in IQ-TREE's order for each model: the classes in order of first appearance among AC, AG, AT, CG, CT
# (GT's class is 1). Equal-frequency models take no frequency term.
DNA_MODELS = [
    "JC", "F81" + FREQ, "K2P{2.7}", "HKY{2.5}" + FREQ, "TNe{3.1,1.7}", "TN{3.1,1.7}" + FREQ,
    "K3P{2.5,0.6}", "K3Pu{2.5,0.6}" + FREQ, "TPM2{0.7,3.0}", "TPM2u{0.7,3.0}" + FREQ,
    "TPM3{0.7,3.0}", "TPM3u{0.7,3.0}" + FREQ, "TIMe{3.2,0.5,4.1}", "TIM{3.2,0.5,4.1}" + FREQ,
    "TIM2e{0.6,3.3,5.2}", "TIM2{0.6,3.3,5.2}" + FREQ, "TIM3e{0.6,3.3,5.2}", "TIM3{0.6,3.3,5.2}" + FREQ,
    "TVMe{1.2,3.4,0.8,1.1}", "TVM{1.2,3.4,0.8,1.1}" + FREQ, "SYM{1.2,3.4,0.8,1.1,4.0}",
    "GTR{1.2,3.4,0.8,1.1,4.0}" + FREQ,
    # aliases, a six-digit code, GT's class rate given, and every frequency term
    "K81{2.5,0.6}", "K81u{2.5,0.6}" + FREQ, "010232{0.6,3.3,5.2}" + FREQ, "TIM2{1.2,6.6,10.4,2}" + FREQ,
    "TIM2{0.6,3.3,5.2}", "TIM2{0.6,3.3,5.2}+F", "TIM2{0.6,3.3,5.2}+FQ", "TIM2{0.6,3.3,5.2}+FU",
    "HKY{2.5}+FU", "K3P{2.5,0.6}+F", "TIM2e{0.6,3.3,5.2}+FO",
    # rate variation on the new models
    "TIM2{0.6,3.3,5.2}" + FREQ + "+I{0.2}+G4{0.5}", "K3Pu{2.5,0.6}+F+R3{0.2,0.1,0.5,0.8,0.3,2.0}",
]
PROTEIN_MODELS = list(EMPIRICAL_MODELS) + [
    "LG+F", "LG+FQ", "LG+FU", "WAG+F{" + ",".join(["0.08", "0.02"] + ["0.05"] * 18) + "}", "Q.pfam+I{0.2}+G4{0.5}",
    "Q.pfam_gb+F", "mtInv+I{0.2}+G4{0.7}", "Poisson+G4{0.5}",
]


def iqtree(alignment_path, tree_path, model, workdir, data_type=None, fix_lengths=True):
    """IQ-TREE 2's `(log L, number of free parameters)` for `model` on the fixed tree."""
    require("iqtree2")
    # IQ-TREE 2.0.7 gives TPM2 and TPM3 empirical frequencies, against its documentation (and later
    # versions): equal frequencies are asked for explicitly, which later versions read the same.
    if re.match(r"^TPM[23](\{[^}]*\})?(\+[GIR]|$)", model):
        model = re.sub(r"^(TPM[23](\{[^}]*\})?)", r"\1+FQ", model)
    prefix = workdir / "iq"
    command = ["iqtree2", "-s", str(alignment_path), "-te", str(tree_path), "-m", model, "-pre", str(prefix),
               "-redo", "-quiet", "-nt", "1", "-seed", "1", "-keep-ident"] + ["-blfix"] * fix_lengths
    if data_type:
        command += ["-st", data_type]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    report = prefix.with_suffix(".iqtree").read_text()
    log_likelihood = float(re.search(r"Log-likelihood of the tree: (\S+)", report).group(1))
    free = int(re.search(r"Number of free parameters \(#branches \+ #model parameters\): (\d+)", report).group(1))
    return log_likelihood, free


@pytest.fixture(scope="module")
def dna_case(tmp_path_factory):
    folder = dataset("primates_mtDNA")
    alignment = jp.read_alignment(folder / "alignment.fasta")
    tree = jp.bionj(jp.distances(alignment), alignment.taxa)
    tree_path = tmp_path_factory.mktemp("dna") / "tree.nwk"
    jp.write_tree(tree, tree_path)
    return alignment, folder / "alignment.fasta", jp.read_tree(tree_path), tree_path


@pytest.fixture(scope="module")
def protein_case(tmp_path_factory):
    """15 carnivores, 400 codons without a stop among them, translated with NCBI table 2."""
    from Bio.Data import CodonTable

    table = CodonTable.unambiguous_dna_by_id[2]
    dna = jp.read_alignment(dataset("carnivores") / "alignment.fasta")
    chosen = range(0, 60, 4)
    sequences = [dna.sequences[i] for i in chosen]
    starts = [i for i in range(0, len(sequences[0]) - 2, 3)
              if not any(s[i:i + 3] in table.stop_codons for s in sequences)][:400]
    path = tmp_path_factory.mktemp("protein") / "protein.fasta"
    with open(path, "w") as handle:
        for i, sequence in zip(chosen, sequences):
            codons = [sequence[k:k + 3] for k in starts]
            protein = "".join(table.forward_table.get(c, "X") if "-" not in c else "-" for c in codons)
            handle.write(f">{dna.taxa[i].replace(' ', '_')}\n{protein}\n")
    alignment = jp.read_alignment(path, data_type="protein")
    tree = jp.bionj(jp.distances(alignment), alignment.taxa)
    jp.write_tree(tree, path.parent / "tree.nwk")
    return alignment, path, jp.read_tree(path.parent / "tree.nwk"), path.parent / "tree.nwk"


def _ours(case, model):
    alignment, _, tree, _ = case
    return float(jp.log_likelihood(alignment, tree, jp.parse_model(model, alignment=alignment)))


@pytest.mark.parametrize("model", DNA_MODELS)
def test_dna_models_against_iqtree(model, dna_case, tmp_path):
    reference, _ = iqtree(dna_case[1], dna_case[3], model, tmp_path)
    ours = _ours(dna_case, model)
    assert abs(ours - reference) < 1e-4, (model, ours, reference)


@pytest.mark.parametrize("model", PROTEIN_MODELS)
def test_amino_acid_models_against_iqtree(model, protein_case, tmp_path):
    reference, _ = iqtree(protein_case[1], protein_case[3], model, tmp_path, data_type="AA")
    ours = _ours(protein_case, model)
    assert abs(ours - reference) < 1e-4, (model, ours, reference)


def test_every_matrix_is_a_modelfinder_candidate():
    """`--mset` takes every matrix, in any case; the default list is IQ-TREE 2.0.7's 21 (its `-m MF` log)."""
    from jaxphylo.ml.selection import default_candidates

    protein = jp.Alignment(("a", "b", "c"), ("ARND",) * 3, jp.PROTEIN)
    names = [c.name for c in default_candidates(protein, mset=",".join(m.lower() for m in EMPIRICAL_MODELS), mrate="E")]
    assert names == [n for m in EMPIRICAL_MODELS for n in (m, m + "+F")]
    assert [c.base for c in default_candidates(protein, mrate="E")][::2] == [
        "LG", "WAG", "JTT", "JTTDCMut", "DCMut", "VT", "PMB", "Blosum62", "Dayhoff", "mtREV", "mtART", "mtZOA",
        "mtMet", "mtVer", "mtInv", "mtMAM", "HIVb", "HIVw", "FLU", "rtREV", "cpREV"]


def _needs_class_rate_priors(model):
    if isinstance(model.substitution, ConstrainedGTR) and "class_rates" not in default_priors():
        pytest.xfail("sampling ConstrainedGTR's class rates needs the 'class_rates' site in "
                     "jaxphylo/inference/_model_priors.py (see the model-families report)")


def _free_parameter_count(model_string_, alignment):
    template, free = resolve_model(model_string_, alignment)
    _needs_class_rate_priors(template)
    return sum(int(np.size(v)) for v in ModelCoordinates(template, free).start().values())


@pytest.mark.parametrize("name", list(NAMED_DNA_MODELS) + ["LG"])
def test_free_parameters_match_iqtree_df(name, dna_case, protein_case, tmp_path):
    equal = name in NAMED_DNA_MODELS and NAMED_DNA_MODELS[name][1]
    model = name if equal else name + "+FO"
    case, data_type = (protein_case, "AA") if name == "LG" else (dna_case, None)
    _, df = iqtree(case[1], case[3], model, tmp_path, data_type=data_type)
    assert _free_parameter_count(model, case[0]) == df, (model, df)


@pytest.mark.parametrize("model,sites", [("TIM2+FQ", {"class_rates": (4,)}),
                                         ("K3Pu+FO", {"class_rates": (3,), "frequencies": (4,)})])
def test_sample_sites_of_constrained_models(model, sites):
    parsed = jp.parse_model(model)
    _needs_class_rate_priors(parsed)
    free = jp.models.estimated_parameters(model)
    trace = handlers.trace(handlers.seed(sample_model, jax.random.PRNGKey(1))).get_trace(parsed, free)
    assert {name: np.shape(site["value"]) for name, site in trace.items()} == sites
    sampled = handlers.seed(sample_model, jax.random.PRNGKey(1))(parsed, free).substitution
    rates = np.asarray(sampled.six_rates())  # AC AG AT CG CT GT, tied as the model says
    tied = {"TIM2+FQ": [(0, 2), (3, 5)], "K3Pu+FO": [(1, 4), (2, 3), (0, 5)]}[model]
    assert all(rates[i] == rates[j] for i, j in tied) and len(set(rates.tolist())) == sites["class_rates"][0]


@pytest.mark.parametrize("model", ["TIM2", "K3Pu"])
def test_ml_fit_reaches_iqtrees_optimum(model, dna_case, tmp_path):
    """Branch lengths and free rates fitted on the BIONJ topology (frequencies +F, fixed, as in IQ-TREE)."""
    alignment, alignment_path, tree, tree_path = dna_case
    _needs_class_rate_priors(jp.parse_model(model, alignment=alignment))
    reference, _ = iqtree(alignment_path, tree_path, model, tmp_path, fix_lengths=False)
    result = jp.ml.fit(alignment, tree, model)
    assert abs(result.log_likelihood - reference) < 0.05, (model, result.log_likelihood, reference)
    assert isinstance(result.model.substitution, ConstrainedGTR) and "class_rates" in result.parameters


ROUND_TRIP = ["TIM2{0.6,3.3,5.2}" + FREQ + "+I{0.2}", "K3P{2.5,0.6}", "TIM2e{1,2,3,4}", "TNe{2,3}",
              "010232{1,2,3}+F{0.1,0.2,0.3,0.4}", "Q.bird+F{" + ",".join(["0.08", "0.02"] + ["0.05"] * 18) + "}",
              "HKY{2.5}" + FREQ + "+I{0.1}+G4m{0.6}", "K80{2}+G8m{0.3}"]


@pytest.mark.parametrize("model", ROUND_TRIP + ["K3P with other frequencies"])
def test_model_string_round_trip(model):
    if model in ROUND_TRIP:
        parsed = jp.parse_model(model)
    else:  # written as its free-frequency counterpart, K3Pu
        parsed = jp.Model(ConstrainedGTR("K3P", [2.0, 3.0, 1.0], [0.1, 0.2, 0.3, 0.4]))
    text = model_string(parsed)
    again = jp.parse_model(text)
    assert type(again.substitution) is type(parsed.substitution), text
    np.testing.assert_allclose(again.substitution.rate_matrix(), parsed.substitution.rate_matrix(), rtol=1e-5)
    for a, b in zip(parsed.rate_categories(), again.rate_categories()):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_median_gamma_terms_stay_median_when_parameters_move():
    """+G4m, +Gm (4 categories), +I+G4m: median rates, the shape free unless given, and still median (written
    `+G4m`) after ML's coordinates or a prior draw replace the shape."""
    model = jp.parse_model("HKY+I+Gm")
    assert model.rate_variation.base.median and model.rate_variation.base.num_categories == 4
    assert not jp.parse_model("HKY+G4").rate_variation.median
    assert jp.models.estimated_parameters("HKY+I+G4m") == {"exchangeabilities", "frequencies", "gamma_shape",
                                                            "proportion_invariant"}
    assert jp.models.estimated_parameters("HKY{2}+F+G4m{0.5}") == frozenset()
    free = jp.models.estimated_parameters("HKY+I+G4m")
    coordinates = ModelCoordinates(model, free)
    moved = coordinates.model({name: value + 0.3 for name, value in coordinates.start().items()})
    drawn = handlers.seed(sample_model, jax.random.PRNGKey(1))(model, free)
    for other in (moved, drawn):
        assert float(other.rate_variation.base.shape) != 1.0
        assert re.search(r"\+I\{[^}]*\}\+G4m\{[^}]*\}$", model_string(other)), model_string(other)


def test_named_models_are_their_rate_classes():
    """K80 = HKY85's exchangeabilities; TNe, SYM are TN93, GTR with equal frequencies; the rest tie as coded."""
    six = lambda m: np.asarray(m.substitution.exchangeabilities())[[0, 0, 0, 1, 1, 2], [1, 2, 3, 2, 3, 3]]
    np.testing.assert_allclose(six(jp.parse_model("K3P{2,3}")), [1, 2, 3, 3, 2, 1])
    np.testing.assert_allclose(six(jp.parse_model("TPM2{2,3}")), [2, 3, 2, 1, 3, 1])
    np.testing.assert_allclose(six(jp.parse_model("TPM3{2,3}")), [2, 3, 1, 2, 3, 1])
    np.testing.assert_allclose(six(jp.parse_model("TIM{2,3,4}")), [1, 2, 3, 3, 4, 1])
    np.testing.assert_allclose(six(jp.parse_model("TIM2{2,3,4}")), [2, 3, 2, 1, 4, 1])
    np.testing.assert_allclose(six(jp.parse_model("TIM3{2,3,4}")), [2, 3, 1, 2, 4, 1])
    np.testing.assert_allclose(six(jp.parse_model("TVM{2,3,4,5}")), [2, 3, 4, 5, 3, 1])
    np.testing.assert_allclose(six(jp.parse_model("TNe{2,3}")), [1, 2, 1, 1, 3, 1])
    np.testing.assert_allclose(jp.parse_model("SYM").frequencies, 0.25)
    assert type(jp.parse_model("TNe").substitution) is jp.models.TN93
    assert jp.models.estimated_parameters("TIM2e+FO") == {"exchangeabilities"}
    assert jp.models.estimated_parameters("TIM2+FO+G4") == {"exchangeabilities", "frequencies", "gamma_shape"}
    assert jp.models.estimated_parameters("Q.pfam+FU") == frozenset()


@pytest.mark.parametrize("model,token", [
    ("K80{2}+F{0.1,0.2,0.3,0.4}", "+F{...}"), ("HKY+FU{0.1,0.2,0.3,0.4}", "+FU"), ("LG+F1X4", "+F1X4"),
    ("TIM2{1,2}", "TIM2"), ("GY+FU", "+FU"), ("TIM9", "TIM9"), ("HKY+FX", "+FX"), ("Q.pfam{1}", "Q.pfam"),
    ("K3Pu{2,3,0}", "GT"), ("0102{1}", "0102"),
])
def test_errors_name_the_model_and_the_token(model, token):
    with pytest.raises(ModelError) as raised:
        jp.parse_model(model)
    message = str(raised.value)
    assert "\n" not in message and repr(model) in message and token in message, message


@pytest.mark.parametrize("spec, kinds", [
    ("JC", ("Decomposed", "FixedCategories")),
    ("HKY{2.5}+F+G4{0.4}", ("Decomposed", "FixedCategories")),
    ("GTR{1,2,1,1,3}+FQ+I{0.1}+G4{0.7}", ("Decomposed", "FixedCategories")),
    ("HKY{3}+G4", ("HKY85", "DiscreteGamma")),  # frequencies and shape estimated: nothing to fix
    ("HKY+FQ+R3{0.2,0.5,0.3,0.3,1,2.5}", ("HKY85", "FixedCategories")),
    ("LG+G4{0.5}", ("Decomposed", "FixedCategories")),
])
def test_a_models_fixed_parts_computed_once_give_the_same_likelihood_and_gradient(spec, kinds, dna_case,
                                                                                  protein_case):
    """`Model.with_fixed_parts` (what samplers use when a model's parameters do not move: the eigensystem and rate
    categories computed once) changes no number: log L within 1e-12 relative and the branch-length gradient within
    1e-10 of the model computed from its parameters, on real DNA and protein data (float64; the two differ only in
    the order of a few sums)."""
    from jaxphylo.models import estimated_parameters

    alignment, _, tree, _ = protein_case if spec.startswith("LG") else dna_case
    model = jp.parse_model(spec, alignment=alignment)
    fixed = model.with_fixed_parts(estimated_parameters(spec))
    assert (type(fixed.substitution).__name__, type(fixed.rate_variation).__name__) == kinds

    def value_and_gradient(m):
        return jax.value_and_grad(lambda b: jp.log_likelihood(alignment, tree.with_branch_lengths(b), m))(
            jnp.asarray(tree.branch_lengths))

    (value, gradient), (mine, my_gradient) = value_and_gradient(model), value_and_gradient(fixed)
    assert float(mine) == pytest.approx(float(value), rel=1e-12)
    np.testing.assert_allclose(my_gradient, gradient, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fixed.substitution.rate_matrix(), model.substitution.rate_matrix(), atol=1e-12)
