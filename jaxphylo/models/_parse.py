"""Model strings in IQ-TREE's syntax, e.g. `GTR{1,2,1,1,2}+F{.3,.2,.2,.3}+G4{0.5}+I{0.1}`.

A string is a substitution model followed by `+` terms, each with optional
values in braces. Values given are fixed starting values; those left out get
the defaults below (IQ-TREE's starting values).
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from .._alignment import Alignment
from .._alphabet import DNA, PROTEIN, codon_alphabet
from .._errors import ModelError
from ._amino_acid import EMPIRICAL_MODELS, EmpiricalAminoAcid, empirical_matrix
from ._codon import GY94
from ._frequencies import codon_frequencies, empirical_frequencies
from ._model import Model
from ._nucleotide import F81, GTR, HKY85, JC69, K80, TN93
from ._rates import DiscreteGamma, FreeRates, InvariantSites, UniformRates

_ALIASES = {
    "JC": "JC69", "JC69": "JC69", "F81": "F81", "K80": "K80", "K2P": "K80",
    "HKY": "HKY85", "HKY85": "HKY85", "TN": "TN93", "TN93": "TN93", "GTR": "GTR",
    "LG": "LG", "WAG": "WAG", "JTT": "JTT", "GY": "GY94", "GY94": "GY94",
}
_NUMBER_OF_VALUES = {"JC69": (0,), "F81": (0,), "K80": (1,), "HKY85": (1,), "TN93": (2,), "GTR": (5, 6), "GY94": (2,)}
_EQUAL_FREQUENCY_MODELS = ("JC69", "K80")
_TERM = re.compile(r"^([A-Za-z][A-Za-z0-9]*?)(\d*)(?:\{([^{}]*)\})?$")
_BASE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)()(?:\{([^{}]*)\})?$")


def parse_model(string: str, alignment: Alignment | None = None, genetic_code: int | None = None) -> Model:
    """The model that `string` names, in IQ-TREE's syntax.

    Substitution models: JC69, F81, K80 (K2P), HKY85, TN93, GTR; LG, WAG, JTT;
    GY94 (codons; values `kappa`, `omega`, named or in that order).
    Terms: `+F{...}` fixed frequencies, `+F` empirical (from `alignment`),
    `+FQ` equal, `+FO` estimated (empirical start), `+F1X4`/`+F3X4` for codons (`+F` is F61 there); `+G[k]{shape}`,
    `+I{proportion}`, `+R k{w1,r1,...,wk,rk}`.
    Nucleotide and codon frequencies default to empirical when `alignment` is
    given, else to equal; amino-acid models default to their own. The genetic
    code comes from `genetic_code` or the codon alignment (default: 1, standard).
    """
    terms = _split(string)
    base_name, _, base_values = _parse_term(terms[0], string, _BASE)
    key = _ALIASES.get(base_name.upper())
    if key is None:
        raise ModelError(f"model {string!r}: unknown substitution model {base_name!r}; "
                         f"known: {', '.join(sorted(set(_ALIASES.values())))}")
    alphabet = _alphabet(key, alignment, genetic_code, string)
    frequency_term, rate_terms = None, []
    for term in terms[1:]:
        name, number, values = _parse_term(term, string)
        if name.upper().startswith("F"):
            if frequency_term is not None:
                raise ModelError(f"model {string!r}: more than one frequency term")
            frequency_term = (name.upper() + number, values)
        elif name.upper() in ("G", "I", "R"):
            rate_terms.append((name.upper(), number, values))
        else:
            raise ModelError(f"model {string!r}: unknown term '+{term}'")
    pi = _frequencies(key, alphabet, frequency_term, alignment, string)
    substitution = _substitution(key, base_values, pi, alphabet, string)
    return Model(substitution, _rate_variation(rate_terms, string))


def estimated_parameters(string: str) -> frozenset[str]:
    """The parts of the model that `string` leaves free, for inference.

    Among `exchangeabilities` (kappa, GTR rates, omega...), `frequencies`,
    `gamma_shape`, `proportion_invariant` and `free_rates`. Values in braces
    fix a part; so do `+F` (empirical counts, as in IQ-TREE), `+FQ`, `+F1X4`,
    `+F3X4` and the built-in frequencies of JC69, K80 and amino-acid models.
    Frequencies are free with no frequency term or with `+FO`. Call it on a
    string that `parse_model` accepts.
    """
    terms = _split(string)
    base_name, _, base_values = _parse_term(terms[0], string, _BASE)
    key = _ALIASES[base_name.upper()]
    free = set()
    if key not in ("JC69", "F81") + EMPIRICAL_MODELS and base_values is None:
        free.add("exchangeabilities")
    frequency = [t for t in terms[1:] if t[:1].upper() == "F"]
    if (not frequency and key not in _EQUAL_FREQUENCY_MODELS + EMPIRICAL_MODELS) or \
            (frequency and frequency[0].upper() == "FO"):
        free.add("frequencies")
    for term in terms[1:]:
        name, _, values = _parse_term(term, string)
        if values is None and name.upper() in ("G", "I", "R"):
            free.add({"G": "gamma_shape", "I": "proportion_invariant", "R": "free_rates"}[name.upper()])
    return frozenset(free)


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
    return jnp.asarray(value, float)


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
    v = _positional(values, _NUMBER_OF_VALUES[key], (), key, string) or []
    v = [_positive(f"{key} rate", x, string, allow_zero=True) for x in v]
    if key == "JC69":
        return JC69(pi)
    if key == "F81":
        return F81(pi)
    if key == "K80":
        return K80(v[0] if v else 2.0, pi)
    if key == "HKY85":
        return HKY85(v[0] if v else jnp.asarray(2.0), pi)
    if key == "TN93":
        return TN93(*(v if v else [jnp.asarray(2.0)] * 2), pi)
    rates = jnp.stack(v + ([jnp.asarray(1.0)] if len(v) == 5 else [])) if v else jnp.ones(6)
    return GTR(rates, pi)


def _frequencies(key, alphabet, term, alignment, string):
    n = alphabet.num_states
    if term is None:
        if key in EMPIRICAL_MODELS:
            return None
        if key in _EQUAL_FREQUENCY_MODELS or alignment is None:
            return jnp.full(n, 1.0 / n)
        term = ("F3X4" if key == "GY94" else "F", None)
    name, values = term
    if values is not None:
        if name != "F":
            raise ModelError(f"model {string!r}: only +F takes frequency values")
        pi = np.array([values.get(k, np.nan) for k in range(len(values))])
        if len(pi) != n:
            raise ModelError(f"model {string!r}: +F needs {n} frequencies, got {len(pi)}")
        if (pi < 0).any() or not np.isfinite(pi).all() or abs(pi.sum() - 1) > 1e-3:
            raise ModelError(f"model {string!r}: frequencies must be >= 0 and sum to 1 (sum {pi.sum():g})")
        return jnp.asarray(pi / pi.sum())
    if name == "FQ":
        return jnp.full(n, 1.0 / n)
    if name == "FO":  # estimated (by inference); starts from the empirical counts
        name = "F" if alignment is not None else "FQ"
        if name == "FQ":
            return jnp.full(n, 1.0 / n)
    codon_methods = {"F": "F61", "F1X4": "F1X4", "F3X4": "F3X4"}
    if name not in ("F",) + (tuple(codon_methods) if key == "GY94" else ()):
        raise ModelError(f"model {string!r}: unsupported frequency term '+{name}'")
    if alignment is None:
        raise ModelError(f"model {string!r}: empirical frequencies (+{name}) need the alignment: "
                         "parse_model(string, alignment=...)")
    if key == "GY94":
        return jnp.asarray(codon_frequencies(alignment, codon_methods[name]))
    return jnp.asarray(empirical_frequencies(alignment))


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
            invariant = jnp.asarray(p, float)
            continue
        if not isinstance(rates, UniformRates):
            raise ModelError(f"model {string!r}: only one of +G and +R may be given")
        k = int(number) if number else 4
        if k < 1:
            raise ModelError(f"model {string!r}: +{name} needs at least one category")
        if name == "G":
            if len(listed) > 1:
                raise ModelError(f"model {string!r}: +G takes one shape value")
            rates = DiscreteGamma(_positive("Gamma shape", listed[0] if listed else 1.0, string), k)
        else:
            if listed and len(listed) != 2 * k:
                raise ModelError(f"model {string!r}: +R{k} takes {2 * k} values (weight, rate pairs)")
            pairs = np.reshape(listed, (k, 2)) if listed else np.column_stack([np.full(k, 1 / k), np.arange(1, k + 1)])
            if (pairs <= 0).any():
                raise ModelError(f"model {string!r}: +R weights and rates must be positive")
            rates = FreeRates(jnp.asarray(pairs[:, 0]), jnp.asarray(pairs[:, 1]))
    return rates if invariant is None else InvariantSites(invariant, rates)


def model_string(model: Model) -> str:
    """`model` in IQ-TREE's syntax with every value in braces, so that `parse_model` gives it back.

    E.g. `GTR{1.2,3.4,0.8,1.1,4,1}+F{0.3,0.2,0.2,0.3}+G4{0.52}`. Equal-frequency
    models (JC69, K80) and amino-acid models with their own frequencies write
    no frequency term.
    """
    sub, rates = model.substitution, model.rate_variation
    numbers = lambda values: ",".join(f"{float(v):.6g}" for v in jnp.ravel(jnp.asarray(values)))
    if isinstance(sub, EmpiricalAminoAcid):
        text = sub.name
        own = empirical_matrix(sub.name)[1]
        if not np.allclose(np.asarray(sub.frequencies), own / own.sum(), atol=1e-12):
            text += f"+F{{{numbers(sub.frequencies)}}}"
    else:
        text = {JC69: "JC69", K80: "K80", F81: "F81", HKY85: "HKY85", TN93: "TN93", GTR: "GTR", GY94: "GY94"}[type(sub)]
        values = {K80: lambda s: [s.kappa], HKY85: lambda s: [s.kappa], GY94: lambda s: [s.kappa, s.omega],
                  TN93: lambda s: [s.kappa_purine, s.kappa_pyrimidine], GTR: lambda s: s.rates / s.rates[-1]}
        if type(sub) in values:
            text += f"{{{numbers(jnp.stack([jnp.asarray(v) for v in values[type(sub)](sub)]))}}}"
        if not isinstance(sub, (JC69, K80)):
            text += f"+F{{{numbers(sub.frequencies)}}}"
    invariant = rates.proportion_invariant if isinstance(rates, InvariantSites) else None
    base = rates.base if isinstance(rates, InvariantSites) else rates
    if invariant is not None:
        text += f"+I{{{numbers(invariant)}}}"
    if isinstance(base, DiscreteGamma):
        text += f"+G{base.num_categories}{{{numbers(base.shape)}}}"
    elif isinstance(base, FreeRates):
        weights = base.weights / jnp.sum(base.weights)
        means = base.rates / jnp.sum(weights * base.rates)
        text += f"+R{weights.shape[0]}{{{numbers(jnp.stack([weights, means], axis=1))}}}"
    return text
