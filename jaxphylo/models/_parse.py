"""Model strings in IQ-TREE's syntax, e.g. `GTR{1,2,1,1,2}+F{.3,.2,.2,.3}+G4{0.5}+I{0.1}`.

A string is a substitution model followed by `+` terms, each with optional
values in braces. Values given are fixed starting values; those left out get
the defaults below (IQ-TREE's starting values).
"""

from __future__ import annotations

import re

import jax
import numpy as np

from ..data import Alignment, DNA, PROTEIN, codon_alphabet
from .._errors import ModelError
from ..runtime import to_device
from ._amino_acid import EMPIRICAL_MODELS, EmpiricalAminoAcid, empirical_matrix
from ._codon import GY94
from ._frequencies import codon_frequencies, empirical_frequencies
from ._model import Model
from ._nucleotide import F81, GTR, HKY85, JC69, K80, NAMED_DNA_MODELS, TN93, ConstrainedGTR, rate_classes
from ._rates import DiscreteGamma, FreeRates, InvariantSites, UniformRates

_ALIASES = {
    **{name.upper(): name for name in NAMED_DNA_MODELS},
    "JC": "JC69", "K2P": "K80", "HKY": "HKY85", "TN": "TN93", "TRN": "TN93", "TNEF": "TNe", "TRNE": "TNe",
    "TRNEF": "TNe", "K81": "K3P", "TPM1": "K3P", "K81U": "K3Pu", "K81UF": "K3Pu", "K3PUF": "K3Pu", "TPM1U": "K3Pu",
    "TPM1UF": "K3Pu", "TPM2UF": "TPM2u", "TPM3UF": "TPM3u", "TIMEF": "TIMe", "TIM1": "TIM", "TIM1E": "TIMe",
    "TIM1EF": "TIMe", "TIM2EF": "TIM2e", "TIM3EF": "TIM3e", "TVMEF": "TVMe", "REV": "GTR",
    **{name.upper(): name for name in EMPIRICAL_MODELS},
    "GY": "GY94", "GY94": "GY94",
}
# Models with their own classes (and NumPyro sites); TNe and SYM are TN93 and GTR with equal frequencies.
_CLASSES = {"JC69": JC69, "F81": F81, "K80": K80, "HKY85": HKY85, "TN93": TN93, "TNe": TN93, "GTR": GTR, "SYM": GTR}
_FREE_COUNTERPART = {"JC69": "F81", "K80": "HKY85", "TNe": "TN93", "K3P": "K3Pu", "TPM2": "TPM2u", "TPM3": "TPM3u",
                     "TIMe": "TIM", "TIM2e": "TIM2", "TIM3e": "TIM3", "TVMe": "TVM", "SYM": "GTR"}
_FREQUENCY_TERMS = ("F", "FO", "FQ", "FU")
_CODON_FREQUENCY_TERMS = ("F1X4", "F3X4")
_TERM = re.compile(r"^([A-Za-z][A-Za-z0-9]*?)(\d*)(?:\{([^{}]*)\})?$")
_BASE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._]*)()(?:\{([^{}]*)\})?$")  # `_`: Q.pfam_gb
_MEDIAN_GAMMA = re.compile(r"^G(\d*)M$")  # `_TERM` reads +G4m as the name `G4m`: its digits sit inside
_RATE_KINDS = {"G": "gamma_shape", "GM": "gamma_shape", "I": "proportion_invariant", "R": "free_rates"}


def canonical_name(name: str) -> str | None:
    """The canonical name of a substitution model as any of its aliases names it (`HKY`, `hky85` -> `HKY85`;
    `K81u` -> `K3Pu`; `lg` -> `LG`), or None. The one alias table of the package."""
    return _ALIASES.get(name.upper())


def parse_model(string: str, alignment: Alignment | None = None, genetic_code: int | None = None) -> Model:
    """The model that `string` names, in IQ-TREE's syntax.

    DNA: IQ-TREE's named reversible models, each a GTR with tied rates
    (`NAMED_DNA_MODELS`: JC69, F81, K80/K2P, HKY85, TNe, TN93, K3P/K81, K3Pu/K81u,
    TPM2, TPM2u, TPM3, TPM3u, TIMe, TIM, TIM2e, TIM2, TIM3e, TIM3, TVMe, TVM, SYM,
    GTR), or a six-digit rate-class code such as `010232`. Values in braces are
    the free rates in IQ-TREE's order (`rate_classes`), optionally followed by
    the rate of GT's class (otherwise 1). JC69, K80, TNe, K3P, TPM2, TPM3, TIMe,
    TIM2e, TIM3e, TVMe and SYM have equal frequencies by definition: as in
    IQ-TREE 2 a frequency term leaves them equal, and `+F{...}` is an error.
    Protein: `EMPIRICAL_MODELS` (LG, WAG, JTT, Dayhoff, ..., Q.bird, Poisson).
    Codons: GY94 (values `kappa`, `omega`, named or in that order).

    Frequency terms: `+F` empirical (from `alignment`; F61 for codons), `+FO`
    estimated (empirical start), `+FQ` equal, `+FU` the model's own (a protein
    matrix's; equal for DNA, as IQ-TREE's user-defined frequencies with none
    given), `+F{...}` fixed values, `+F1X4`/`+F3X4` for codons. Rate terms:
    `+G[k]{shape}` (categories' mean rates, as IQ-TREE), `+G[k]m{shape}` (their
    medians, rescaled to mean one: BEAST 1.10, IQ-TREE's `--gamma-median`),
    `+I{proportion}`, `+R k{w1,r1,...,wk,rk}`.
    Without a frequency term nucleotide and codon models use empirical
    frequencies when `alignment` is given, else equal; amino-acid models their
    own. The genetic code comes from `genetic_code` or the codon alignment
    (default: 1, standard).
    """
    terms = _split(string)
    key, base_values = _base(terms[0], string)
    alphabet = _alphabet(key, alignment, genetic_code, string)
    frequency_term, rate_terms = None, []
    for term in terms[1:]:
        name, number, values = _parse_term(term, string)
        kind, number = _rate_kind(name, number)
        if name.upper().startswith("F"):
            if frequency_term is not None:
                raise ModelError(f"model {string!r}: more than one frequency term ('+{term}')")
            frequency_term = (name.upper() + number, values)
        elif kind is not None:
            rate_terms.append((kind, number, values))
        else:
            raise ModelError(f"model {string!r}: unknown term '+{term}'")
    pi = _frequencies(key, alphabet, frequency_term, alignment, string)
    substitution = _substitution(key, base_values, pi, alphabet, string)
    return Model(substitution, _rate_variation(rate_terms, string))


def estimated_parameters(string: str) -> frozenset[str]:
    """The parts of the model that `string` leaves free, for inference.

    Among `exchangeabilities` (kappa, GTR or class rates, omega...),
    `frequencies`, `gamma_shape`, `proportion_invariant` and `free_rates`.
    Values in braces fix a part; so do `+F` (empirical counts, as in IQ-TREE),
    `+FQ`, `+FU`, `+F1X4`, `+F3X4`, the equal frequencies of JC69, K80, TNe,
    K3P, TPM2, TPM3, TIMe, TIM2e, TIM3e, TVMe and SYM (whatever the frequency
    term), and the built-in frequencies of amino-acid models. Frequencies are
    free with no frequency term (nucleotide and codon models) or with `+FO`.
    Call it on a string that `parse_model` accepts.
    """
    terms = _split(string)
    key, base_values = _base(terms[0], string)
    free = set()
    if base_values is None and key not in EMPIRICAL_MODELS and _rate_class_count(key) != 1:  # JC69, F81: one class
        free.add("exchangeabilities")
    frequency = [t for t in terms[1:] if t[:1].upper() == "F"]
    if not _equal_by_definition(key) and (
            (not frequency and key not in EMPIRICAL_MODELS) or (frequency and frequency[0].upper() == "FO")):
        free.add("frequencies")
    for term in terms[1:]:
        name, number, values = _parse_term(term, string)
        kind, _ = _rate_kind(name, number)
        if values is None and kind is not None:
            free.add(_RATE_KINDS[kind])
    return frozenset(free)


def _rate_kind(name, number):
    """`(kind, number of categories)` of a rate term: kind `G`, `GM` (median Gamma, `+G4m`), `I`, `R`, or None.

    `_TERM` leaves a median term's digits in its name (`G4m`, number ''): they are moved to the number here.
    """
    upper = name.upper()
    median = _MEDIAN_GAMMA.match(upper)
    if median and not number:
        return "GM", median.group(1)
    return (upper if upper in ("G", "I", "R") else None), number  # not `GM`: that name has digits after it (`+Gm4`)


def _base(term, string):
    """`(canonical model name or six-digit code, values in braces)` of the substitution model."""
    name, _, values = _parse_term(term, string, _BASE)
    if len(name) == 6 and name.isdigit():
        return name, values
    key = canonical_name(name)
    if key is None:
        known = sorted(set(_ALIASES.values()) - set(EMPIRICAL_MODELS)) + list(EMPIRICAL_MODELS)
        raise ModelError(f"model {string!r}: unknown substitution model {name!r}; known: {', '.join(known)}, "
                         "or a six-digit rate-class code")
    return key, values


def _equal_by_definition(key):
    return key in NAMED_DNA_MODELS and NAMED_DNA_MODELS[key][1]


def _rate_class_count(key):
    if key in EMPIRICAL_MODELS or key == "GY94":
        return None
    code = NAMED_DNA_MODELS[key][0] if key in NAMED_DNA_MODELS else key
    return max(rate_classes(code)) + 1


def _split(string):
    if not isinstance(string, str) or not string.strip():
        raise ModelError(f"model string must be non-empty text, not {string!r}")
    terms, depth, current = [], 0, ""
    for ch in string.strip():
        depth += (ch == "{") - (ch == "}")
        if depth < 0 or depth > 1:
            raise ModelError(f"model {string!r}: unbalanced braces")
        if ch == "+" and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ModelError(f"model {string!r}: unbalanced braces")
    terms.append(current)
    if any(not t.strip() for t in terms):
        raise ModelError(f"model {string!r}: empty term")
    return [t.strip() for t in terms]


def _parse_term(term, string, pattern=_TERM):
    match = pattern.match(term)
    if not match:
        raise ModelError(f"model {string!r}: cannot read term {term!r}")
    name, number, body = match.groups()
    if body is None:
        return name, number, None
    values = {}
    for k, item in enumerate(body.split(",")):
        label, _, text = item.rpartition("=")
        try:
            values[label.strip().lower() or k] = float(text)
        except ValueError:
            raise ModelError(f"model {string!r}: {item.strip()!r} in {term!r} is not a number") from None
    return name, number, values


def _alphabet(key, alignment, genetic_code, string):
    if key == "GY94":
        if genetic_code is None:
            genetic_code = alignment.alphabet.genetic_code if alignment is not None and alignment.alphabet.genetic_code else 1
        alphabet = codon_alphabet(genetic_code)
    else:
        alphabet = PROTEIN if key in EMPIRICAL_MODELS else DNA
    if alignment is not None and alignment.alphabet != alphabet:
        raise ModelError(f"model {string!r} is for {alphabet.name} data but {alignment.source} "
                         f"holds {alignment.alphabet.name} data")
    return alphabet


def _positional(values, count, names, term, string):
    if values is None:
        return None
    named = [n for n in names if n in values]
    if named:
        unknown = set(values) - set(names)
        if unknown:
            raise ModelError(f"model {string!r}: unknown parameter {sorted(map(str, unknown))[0]!r} in {term}")
        return values
    if len(values) not in count:
        raise ModelError(f"model {string!r}: {term} takes {' or '.join(map(str, count))} values, got {len(values)}")
    return [values[k] for k in range(len(values))]


def _positive(name, value, string, allow_zero=False):
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ModelError(f"model {string!r}: {name} must be positive, got {value}")
    return to_device(value, float)


def _substitution(key, values, pi, alphabet, string):
    if key in EMPIRICAL_MODELS:
        if values:
            raise ModelError(f"model {string!r}: {key} takes no values")
        return EmpiricalAminoAcid(key, pi)
    if key == "GY94":
        v = _positional(values, (2,), ("kappa", "omega"), "GY94", string)
        if isinstance(v, dict):
            kappa, omega = v.get("kappa", 2.0), v.get("omega", 0.5)
        else:
            kappa, omega = v if v else (2.0, 0.5)
        return GY94(_positive("kappa", kappa, string), _positive("omega", omega, string, True), pi, alphabet)
    return _rate_class_model(key, values, pi, string)


def _rate_class_model(key, values, pi, string):
    """A DNA model from its `k` class rates in IQ-TREE's order (`k - 1` given, GT's class 1, or all `k`)."""
    k = _rate_class_count(key)
    v = _positional(values, (0,) if k == 1 else (k - 1, k), (), key, string) or []
    v = [float(_positive(f"{key} rate", x, string, allow_zero=True)) for x in v]
    if len(v) == k - 1:
        v.append(1.0)
    elif v and v[-1] == 0:
        raise ModelError(f"model {string!r}: the rate of GT's class (the last value) must be positive")
    if key in ("JC69", "F81"):
        return _CLASSES[key](pi)
    if key in ("K80", "HKY85"):
        return _CLASSES[key](to_device(v[0] / v[1] if v else 2.0, float), pi)
    if key in ("TN93", "TNe"):
        purine, pyrimidine = (v[0] / v[2], v[1] / v[2]) if v else (2.0, 2.0)
        return TN93(to_device(purine, float), to_device(pyrimidine, float), pi)
    if key in ("GTR", "SYM"):
        return GTR(to_device(v if v else np.ones(6), float), pi)
    return ConstrainedGTR(key, to_device(v, float) if v else None, pi)


def _frequencies(key, alphabet, term, alignment, string):
    n = alphabet.num_states
    equal = to_device(np.full(n, 1.0 / n))
    if term is None:
        if key in EMPIRICAL_MODELS:
            return None
        if _equal_by_definition(key) or alignment is None:
            return equal
        term = ("F3X4" if key == "GY94" else "F", None)
    name, values = term
    known = _FREQUENCY_TERMS + (_CODON_FREQUENCY_TERMS if key == "GY94" else ())
    if name not in known:
        raise ModelError(f"model {string!r}: unknown frequency term '+{name}' for {key}; "
                         f"known: {', '.join('+' + k for k in known)}, +F{{...}}")
    if values is not None:
        if name != "F":
            raise ModelError(f"model {string!r}: '+{name}{{...}}' takes no values; give frequencies as +F{{...}}")
        if _equal_by_definition(key):
            raise ModelError(f"model {string!r}: {key} has equal base frequencies by definition (IQ-TREE ignores "
                             f"'+F{{...}}' there); use {_FREE_COUNTERPART[key]} for given frequencies")
        pi = np.array([values.get(k, np.nan) for k in range(len(values))])
        if len(pi) != n:
            raise ModelError(f"model {string!r}: +F needs {n} frequencies, got {len(pi)}")
        if (pi < 0).any() or not np.isfinite(pi).all() or abs(pi.sum() - 1) > 1e-3:
            raise ModelError(f"model {string!r}: frequencies must be >= 0 and sum to 1 (sum {pi.sum():g})")
        return to_device(pi / pi.sum())
    if _equal_by_definition(key) or name == "FQ":  # IQ-TREE 2 keeps these models' equal frequencies whatever the term
        return equal
    if name == "FU":  # the model's own: a protein matrix's; nucleotide models have none but equal ones
        if key == "GY94":
            raise ModelError(f"model {string!r}: '+FU': GY94 has no frequencies of its own; "
                             "use +F, +F1X4, +F3X4, +FQ or +F{...}")
        return None if key in EMPIRICAL_MODELS else equal
    if name == "FO":  # estimated (by inference); starts from the empirical counts
        if alignment is None:
            return equal
        name = "F"
    if alignment is None:
        raise ModelError(f"model {string!r}: empirical frequencies (+{name}) need the alignment: "
                         "parse_model(string, alignment=...)")
    if key == "GY94":
        return to_device(codon_frequencies(alignment, {"F": "F61", "F1X4": "F1X4", "F3X4": "F3X4"}[name]))
    return to_device(empirical_frequencies(alignment))


def _rate_variation(terms, string):
    rates, invariant = UniformRates(), None
    for name, number, values in terms:
        listed = [values[k] for k in sorted(values)] if values else []
        if name == "I":
            if invariant is not None or number:
                raise ModelError(f"model {string!r}: malformed +I term")
            p = listed[0] if listed else 0.1
            if len(listed) > 1 or not 0 <= p < 1:
                raise ModelError(f"model {string!r}: +I takes one proportion in [0, 1), got {listed}")
            invariant = to_device(p, float)
            continue
        if not isinstance(rates, UniformRates):
            raise ModelError(f"model {string!r}: only one of +G and +R may be given")
        k = int(number) if number else 4
        if k < 1:
            raise ModelError(f"model {string!r}: +{'Gm' if name == 'GM' else name} needs at least one category")
        if name in ("G", "GM"):
            if len(listed) > 1:
                raise ModelError(f"model {string!r}: +G takes one shape value")
            rates = DiscreteGamma(_positive("Gamma shape", listed[0] if listed else 1.0, string), k, name == "GM")
        else:
            if listed and len(listed) != 2 * k:
                raise ModelError(f"model {string!r}: +R{k} takes {2 * k} values (weight, rate pairs)")
            pairs = np.reshape(listed, (k, 2)) if listed else np.column_stack([np.full(k, 1 / k), np.arange(1, k + 1)])
            if (pairs <= 0).any():
                raise ModelError(f"model {string!r}: +R weights and rates must be positive")
            rates = FreeRates(to_device(pairs[:, 0], float), to_device(pairs[:, 1], float))
    return rates if invariant is None else InvariantSites(invariant, rates)


def model_string(model: Model) -> str:
    """`model` in IQ-TREE's syntax with every value in braces, so that `parse_model` gives it back.

    E.g. `GTR{1.2,3.4,0.8,1.1,4,1}+F{0.3,0.2,0.2,0.3}+G4{0.52}` (`+G4m{0.52}` for median rates),
    `TIM2{2.1,4.5,6.3}+F{...}` (class rates over GT's). Equal-frequency models
    (JC69, K80, K3P, TIM2e, ...) with equal frequencies and amino-acid models
    with their own frequencies write no frequency term; an equal-frequency
    model given other frequencies is written as its free-frequency counterpart.
    """
    # On the host: eager jnp arithmetic would compile a program per operation and shape for a line of text.
    model = jax.tree.map(np.asarray, model)
    sub, rates = model.substitution, model.rate_variation
    numbers = lambda values: ",".join(f"{float(v):.6g}" for v in np.ravel(np.asarray(values)))
    if isinstance(sub, EmpiricalAminoAcid):
        text = sub.name
        own = empirical_matrix(sub.name)[1]
        if not np.allclose(np.asarray(sub.frequencies), own / own.sum(), atol=1e-12):
            text += f"+F{{{numbers(sub.frequencies)}}}"
    else:
        if isinstance(sub, ConstrainedGTR):
            name = sub.name
        else:
            name = {JC69: "JC69", K80: "K80", F81: "F81", HKY85: "HKY85", TN93: "TN93", GTR: "GTR",
                    GY94: "GY94"}[type(sub)]
        equal = bool(np.allclose(np.asarray(sub.frequencies), 0.25, rtol=0, atol=1e-12))
        if _equal_by_definition(name) and not equal:
            name = _FREE_COUNTERPART[name]
        text = name
        values = {K80: lambda s: [s.kappa], HKY85: lambda s: [s.kappa], GY94: lambda s: [s.kappa, s.omega],
                  TN93: lambda s: [s.kappa_purine, s.kappa_pyrimidine], GTR: lambda s: s.rates / s.rates[-1],
                  ConstrainedGTR: lambda s: s.class_rates[:-1] / s.class_rates[-1]}
        if type(sub) in values:
            text += f"{{{numbers(np.stack([np.asarray(v) for v in values[type(sub)](sub)]))}}}"
        if not _equal_by_definition(name):
            text += f"+F{{{numbers(sub.frequencies)}}}"
    invariant = rates.proportion_invariant if isinstance(rates, InvariantSites) else None
    base = rates.base if isinstance(rates, InvariantSites) else rates
    if invariant is not None:
        text += f"+I{{{numbers(invariant)}}}"
    if isinstance(base, DiscreteGamma):
        text += f"+G{base.num_categories}{'m' if base.median else ''}{{{numbers(base.shape)}}}"
    elif isinstance(base, FreeRates):
        weights = base.weights / np.sum(base.weights)
        means = base.rates / np.sum(weights * base.rates)
        text += f"+R{weights.shape[0]}{{{numbers(np.stack([weights, means], axis=1))}}}"
    return text
