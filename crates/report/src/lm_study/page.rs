//! The study's page: the question, the verdict, the thresholds, each experiment with its figures
//! and tables, and how to run it again.

use hyperlens_analysis::lm::{LmAnalysis, LmDecoding, LmDecodingRow};

use super::figures::StudyFigures;
use super::measure::Measured;
use super::verdict::{self, layer_name, Verdicts};
use super::LmStudyParams;
use crate::doc::Document;
use crate::words::{md_escape, pct};

/// `acc [lo, hi]` of a score.
fn with_ci(s: &hyperlens_analysis::lm::ProbeScore) -> String {
    format!(
        "{} [{}, {}]",
        pct(s.accuracy),
        pct(s.ci_low),
        pct(s.ci_high)
    )
}

fn opt_pct(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite()).map_or_else(|| "-".into(), pct)
}

/// The decoding table of one analysis: per layer, the codes with their interval, each control.
fn decoding_table(doc: &mut Document, d: &LmDecoding, seen: Option<&LmAnalysis>) {
    let mut header = vec!["layer".to_string()];
    if seen.is_some() {
        header.push("seen accuracy".into());
    }
    header.extend(
        [
            "held-out accuracy [95% CI]",
            "shuffled labels",
            "distances only",
            "shuffled weights",
            "residual stream",
            "above controls",
        ]
        .map(String::from),
    );
    let rows = d
        .rows
        .iter()
        .map(|r: &LmDecodingRow| {
            let mut row = vec![layer_name(r.layer)];
            if let Some(s) = seen {
                row.push(opt_pct(
                    s.decoding
                        .rows
                        .iter()
                        .find(|x| x.layer == r.layer)
                        .map(|x| x.codes.accuracy),
                ));
            }
            row.extend([
                with_ci(&r.codes),
                pct(r.shuffled_labels.accuracy),
                pct(d.distance.accuracy),
                opt_pct(r.shuffled_weights.map(|s| s.accuracy)),
                opt_pct(r.resid.map(|s| s.accuracy)),
                if verdict::transfers(d, r) {
                    "yes"
                } else {
                    "no"
                }
                .into(),
            ]);
            row
        })
        .collect();
    doc.table(header, rows);
}

/// The page.
pub fn document(
    m: &Measured,
    v: &Verdicts,
    figs: &StudyFigures,
    params: &LmStudyParams,
) -> Document {
    let mut doc = Document::new();
    doc.heading(
        1,
        &format!(
            "Is there a reusable latent code in {}'s attention?",
            m.model.name
        ),
    );
    doc.paragraph(format!(
        "\"Attention as a Hypernetwork\" (Schug et al., ICLR 2025) shows on synthetic tasks that the \
         attention scores of one query-key pair across the heads of a layer, the **latent code**, \
         name the operation the pair performs and are reused on rule combinations never seen in \
         training. This study asks the same of a pretrained language model, {} ({}, {} layers of {} \
         heads), with hyperlens's lens (`LanguageModel::latent_codes`, `docs/lm-lens.md`). Methods: \
         `docs/lm-study.md`.",
        md_escape(&m.model.name),
        m.model.kind,
        m.model.n_layers,
        m.model.n_heads
    ));
    doc.heading(2, "Verdict");
    let mut parts = vec![format!("**Experiment 1.** {}", v.relations.sentence)];
    if let Some(iv) = &v.icl {
        parts.push(format!("**Experiment 2.** {}", iv.sentence));
        if !iv.unfiltered_sentence.is_empty() {
            parts.push(iv.unfiltered_sentence.clone());
        }
    }
    if let Some((_, t)) = &v.transplant {
        parts.push(format!("**Transplant.** {t}"));
    }
    doc.paragraph(
        parts
            .iter()
            .map(|p| format!("- {p}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    doc.paragraph(format!(
        "Thresholds, fixed in `crates/report/src/lm_study/verdict.rs` before the run: Experiment 1 \
         passes when the relation decodes on held-out vocabulary at {} or better from all layers \
         and {} or better from the best layer, each interval above its strongest control \
         (the largest of chance, shuffled labels, distances only and shuffled weights). Experiment 2 \
         keeps the operation x domain combinations the model answers at {} or better; a layer \
         carries the operation in a transferable form on a split when its held-out interval lies \
         above the strongest control and its accuracy beats it by {} points; the finding is \
         positive when some layer does so on every split. The transplant moves the answer when \
         the donor code turns {} or more of the pairs into the donor operation's answer and {}x the \
         random code's rate.",
        pct(verdict::RELATIONS_ALL_LAYERS_MIN),
        pct(verdict::RELATIONS_LAYER_MIN),
        pct(verdict::MIN_COMBINATION_ACCURACY),
        (verdict::TRANSFER_MARGIN * 100.0).round(),
        pct(verdict::TRANSPLANT_MIN_RATE),
        verdict::TRANSPLANT_CONTROL_FACTOR
    ));
    doc.contents();

    let r = &m.relations.analysis;
    doc.heading(
        2,
        "Experiment 1: structural relations (the positive control)",
    );
    doc.paragraph(format!(
        "{} `relations` prompts (`prompts/relations.jsonl`) of the model's own single-token words \
         ({} words, split into two disjoint halves; the test prompts use the other half): each \
         prompt's key stands in one relation to its query (previous token, induction target, \
         duplicate token, matching bracket or quote, none). The relation is decoded from the \
         latent code (the attention probabilities of the query to the key across the heads) by a \
         logistic probe trained on the first vocabulary half and tested on the second, with \
         {} bootstrap resamples of the test prompts for each interval. Controls: the same probe \
         on shuffled training labels, on the query-key distances only, on the codes of the model \
         with its weights shuffled within each tensor, and the residual stream at the query.",
        r.n_prompts, m.relations.n_words, params.n_bootstrap
    ));
    for f in &figs.relations {
        doc.figure(f.clone());
    }
    decoding_table(&mut doc, &r.decoding, None);
    doc.paragraph("Tables: `tables/relations/` (`decoding.csv`, `structure.csv`, `summary.json`).");
    let Some(icl) = &m.icl else {
        doc.heading(2, "Experiment 2: not run");
        doc.paragraph(
            "Experiment 1 failed its control, so the lens or the prompts do not work on this \
             model, and the study claims nothing about operations.",
        );
        return doc;
    };
    let iv = v.icl.as_ref();
    doc.heading(
        2,
        "Experiment 2: in-context operations on held-out combinations",
    );
    doc.paragraph(format!(
        "{} `icl` prompts (`prompts/icl.jsonl`), {} demonstrations each (`Q: x` / `A: y`), cycling \
         through 5 operations (copy, next, previous, skip one forward, skip one back) on 6 ordered \
         domains (lowercase and uppercase letters, digits, number words, weekdays, months). The \
         query is the answer position (the final `A:`), the keys the demonstrations' outputs and \
         the test input. On each of {} hold-out splits (seeds {:?}), a quarter of the 30 \
         combinations is held out with every operation and domain still seen; the probe is \
         trained on the seen combinations and tested on the held-out ones. The seen accuracy \
         trains and tests on two halves of the seen combinations' prompts.",
        params.n_icl,
        params.shots,
        icl.splits.len(),
        params.split_seeds
    ));
    for f in figs.icl.iter().filter(|f| f.src.contains("behaviour")) {
        doc.figure(f.clone());
    }
    let b = &icl.behaviour;
    let mut header = b.factors.clone();
    header.extend(["prompts", "accuracy", "kept"].map(String::from));
    let rows = b
        .combinations
        .iter()
        .map(|c| {
            let mut row = c.values.clone();
            row.extend([
                c.n_prompts.to_string(),
                opt_pct(c.accuracy),
                if c.kept { "yes" } else { "no" }.into(),
            ]);
            row
        })
        .collect();
    doc.table(header, rows);
    for f in figs.icl.iter().filter(|f| !f.src.contains("behaviour")) {
        doc.figure(f.clone());
    }
    for (j, s) in icl.splits.iter().enumerate() {
        doc.heading(3, &format!("Split {} (hold-out seed {})", j + 1, s.seed));
        doc.paragraph(format!(
            "Held out: {}.",
            s.held_out
                .iter()
                .map(|(o, d)| format!("{o} x {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        match &s.ood {
            Ok(a) => {
                doc.paragraph(format!(
                    "{} training and {} test prompts of the kept combinations; chance (largest \
                     test class) {}.",
                    a.decoding.n_train,
                    a.decoding.n_test,
                    pct(a.decoding.chance_max)
                ));
                decoding_table(&mut doc, &a.decoding, s.seen.as_ref().ok());
                doc.paragraph(format!(
                    "Tables: `{}/`.",
                    super::files::tables_dir(&super::files::split_name(j, false))
                ));
            }
            Err(why) => doc.paragraph(format!("Not decoded: {why}")),
        }
    }
    if let Some(iv) = iv {
        if let Some(b) = iv.layers.iter().find(|l| l.layer == iv.best_layer) {
            doc.paragraph(format!(
                "Over the splits, the best layer is {} (held-out {}, strongest control {}, \
                 residual stream {}). Table: `tables/icl_layers.csv`.",
                layer_name(b.layer),
                pct(b.mean_held_out),
                pct(b.mean_control),
                opt_pct(b.mean_resid)
            ));
        }
    }
    if let Some(iv) = iv.filter(|iv| !iv.unfiltered.is_empty()) {
        doc.heading(3, "Without the behaviour filter (secondary)");
        doc.paragraph(iv.unfiltered_sentence.clone());
        let header = [
            "layer",
            "held-out accuracy (mean over splits)",
            "strongest control (mean)",
            "residual stream (mean)",
            "splits above controls",
        ]
        .map(String::from)
        .to_vec();
        let rows = iv
            .unfiltered
            .iter()
            .map(|l| {
                vec![
                    layer_name(l.layer),
                    pct(l.mean_held_out),
                    pct(l.mean_control),
                    opt_pct(l.mean_resid),
                    format!("{} of {}", l.splits_transferring, iv.n_splits),
                ]
            })
            .collect();
        doc.table(header, rows);
        doc.paragraph("Tables: `tables/icl_split*_all/`.");
    }
    doc.heading(2, "Is the code causal?");
    match (&m.transplant, &v.transplant) {
        (Some(t), Some((_, sentence))) => {
            doc.paragraph(format!(
                "At L{} (the layer with the best mean held-out decoding), on {} held-out prompts \
                 of split 1 that the model answers correctly, the latent code at the answer \
                 position (its attention to the demonstrations' outputs and the test input, \
                 every head) is replaced by the mean code of another operation over {} seen \
                 prompts the model solves, and the greedy next token is read: does it become the \
                 answer that operation gives on the prompt's own test input? Controls: the \
                 prompt's own code (identity), a random code of the same norm, and the mean code \
                 of the prompt's own operation.",
                t.layer, t.n_targets, t.n_donors
            ));
            for f in &figs.transplant {
                doc.figure(f.clone());
            }
            doc.paragraph(sentence.clone());
            let header = [
                "code written",
                "pairs",
                "to donor",
                "elsewhere",
                "unchanged",
                "excluded",
            ]
            .map(String::from)
            .to_vec();
            let rows = t
                .transplant
                .rows
                .iter()
                .map(|x| {
                    let f = |c: usize| {
                        if x.n == 0 {
                            "-".to_string()
                        } else {
                            pct(c as f64 / x.n as f64)
                        }
                    };
                    vec![
                        x.kind.as_str().to_string(),
                        x.n.to_string(),
                        f(x.to_donor),
                        f(x.elsewhere),
                        f(x.unchanged),
                        x.excluded.to_string(),
                    ]
                })
                .collect();
            doc.table(header, rows);
            doc.paragraph(
                "Tables: `tables/transplant/` (`transplant.csv`, per donor operation \
                 `transplant_by_donor.csv`, `transplant.json`).",
            );
        }
        _ => doc.paragraph(
            "Not run: no split of Experiment 2 could be decoded, so there is no best layer and \
             no seen operation code to transplant.",
        ),
    }
    doc.heading(2, "Run it again");
    doc.paragraph(format!(
        "`hyperlens study {} --out DIR` (defaults: {} relations prompts, {} icl prompts, seed {}, \
         batch {}) writes this page, its tables and figures; `timings.json` holds the time and the \
         peak memory of the run. Any model hyperlens loads works (`docs/lm-study.md`).",
        md_escape(&m.model.name),
        params.n_relations,
        params.n_icl,
        params.seed,
        params.batch
    ));
    doc
}
