#!/usr/bin/env python3
"""Write a BEAST 1.10 XML file for a dated (tip-dated) time-tree analysis
with unknown topology.

The model and priors mirror the ones used by jaxphylo's dated sampler:

* HKY, estimated base frequencies ~ Dirichlet(1,1,1,1),
  kappa ~ LogNormal(mu=1, sigma=1.25), discrete Gamma (4 categories) with
  shape alpha ~ Exponential(mean 1), no invariant sites. BEAST 1.10's
  GammaSiteRateModel gives each category its median rate, rescaled to mean
  one: jaxphylo's ``+G4m`` (``run_jaxphylo.py --median-gamma``), not ``+G4``.
* strict clock: clock.rate ~ CTMC rate reference prior (``ctmcScalePrior``);
  relaxed clock: uncorrelated lognormal, mean in real space,
  ucld.mean ~ CTMC reference prior, ucld.stdev ~ Exponential(mean 1/3).
* tree prior: constant-size coalescent with popSize ~ 1/x, or the
  Gill et al. (2013) skygrid with K log population sizes on K-1 grid points
  evenly spaced up to the cut-off, precision ~ Gamma(shape 0.001, scale 1000).

Only the standard library and Biopython (for reading FASTA) are used.

Example::

    python validation/dated/beast_xml.py \
        --alignment /work/shared/data/dengue4_env/alignment.fasta \
        --dates /work/shared/data/dengue4_env/dates.tsv \
        --clock strict --tree-prior constant \
        --chain-length 10000000 --log-every 5000 \
        --prefix dengue4_env_strict_constant \
        --out validation/dated/beast/dengue4_env_strict_constant.xml
"""

from __future__ import annotations

import argparse
import os
import sys
from xml.sax.saxutils import escape, quoteattr


def read_fasta(path):
    """Return a list of (name, sequence) in file order."""
    try:
        from Bio import SeqIO

        return [(rec.id, str(rec.seq).upper()) for rec in SeqIO.parse(path, "fasta")]
    except ImportError:  # pragma: no cover - plain fallback
        out, name, chunks = [], None, []
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                if line.startswith(">"):
                    if name is not None:
                        out.append((name, "".join(chunks).upper()))
                    name, chunks = line[1:].split()[0], []
                else:
                    chunks.append(line)
        if name is not None:
            out.append((name, "".join(chunks).upper()))
        return out


def read_dates(path):
    """dates.tsv: header line, then ``taxon<TAB>decimal year``."""
    dates = {}
    with open(path) as fh:
        header = True
        for line in fh:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if header:
                header = False
                parts = line.split("\t")
                try:
                    float(parts[1])
                except (IndexError, ValueError):
                    continue  # a real header
            name, value = line.split("\t")[:2]
            dates[name.strip()] = float(value)
    return dates


class XmlWriter:
    def __init__(self):
        self.lines = []
        self.depth = 0

    def _attrs(self, attrs):
        return "".join(f" {k}={quoteattr(str(v))}" for k, v in attrs.items())

    def open(self, tag_, **attrs):
        tag = tag_
        self.lines.append("\t" * self.depth + f"<{tag}{self._attrs(_fix(attrs))}>")
        self.depth += 1

    def close(self, tag):
        self.depth -= 1
        self.lines.append("\t" * self.depth + f"</{tag}>")

    def empty(self, tag_, **attrs):
        tag = tag_
        self.lines.append("\t" * self.depth + f"<{tag}{self._attrs(_fix(attrs))}/>")

    def text(self, s):
        self.lines.append("\t" * self.depth + escape(s))

    def comment(self, s):
        self.lines.append("\t" * self.depth + f"<!-- {s} -->")

    def blank(self):
        self.lines.append("")

    def param(self, wrapper, **attrs):
        self.open(wrapper)
        self.empty("parameter", **attrs)
        self.close(wrapper)

    def render(self):
        return "\n".join(self.lines) + "\n"


def _fix(attrs):
    """Allow python-unfriendly attribute names (from_) via a trailing underscore."""
    return {(k[:-1] if k.endswith("_") else k): v for k, v in attrs.items()}


def build_xml(args) -> str:
    seqs = read_fasta(args.alignment)
    dates = read_dates(args.dates)
    names = [n for n, _ in seqs]
    missing = [n for n in names if n not in dates]
    if missing:
        raise SystemExit(f"taxa without a date: {missing}")
    lengths = {len(s) for _, s in seqs}
    if len(lengths) != 1:
        raise SystemExit("sequences are not aligned (different lengths)")

    most_recent = max(dates[n] for n in names)
    oldest = min(dates[n] for n in names)
    span = most_recent - oldest
    # a sensible starting population size / tree height (years)
    init_pop = max(span, 1.0)

    relaxed = args.clock == "relaxed"
    skygrid = args.tree_prior == "skygrid"
    branch_rates_tag = "discretizedBranchRates" if relaxed else "strictClockBranchRates"
    rate_param = "ucld.mean" if relaxed else "clock.rate"
    prefix = args.prefix

    w = XmlWriter()
    w.lines.append('<?xml version="1.0" standalone="yes"?>')
    w.comment(
        "Generated by validation/dated/beast_xml.py for BEAST 1.10.4: "
        f"{args.clock} clock, {args.tree_prior} coalescent, HKY+G4"
    )
    w.open("beast", version="1.10.4")

    # ---------------------------------------------------------------- taxa
    w.comment(f"ntax={len(names)}; dates forwards in decimal years; most recent tip {most_recent}")
    w.open("taxa", id="taxa")
    for n in names:
        w.open("taxon", id=n)
        w.empty("date", value=repr(dates[n]), direction="forwards", units="years")
        w.close("taxon")
    w.close("taxa")
    w.blank()

    # ----------------------------------------------------------- alignment
    w.comment(f"nsites={lengths.pop()}")
    w.open("alignment", id="alignment", dataType="nucleotide")
    for n, s in seqs:
        w.open("sequence")
        w.empty("taxon", idref=n)
        w.text(s)
        w.close("sequence")
    w.close("alignment")
    w.blank()
    w.open("patterns", id="patterns", from_="1", strip="false")
    w.empty("alignment", idref="alignment")
    w.close("patterns")
    w.blank()

    # ------------------------------------------------------ starting tree
    w.comment("random starting tree from a constant-size coalescent")
    w.open("constantSize", id="initialDemo", units="years")
    w.param("populationSize", id="initialDemo.popSize", value=f"{init_pop:g}")
    w.close("constantSize")
    w.open("coalescentSimulator", id="startingTree")
    w.empty("taxa", idref="taxa")
    w.empty("constantSize", idref="initialDemo")
    w.close("coalescentSimulator")
    w.blank()

    w.open("treeModel", id="treeModel")
    w.empty("coalescentTree", idref="startingTree")
    w.param("rootHeight", id="treeModel.rootHeight")
    w.open("nodeHeights", internalNodes="true")
    w.empty("parameter", id="treeModel.internalNodeHeights")
    w.close("nodeHeights")
    w.open("nodeHeights", internalNodes="true", rootNode="true")
    w.empty("parameter", id="treeModel.allInternalNodeHeights")
    w.close("nodeHeights")
    w.close("treeModel")
    w.blank()

    w.comment("age of the root in decimal years (most recent tip date - root height)")
    w.open("tmrcaStatistic", id="age(root)", absolute="true")
    w.empty("treeModel", idref="treeModel")
    w.close("tmrcaStatistic")
    w.open("treeLengthStatistic", id="treeLength")
    w.empty("treeModel", idref="treeModel")
    w.close("treeLengthStatistic")
    w.blank()

    # ---------------------------------------------------------- tree prior
    if skygrid:
        k = args.skygrid_intervals
        if k < 2:
            raise SystemExit("--skygrid-intervals must be >= 2")
        cutoff = args.skygrid_cutoff
        if cutoff is None:
            raise SystemExit("--skygrid-cutoff is required with --tree-prior skygrid")
        w.comment(
            f"skygrid: {k} log population sizes, {k - 1} grid points evenly spaced "
            f"up to cutoff {cutoff} years (first point at {cutoff / (k - 1):g})"
        )
        w.open("gmrfSkyGridLikelihood", id="skygrid")
        w.param("populationSizes", id="skygrid.logPopSize", dimension=str(k), value="1.0")
        w.param("precisionParameter", id="skygrid.precision", value="0.1", lower="0.0")
        w.param("numGridPoints", id="skygrid.numGridPoints", value=f"{float(k - 1)}")
        w.param("cutOff", id="skygrid.cutOff", value=f"{float(cutoff)}")
        w.open("populationTree")
        w.empty("treeModel", idref="treeModel")
        w.close("populationTree")
        w.close("gmrfSkyGridLikelihood")
    else:
        w.open("constantSize", id="constant", units="years")
        w.param("populationSize", id="constant.popSize", value=f"{init_pop:g}", lower="0.0")
        w.close("constantSize")
        w.open("coalescentLikelihood", id="coalescent")
        w.open("model")
        w.empty("constantSize", idref="constant")
        w.close("model")
        w.open("populationTree")
        w.empty("treeModel", idref="treeModel")
        w.close("populationTree")
        w.close("coalescentLikelihood")
    w.blank()

    # --------------------------------------------------------------- clock
    if relaxed:
        # BEAST 1.10.4 caveat: <logNormalDistributionModel meanInRealSpace="true">
        # with <mean>/<stdev> uses the MEAN_STDEV parameterisation, in which
        # the stdev is the standard deviation in REAL space (not the log-space
        # sigma), and meanInRealSpace="true" stdevInRealSpace="false" is
        # rejected ("Cannot parameterise Lognormal model with mean and sigma").
        # To keep ucld.mean = real-space mean and ucld.stdev = log-space sigma
        # as the free (sampled, prior-carrying) parameters, the log-space
        # location is a derived parameter: mu = log(ucld.mean) - ucld.stdev^2/2.
        w.comment("uncorrelated lognormal relaxed clock: ucld.mean = mean in real space, "
                  "ucld.stdev = sd in log space; mu = log(ucld.mean) - ucld.stdev^2/2")
        w.empty("parameter", id="ucld.mean", value="0.001", lower="0.0")
        w.empty("parameter", id="ucld.stdev", value="0.3333333333333333", lower="0.0")
        w.open("transformedParameter", id="ucld.logMean")
        w.empty("parameter", idref="ucld.mean")
        w.empty("transform", type="log")
        w.close("transformedParameter")
        w.open("productParameter", id="ucld.halfVariance")
        w.empty("parameter", idref="ucld.stdev")
        w.empty("parameter", idref="ucld.stdev")
        w.empty("parameter", id="ucld.half", value="0.5")
        w.close("productParameter")
        w.open("differenceParameter", id="ucld.mu")
        w.empty("transformedParameter", idref="ucld.logMean")
        w.empty("productParameter", idref="ucld.halfVariance")
        w.close("differenceParameter")
        w.open("discretizedBranchRates", id="branchRates")
        w.empty("treeModel", idref="treeModel")
        w.open("distribution")
        w.open("logNormalDistributionModel")
        w.open("mu")
        w.empty("differenceParameter", idref="ucld.mu")
        w.close("mu")
        w.open("sigma")
        w.empty("parameter", idref="ucld.stdev")
        w.close("sigma")
        # The parser's syntax rules demand a <stdev> (or <precision>) child
        # even though its code uses <mu>+<sigma> (MU_SIGMA) whenever <mu> and
        # <sigma> are present and <mean> is absent; this <stdev> is ignored.
        w.open("stdev")
        w.empty("parameter", idref="ucld.stdev")
        w.close("stdev")
        w.close("logNormalDistributionModel")
        w.close("distribution")
        w.param("rateCategories", id="branchRates.categories")
        w.close("discretizedBranchRates")
        w.open("rateStatistic", id="meanRate", name="meanRate", mode="mean",
               internal="true", external="true")
        w.empty("treeModel", idref="treeModel")
        w.empty("discretizedBranchRates", idref="branchRates")
        w.close("rateStatistic")
        w.open("rateStatistic", id="coefficientOfVariation", name="coefficientOfVariation",
               mode="coefficientOfVariation", internal="true", external="true")
        w.empty("treeModel", idref="treeModel")
        w.empty("discretizedBranchRates", idref="branchRates")
        w.close("rateStatistic")
    else:
        w.comment("strict clock")
        w.open("strictClockBranchRates", id="branchRates")
        w.param("rate", id="clock.rate", value="0.001", lower="0.0")
        w.close("strictClockBranchRates")
    w.blank()

    # -------------------------------------------------- substitution model
    w.comment("HKY with estimated base frequencies")
    w.open("HKYModel", id="hky")
    w.open("frequencies")
    w.open("frequencyModel", dataType="nucleotide")
    w.param("frequencies", id="frequencies", value="0.25 0.25 0.25 0.25")
    w.close("frequencyModel")
    w.close("frequencies")
    w.param("kappa", id="kappa", value="2.0", lower="0.0")
    w.close("HKYModel")
    w.blank()
    w.comment("discrete Gamma with 4 categories, no invariant sites")  # BEAST: median rates (see above)
    w.open("siteModel", id="siteModel")
    w.open("substitutionModel")
    w.empty("HKYModel", idref="hky")
    w.close("substitutionModel")
    w.open("gammaShape", gammaCategories="4")
    w.empty("parameter", id="alpha", value="0.5", lower="0.0")
    w.close("gammaShape")
    w.close("siteModel")
    w.blank()

    w.open("treeDataLikelihood", id="treeLikelihood", useAmbiguities="false")
    w.open("partition")
    w.empty("patterns", idref="patterns")
    w.empty("siteModel", idref="siteModel")
    w.close("partition")
    w.empty("treeModel", idref="treeModel")
    w.empty(branch_rates_tag, idref="branchRates")
    w.close("treeDataLikelihood")
    w.blank()

    # ------------------------------------------------------------ operators
    sts_size = max(span / 10.0, 0.1)
    w.open("operators", id="operators", optimizationSchedule="log")
    w.open("scaleOperator", scaleFactor="0.75", weight="1")
    w.empty("parameter", idref="kappa")
    w.close("scaleOperator")
    w.open("deltaExchange", delta="0.01", weight="1")
    w.empty("parameter", idref="frequencies")
    w.close("deltaExchange")
    w.open("scaleOperator", scaleFactor="0.75", weight="1")
    w.empty("parameter", idref="alpha")
    w.close("scaleOperator")
    if relaxed:
        w.open("scaleOperator", scaleFactor="0.75", weight="3")
        w.empty("parameter", idref="ucld.mean")
        w.close("scaleOperator")
        w.open("scaleOperator", scaleFactor="0.75", weight="3")
        w.empty("parameter", idref="ucld.stdev")
        w.close("scaleOperator")
    else:
        w.open("scaleOperator", scaleFactor="0.75", weight="3")
        w.empty("parameter", idref="clock.rate")
        w.close("scaleOperator")
    w.open("subtreeSlide", size=f"{sts_size:g}", gaussian="true", weight="15")
    w.empty("treeModel", idref="treeModel")
    w.close("subtreeSlide")
    w.open("narrowExchange", weight="15")
    w.empty("treeModel", idref="treeModel")
    w.close("narrowExchange")
    w.open("wideExchange", weight="3")
    w.empty("treeModel", idref="treeModel")
    w.close("wideExchange")
    w.open("wilsonBalding", weight="3")
    w.empty("treeModel", idref="treeModel")
    w.close("wilsonBalding")
    w.open("scaleOperator", scaleFactor="0.75", weight="3")
    w.empty("parameter", idref="treeModel.rootHeight")
    w.close("scaleOperator")
    w.open("uniformOperator", weight="30")
    w.empty("parameter", idref="treeModel.internalNodeHeights")
    w.close("uniformOperator")
    if skygrid:
        # block update of logPopSize + precision (what BEAUti 1.10.4 writes;
        # <gmrfGibbsOperator> parses too but never moves the log sizes)
        w.open("gmrfGridBlockUpdateOperator", scaleFactor="1.0", weight="2")
        w.empty("gmrfSkyrideLikelihood", idref="skygrid")
        w.close("gmrfGridBlockUpdateOperator")
        w.open("scaleOperator", scaleFactor="0.75", weight="1")
        w.empty("parameter", idref="skygrid.precision")
        w.close("scaleOperator")
    else:
        w.open("scaleOperator", scaleFactor="0.75", weight="3")
        w.empty("parameter", idref="constant.popSize")
        w.close("scaleOperator")
    w.open("upDownOperator", scaleFactor="0.75", weight="3")
    w.open("up")
    w.empty("parameter", idref=rate_param)
    w.close("up")
    w.open("down")
    w.empty("parameter", idref="treeModel.allInternalNodeHeights")
    w.close("down")
    w.close("upDownOperator")
    if relaxed:
        w.open("swapOperator", size="1", weight="10", autoOptimize="false")
        w.empty("parameter", idref="branchRates.categories")
        w.close("swapOperator")
        w.open("uniformIntegerOperator", weight="10")
        w.empty("parameter", idref="branchRates.categories")
        w.close("uniformIntegerOperator")
    w.close("operators")
    w.blank()

    # ----------------------------------------------------------------- MCMC
    w.open("mcmc", id="mcmc", chainLength=str(args.chain_length), autoOptimize="true",
           operatorAnalysis=f"{prefix}.ops")
    w.open("posterior", id="posterior")
    w.open("prior", id="prior")
    # With the meanInRealSpace attribute present and "false", BEAST 1.10.4's
    # logNormalPrior reads mean= as mu and stdev= as sigma (log space).
    # (Without the attribute, mean=/stdev= would be taken in REAL space.)
    w.comment("kappa ~ LogNormal(mu=1, sigma=1.25) (log space)")
    w.open("logNormalPrior", mean="1.0", stdev="1.25", offset="0.0", meanInRealSpace="false")
    w.empty("parameter", idref="kappa")
    w.close("logNormalPrior")
    w.comment("frequencies ~ Dirichlet(1,1,1,1)")
    w.open("dirichletPrior", alpha="1.0", sumsTo="1.0")
    w.empty("parameter", idref="frequencies")
    w.close("dirichletPrior")
    w.comment("alpha ~ Exponential(mean 1)")
    w.open("exponentialPrior", mean="1.0", offset="0.0")
    w.empty("parameter", idref="alpha")
    w.close("exponentialPrior")
    w.comment(f"{rate_param} ~ CTMC rate reference prior (Ferreira & Suchard 2008)")
    w.open("ctmcScalePrior")
    w.open("ctmcScale")
    w.empty("parameter", idref=rate_param)
    w.close("ctmcScale")
    w.empty("treeModel", idref="treeModel")
    w.close("ctmcScalePrior")
    if relaxed:
        w.comment("ucld.stdev ~ Exponential(mean 1/3)")
        w.open("exponentialPrior", mean="0.3333333333333333", offset="0.0")
        w.empty("parameter", idref="ucld.stdev")
        w.close("exponentialPrior")
    if skygrid:
        w.comment("skygrid precision ~ Gamma(shape 0.001, scale 1000)")
        w.open("gammaPrior", shape="0.001", scale="1000.0", offset="0.0")
        w.empty("parameter", idref="skygrid.precision")
        w.close("gammaPrior")
        w.empty("gmrfSkyGridLikelihood", idref="skygrid")
    else:
        w.comment("popSize ~ 1/x")
        w.open("oneOnXPrior")
        w.empty("parameter", idref="constant.popSize")
        w.close("oneOnXPrior")
        w.empty("coalescentLikelihood", idref="coalescent")
    w.close("prior")
    w.open("likelihood", id="likelihood")
    w.empty("treeDataLikelihood", idref="treeLikelihood")
    w.close("likelihood")
    w.close("posterior")
    w.empty("operators", idref="operators")
    w.blank()

    screen_every = max(args.chain_length // 50, args.log_every)
    w.open("log", id="screenLog", logEvery=str(screen_every))
    for label, tag, ref in [
        ("Posterior", "posterior", "posterior"),
        ("Prior", "prior", "prior"),
        ("Likelihood", "likelihood", "likelihood"),
        ("age(root)", "tmrcaStatistic", "age(root)"),
        (rate_param, "parameter", rate_param),
    ]:
        w.open("column", label=label, dp="4", width="12")
        w.empty(tag, idref=ref)
        w.close("column")
    w.close("log")
    w.blank()

    w.open("log", id="fileLog", logEvery=str(args.log_every), fileName=f"{prefix}.log",
           overwrite="false")
    w.empty("posterior", idref="posterior")
    w.empty("prior", idref="prior")
    w.empty("likelihood", idref="likelihood")
    w.empty("tmrcaStatistic", idref="age(root)")
    w.empty("parameter", idref="treeModel.rootHeight")
    w.empty("treeLengthStatistic", idref="treeLength")
    if relaxed:
        w.empty("parameter", idref="ucld.mean")
        w.empty("parameter", idref="ucld.stdev")
        w.empty("differenceParameter", idref="ucld.mu")
        w.empty("rateStatistic", idref="meanRate")
        w.empty("rateStatistic", idref="coefficientOfVariation")
    else:
        w.empty("parameter", idref="clock.rate")
    w.empty("parameter", idref="kappa")
    w.empty("parameter", idref="frequencies")
    w.empty("parameter", idref="alpha")
    if skygrid:
        w.empty("parameter", idref="skygrid.logPopSize")
        w.empty("parameter", idref="skygrid.precision")
    else:
        w.empty("parameter", idref="constant.popSize")
    w.empty("treeDataLikelihood", idref="treeLikelihood")
    if skygrid:
        w.empty("gmrfSkyGridLikelihood", idref="skygrid")
    else:
        w.empty("coalescentLikelihood", idref="coalescent")
    w.close("log")
    w.blank()

    w.open("logTree", id="treeFileLog", logEvery=str(args.log_every), nexusFormat="true",
           fileName=f"{prefix}.trees", sortTranslationTable="true")
    w.empty("treeModel", idref="treeModel")
    if relaxed:
        w.open("trait", name="rate", tag="rate")
        w.empty("discretizedBranchRates", idref="branchRates")
        w.close("trait")
    w.empty("posterior", idref="posterior")
    w.close("logTree")
    w.close("mcmc")
    w.blank()

    w.open("report")
    w.open("property", name="timer")
    w.empty("mcmc", idref="mcmc")
    w.close("property")
    w.close("report")
    w.close("beast")
    return w.render()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--alignment", required=True, help="FASTA alignment")
    p.add_argument("--dates", required=True, help="taxon<TAB>decimal year, with a header line")
    p.add_argument("--clock", choices=["strict", "relaxed"], default="strict")
    p.add_argument("--tree-prior", choices=["constant", "skygrid"], default="constant")
    p.add_argument("--chain-length", type=int, default=10_000_000)
    p.add_argument("--log-every", type=int, default=1000)
    p.add_argument("--skygrid-cutoff", type=float, default=None,
                   help="skygrid cut-off in years before the most recent tip")
    p.add_argument("--skygrid-intervals", type=int, default=10,
                   help="number K of log population sizes (K-1 grid points)")
    p.add_argument("--out", required=True, help="output XML file")
    p.add_argument("--prefix", default=None,
                   help="file name stem for the .log/.trees/.ops files (default: --out stem)")
    args = p.parse_args(argv)
    if args.prefix is None:
        args.prefix = os.path.splitext(os.path.basename(args.out))[0]
    xml = build_xml(args)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write(xml)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
