"""ModelFinder's candidates as IQ-TREE 2.0.7 lists them: substitution models (DNA in IQ-TREE's order and
names, protein matrices with and without `+F`) times rate types, `--mset`/`--mrate` read as IQ-TREE reads
them, and its rule for `+R k` (stop at the first k whose criterion is worse than k - 1)."""

from __future__ import annotations

from dataclasses import dataclass
from ...data import Alignment, DNA, PROTEIN
from ..._errors import InputError, ModelError
from ...models import (
    canonical_name,
    EMPIRICAL_MODELS,
    NAMED_DNA_MODELS,
    rate_classes,
)


SCORE_DIFF_THRESHOLD = 10.0  # IQ-TREE 2's score_diff_thres: rate types kept after the first model


MAX_INVARIANT = 0.999


FREE_RATE_RANGE = (2, 10)  # IQ-TREE's -cmin / -cmax


# IQ-TREE name -> (our name for parse_model and rate classes, frequencies: "F" free-frequency model or "equal")
DNA_ORDER = ("GTR", "SYM", "TVM", "TVMe", "TIM3", "TIM3e", "TIM2", "TIM2e", "TIM", "TIMe", "TPM3u", "TPM3", "TPM2u",
             "TPM2", "K3Pu", "K3P", "TN", "TNe", "HKY", "K2P", "F81", "JC")


_DNA_NAMES = {
    "GTR": "GTR", "SYM": "SYM", "TVM": "TVM", "TVMe": "TVMe", "TIM3": "TIM3", "TIM3e": "TIM3e", "TIM2": "TIM2",
    "TIM2e": "TIM2e", "TIM": "TIM", "TIMe": "TIMe", "TPM3u": "TPM3u", "TPM3": "TPM3u", "TPM2u": "TPM2u",
    "TPM2": "TPM2u", "K3Pu": "K3Pu", "K3P": "K3P", "TN": "TN93", "TNe": "TNe", "HKY": "HKY85", "K2P": "K80",
    "F81": "F81", "JC": "JC69",
}


_EQUAL_IN_IQTREE = {"SYM", "TVMe", "TIM3e", "TIM2e", "TIMe", "K3P", "TNe", "K2P", "JC"}


_DNA_SHOWN = {canonical_name(name): name for name in DNA_ORDER}  # a model's name as IQ-TREE's ModelFinder shows it


# IQ-TREE 2.0.7's default protein list, in its order (its `-m MF` log); `--mset` may name any of EMPIRICAL_MODELS.
PROTEIN_ORDER = ("LG", "WAG", "JTT", "JTTDCMut", "DCMut", "VT", "PMB", "Blosum62", "Dayhoff", "mtREV", "mtART",
                 "mtZOA", "mtMet", "mtVer", "mtInv", "mtMAM", "HIVb", "HIVw", "FLU", "rtREV", "cpREV")


_RATE_ALIASES = {"E": "", "I": "+I", "G": "+G4", "G4": "+G4", "I+G": "+I+G4", "I+G4": "+I+G4"}


@dataclass(frozen=True)
class Candidate:
    """One model to fit: `name` as IQ-TREE prints it (e.g. `TPM2+F+G4`), its parts, and the free-parameter count."""

    name: str
    base: str  # IQ-TREE's substitution name (or a protein matrix)
    frequency: str  # "+F" or ""
    rate: str  # "", "+I", "+G4", "+I+G4", "+R3", "+I+R3"

    @property
    def protein(self) -> bool:
        return self.base in EMPIRICAL_MODELS

    @property
    def parse_string(self) -> str:
        """The same model as `jaxphylo.parse_model` reads it (TPM2+F is TPM2u+F, HKY is HKY85...)."""
        base = self.base if self.protein else _DNA_NAMES[self.base]
        return base + self.frequency + self.rate

    @property
    def categories(self) -> int:
        """Free-rate categories (0 unless +R)."""
        return int(self.rate.split("R")[1]) if "R" in self.rate else 0

    def substitution_parameters(self) -> int:
        if self.protein:
            return 0
        return max(rate_classes(NAMED_DNA_MODELS[_DNA_NAMES[self.base]][0])) + 1 - 1

    def frequency_parameters(self) -> int:
        return (19 if self.protein else 3) if self.frequency else 0

    def rate_parameters(self) -> int:
        k = self.categories
        return ("+I" in self.rate) + ("G" in self.rate) + (2 * (k - 1) if k else 0)

    def df(self, num_taxa: int) -> int:
        """Free parameters as IQ-TREE 2 counts them, branch lengths (2N - 3) included."""
        return 2 * num_taxa - 3 + self.substitution_parameters() + self.frequency_parameters() + self.rate_parameters()


def _dna_base(name: str, source: str) -> str:
    key = _DNA_SHOWN.get(canonical_name(name))
    if key is None:
        raise ModelError(f"{source}: unknown DNA model {name!r}; known: {', '.join(DNA_ORDER)}")
    return key


def _protein_base(name: str, source: str) -> str:
    key = canonical_name(name)
    if key not in EMPIRICAL_MODELS:
        raise ModelError(f"{source}: unknown protein matrix {name!r}; known: {', '.join(EMPIRICAL_MODELS)}")
    return key


def _automatic_rates(mrate: str | None) -> bool:
    """True for IQ-TREE's default rate set (no -mrate, or `-mrate AUTO`): the one it prunes (rule 2 above)."""
    return mrate is None or str(mrate).strip().upper() == "AUTO"


def _rate_types(mrate: str | None) -> list[str]:
    """IQ-TREE's -mrate (`E,I,G,I+G,R,I+R`; `R` means +R2..+R10, `R4` one of them) as rate suffixes.

    None or `AUTO` is IQ-TREE 2's default for DNA and protein data with invariable sites: E,I,G,I+G,R.
    """
    if _automatic_rates(mrate):
        mrate = "E,I,G,I+G,R"
    rates = []
    for token in (t.strip() for t in str(mrate).split(",")):
        upper = token.upper()
        if upper in _RATE_ALIASES:
            rates.append(_RATE_ALIASES[upper])
        elif upper in ("R", "I+R"):
            prefix = "+I" if upper == "I+R" else ""
            rates += [f"{prefix}+R{k}" for k in range(FREE_RATE_RANGE[0], FREE_RATE_RANGE[1] + 1)]
        elif (upper.startswith("R") or upper.startswith("I+R")) and upper.split("R", 1)[1].isdigit() \
                and int(upper.split("R", 1)[1]) >= 2:
            rates.append(("+I" if upper.startswith("I+") else "") + "+R" + upper.split("R", 1)[1])
        else:
            raise ModelError(f"mrate: unknown rate type {token!r}; use E, I, G, I+G, R, I+R or Rk (k >= 2)")
    return list(dict.fromkeys(rates))


def default_candidates(alignment: Alignment, mset: str | None = None, mrate: str | None = None) -> list[Candidate]:
    """IQ-TREE 2's `-m MF` candidates for `alignment`'s data type, narrowed by `mset` and `mrate` as -mset/-mrate do.

    Order as IQ-TREE's: substitution model (and frequencies) first, rate type second.
    """
    rates = _rate_types(mrate)
    if alignment.alphabet == DNA:
        names = DNA_ORDER if mset is None else [_dna_base(t.strip(), "mset") for t in str(mset).split(",")]
        subs = [(n, "" if n in _EQUAL_IN_IQTREE else "+F") for n in dict.fromkeys(names)]
    elif alignment.alphabet == PROTEIN:
        names = PROTEIN_ORDER if mset is None else [_protein_base(t.strip(), "mset") for t in str(mset).split(",")]
        subs = [(n, f) for n in dict.fromkeys(names) for f in ("", "+F")]
    else:
        raise InputError(f"{alignment.source}: model selection covers DNA and protein data, not "
                         f"{alignment.alphabet.name}")
    return [Candidate(base + freq + rate, base, freq, rate) for base, freq in subs for rate in rates]


def parse_candidate(string: str, alignment: Alignment) -> Candidate:
    """A candidate from a model string such as `HKY+F+G4`, `K2P+I`, `LG+F+R3` (no values in braces)."""
    terms = [t.strip() for t in str(string).split("+")]
    if not terms[0] or "{" in string:
        raise ModelError(f"candidate {string!r}: give a model name and terms without values, e.g. HKY+F+G4")
    protein = alignment.alphabet == PROTEIN
    base = _protein_base(terms[0], f"candidate {string!r}") if protein else _dna_base(terms[0], f"candidate {string!r}")
    frequency, rate = "", []
    for term in terms[1:]:
        upper = term.upper()
        if upper == "F":
            frequency = "+F"
        elif upper == "I":
            rate.insert(0, "+I")
        elif upper in ("G", "G4"):
            rate.append("+G4")
        elif upper.startswith("R") and upper[1:].isdigit() and int(upper[1:]) >= 2:
            rate.append("+R" + upper[1:])
        else:
            raise ModelError(f"candidate {string!r}: unsupported term '+{term}' (model selection knows +F, +I, "
                             "+G4, +R k)")
    if len(rate) > 2 or (len(rate) == 2 and rate[0] != "+I"):
        raise ModelError(f"candidate {string!r}: at most one of +G4 and +R k, with or without +I")
    if not protein:
        if base in _EQUAL_IN_IQTREE and frequency:
            raise ModelError(f"candidate {string!r}: {base} has equal frequencies by definition; drop +F")
        if base not in _EQUAL_IN_IQTREE:
            frequency = "+F"  # IQ-TREE's convention: a free-frequency DNA model without a term uses +F
    rate_text = "".join(rate)
    return Candidate(base + frequency + rate_text, base, frequency, rate_text)


def fit_free_rate_sequences(candidates: list[Candidate], fit, score) -> None:
    """IQ-TREE 2's rule for +R k (`CandidateModelSet::test` of 2.0.7): each sequence of one substitution model and
    frequencies, with or without +I, is fitted in increasing k; once +R k scores worse (strictly greater
    criterion) than the same sequence's +R(k-1), its higher k are skipped. `fit(batch)` fits a list of candidates
    (one step of every live sequence at a time); `score(candidate)` is its criterion after fitting.
    """
    sequences: dict[tuple, list[Candidate]] = {}
    for c in candidates:
        sequences.setdefault((c.base, c.frequency, c.rate.startswith("+I")), []).append(c)
    queues = [sorted(cs, key=lambda c: c.categories) for cs in sequences.values()]
    scores = [{} for _ in queues]  # per sequence: {k: criterion}
    while True:
        current = [q[0] for q in queues if q]
        if not current:
            return
        fit(current)
        for q, fitted in zip(queues, scores):
            if not q:
                continue
            c = q.pop(0)
            fitted[c.categories] = score(c)
            previous = fitted.get(c.categories - 1)
            if previous is not None and fitted[c.categories] > previous:
                q.clear()
