//! The report's results set against the claims of Schug et al., "Attention as a Hypernetwork"
//! (ICLR 2025): the OOD accuracy of each mixer (Table A1), the order of the mixers, and what the
//! paper says of the latent codes (Figure 5: the rule decodes better with depth; addition and
//! subtraction have almost identical codes). The claims are those recorded in `docs/spec/`.

use std::fmt::Write as _;

use hyperlens_model::Mixer;
use hyperlens_tasks::sraven::Rule;

use crate::data::Entry;
use crate::sraven::text::per_layer;
use crate::sraven::verdict::{at_chance, PAPER_STEPS};
use crate::words::{md_escape, pct, thousands};

/// The paper's SRAVEN OOD accuracy per mixer: `(mixer, mean %, standard error %)` over three seeds
/// (Schug et al. 2025, Table A1: 4 layers, width 1, 20M problems; docs/spec/models.md).
pub const PAPER_OOD_ACCURACY: [(Mixer, f64, f64); 3] = [
    (Mixer::Softmax, 56.56, 1.05),
    (Mixer::Linear, 56.30, 1.11),
    (Mixer::Hyla, 69.13, 1.90),
];

/// The mean of `f` over the checkpoints of `mixer` that are not at chance; `None` if there are
/// none.
fn mixer_mean(entries: &[Entry], mixer: Mixer, f: impl Fn(&Entry) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = entries
        .iter()
        .filter(|e| e.mixer == mixer && !at_chance(e))
        .filter_map(f)
        .filter(|v| v.is_finite())
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// OOD decoding accuracy of the last layer's probe.
fn last_layer_decoding(e: &Entry) -> Option<f64> {
    per_layer(e).last().map(|a| a.decoding.accuracy)
}

/// The rows of the comparison table: per mixer of the paper that the report has, the paper's
/// number, the checkpoints here with their OOD accuracy, and their last-layer decoding accuracy.
pub fn table(entries: &[Entry]) -> (Vec<String>, Vec<Vec<String>>) {
    let header = [
        "mixer",
        "paper OOD acc (Table A1, 3 seeds)",
        "checkpoints here",
        "OOD acc here",
        "rule decoding, last layer",
    ]
    .map(String::from)
    .to_vec();
    let mut rows = Vec::new();
    for (mixer, mean, se) in PAPER_OOD_ACCURACY {
        let here: Vec<&Entry> = entries.iter().filter(|e| e.mixer == mixer).collect();
        if here.is_empty() {
            continue;
        }
        let list =
            |f: &dyn Fn(&Entry) -> String| here.iter().map(|e| f(e)).collect::<Vec<_>>().join(", ");
        rows.push(vec![
            mixer.to_string(),
            format!("{mean:.2} ± {se:.2} %"),
            list(&|e| md_escape(&e.name)),
            list(&|e| pct(e.ood.accuracy)),
            list(&|e| last_layer_decoding(e).map_or("-".into(), pct)),
        ]);
    }
    (header, rows)
}

/// The paragraphs of the comparison: accuracy and order of the mixers against Table A1, whether
/// the code that decodes the rule best comes with the best generalisation, decoding against
/// depth, and the addition / subtraction codes. Checkpoints at chance are left out of the
/// comparisons (and named).
pub fn paragraphs(entries: &[Entry]) -> Vec<String> {
    let mut out = Vec::new();
    let chance: Vec<String> = entries
        .iter()
        .filter(|e| at_chance(e))
        .map(|e| md_escape(&e.name))
        .collect();
    let acc = |m: Mixer| mixer_mean(entries, m, |e| Some(e.ood.accuracy));
    let dec = |m: Mixer| mixer_mean(entries, m, last_layer_decoding);
    let paper = |m: Mixer| PAPER_OOD_ACCURACY.iter().find(|p| p.0 == m).copied();

    // Accuracy and the order of HYLA and softmax.
    if let (Some(h), Some(s), Some(ph), Some(ps)) = (
        acc(Mixer::Hyla),
        acc(Mixer::Softmax),
        paper(Mixer::Hyla),
        paper(Mixer::Softmax),
    ) {
        let mut p = format!(
            "**Generalisation.** The paper reports that HYLA generalises better OOD than softmax attention ({:.2} ± {:.2} % against {:.2} ± {:.2} %, Table A1, mean ± s.e. over three seeds). Here the HYLA checkpoints reach {} and the softmax checkpoints {} on average: {}",
            ph.1,
            ph.2,
            ps.1,
            ps.2,
            pct(h),
            pct(s),
            if h > s {
                "the same order"
            } else {
                "the opposite order"
            }
        );
        if let Some(l) = acc(Mixer::Linear) {
            let _ = write!(
                p,
                "; linear attention reaches {} (paper: {:.2} %).",
                pct(l),
                paper(Mixer::Linear).map_or(f64::NAN, |x| x.1)
            );
        } else {
            p.push('.');
        }
        out.push(p);
        // Rule decoding against generalisation.
        if let (Some(dh), Some(ds)) = (dec(Mixer::Hyla), dec(Mixer::Softmax)) {
            let codes_agree = (dh > ds) == (h > s);
            out.push(format!(
                "**Codes and generalisation.** The rule decodes {} from HYLA's last-layer codes than from softmax's ({} against {} on OOD problems){}",
                if dh > ds { "better" } else { "worse" },
                pct(dh),
                pct(ds),
                if codes_agree {
                    ", in the same order as the OOD accuracy."
                } else {
                    ", although HYLA generalises better: a code from which a linear probe reads the rule well does not come with better generalisation here, so the decoding accuracy is not a proxy for the paper's accuracy claim."
                }
            ));
        }
    }

    // Decoding against depth.
    let judged: Vec<&Entry> = entries.iter().filter(|e| !at_chance(e)).collect();
    let grows: Vec<&Entry> = judged
        .iter()
        .copied()
        .filter(|e| {
            let l = per_layer(e);
            matches!((l.first(), l.last()), (Some(a), Some(b)) if b.decoding.accuracy > a.decoding.accuracy)
        })
        .collect();
    if !judged.is_empty() {
        out.push(format!(
            "**Depth.** In the paper the rule decodes better from deeper layers. Here the last layer's probe beats the first layer's in {} of {} checkpoints{}.",
            grows.len(),
            judged.len(),
            if grows.len() == judged.len() {
                ", as the paper reports"
            } else {
                ""
            }
        ));
    }

    // Addition and subtraction.
    if let Some(p) = addition_subtraction(&judged) {
        out.push(p);
    }
    let short: Vec<String> = entries
        .iter()
        .filter(|e| e.steps.is_some_and(|s| s.done < PAPER_STEPS))
        .map(|e| md_escape(&e.name))
        .collect();
    let mut caveats = String::new();
    if !short.is_empty() {
        let _ = write!(
            caveats,
            " {} trained for fewer than the paper's {} updates.",
            short.join(", "),
            thousands(PAPER_STEPS)
        );
    }
    if !chance.is_empty() {
        let _ = write!(
            caveats,
            " {} at chance and left out of these comparisons.",
            if chance.len() == 1 {
                format!("{} is", chance[0])
            } else {
                format!("{} are", chance.join(", "))
            }
        );
    }
    if !caveats.is_empty() {
        out.push(format!("**Caveats.**{caveats}"));
    }
    out
}

/// The paragraph on the paper's observation that addition and subtraction have almost identical
/// codes: their cosine similarity at the last layer, and in how many checkpoints they are the most
/// similar pair; `None` when no checkpoint has codes of both.
fn addition_subtraction(judged: &[&Entry]) -> Option<String> {
    let add = Rule::ALL.iter().position(|r| r.name() == "addition")?;
    let sub = Rule::ALL.iter().position(|r| r.name() == "subtraction")?;
    let mut cosines = Vec::new();
    let mut most_similar = 0;
    for e in judged {
        let Some(last) = per_layer(e).last().copied() else {
            continue;
        };
        let sim = &last.similarity;
        let idx = |r: usize| sim.labels.iter().position(|&l| l == r as i64);
        let (Some(i), Some(j)) = (idx(add), idx(sub)) else {
            continue;
        };
        if sim.counts[i] == 0 || sim.counts[j] == 0 {
            continue;
        }
        let c = sim.cosine[[i, j]];
        if !c.is_finite() {
            continue;
        }
        cosines.push(c);
        let n = sim.labels.len();
        let top = (0..n)
            .flat_map(|a| ((a + 1)..n).map(move |b| (a, b)))
            .filter(|&(a, b)| sim.counts[a] > 0 && sim.counts[b] > 0)
            .map(|(a, b)| sim.cosine[[a, b]])
            .filter(|v| v.is_finite())
            .fold(f64::NEG_INFINITY, f64::max);
        if c >= top {
            most_similar += 1;
        }
    }
    let lo = cosines.iter().copied().reduce(f64::min)?;
    let hi = cosines.iter().copied().reduce(f64::max)?;
    Some(format!(
            "**Addition and subtraction.** The paper observes that addition and subtraction have almost identical codes. Here their mean last-layer codes have cosine similarity {lo:.2} to {hi:.2}, and they are the most similar pair of rules in {most_similar} of {} checkpoints.",
        cosines.len()
    ))
}
