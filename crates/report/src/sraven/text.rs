//! The sentences that go with each figure of one checkpoint, generated from its numbers, and the
//! small formatting helpers they share. The verdicts (best layer, chance, the paper's claims) are
//! in [`crate::sraven::verdict`].

use std::fmt::Write as _;

use hyperlens_analysis::codes::report::{LayerAnalysis, LayerSel};
use hyperlens_analysis::decode::DecodeResult;
use hyperlens_analysis::similarity::MeanCodeSimilarity;
use hyperlens_tasks::sraven::Rule;
use hyperlens_train::metrics::MetricsRow;
use ndarray::{Array1, Axis};

use crate::data::{AttentionSample, Entry};
use crate::words::pct;

/// The names of the eight SRAVEN rules, in label order.
pub fn rule_names() -> Vec<String> {
    Rule::ALL.iter().map(|r| r.name().to_string()).collect()
}

/// The name of a rule label (the label itself if it is not a rule).
pub fn rule_name(label: i64) -> String {
    usize::try_from(label)
        .ok()
        .and_then(|l| Rule::from_index(l).ok())
        .map_or_else(|| label.to_string(), |r| r.name().to_string())
}

/// The per-layer analyses of a checkpoint (without the all-layers entry).
pub fn per_layer(e: &Entry) -> Vec<&LayerAnalysis> {
    e.latent
        .layers
        .iter()
        .filter(|a| a.layer != LayerSel::All)
        .collect()
}

/// The analysis of all layers concatenated, if present.
pub fn all_layers(e: &Entry) -> Option<&LayerAnalysis> {
    e.latent.layers.iter().find(|a| a.layer == LayerSel::All)
}

/// The majority-class baseline of the decoding (the same for every layer).
pub fn majority(e: &Entry) -> f64 {
    e.latent
        .layers
        .first()
        .map_or(f64::NAN, |a| a.decoding.majority_baseline)
}

/// Pearson correlation of two equally long series; NaN if either is constant.
pub fn pearson(a: impl Iterator<Item = f64> + Clone, b: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = a.clone().count() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let (ma, mb) = (a.clone().sum::<f64>() / n, b.clone().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa <= 0.0 || sbb <= 0.0 {
        f64::NAN
    } else {
        sab / (saa * sbb).sqrt()
    }
}

/// Sentences for the PCA-by-rule figure: variance captured by two components, and the layer where
/// the rules separate best.
pub fn pca_rule_text(e: &Entry) -> String {
    let layers = per_layer(e);
    let two = |a: &&LayerAnalysis| a.pca.explained_variance_ratio().iter().take(2).sum::<f64>();
    let mut s = String::new();
    if let (Some(first), Some(last)) = (layers.first(), layers.last()) {
        let _ = write!(
            s,
            "The first two principal components hold {} of the code variance at layer {} and {} at layer {}.",
            pct(two(first)),
            first.layer,
            pct(two(last)),
            last.layer
        );
    }
    let best = layers
        .iter()
        .filter_map(|a| a.clusters.as_ref().map(|c| (a.layer, c)))
        .filter(|(_, c)| c.silhouette.is_finite())
        .max_by(|x, y| x.1.silhouette.total_cmp(&y.1.silhouette));
    if let Some((layer, c)) = best {
        let _ = write!(
            s,
            " The rules separate best at layer {layer} (silhouette {:.2}, k-means ARI {:.2}){}.",
            c.silhouette,
            c.ari,
            if c.silhouette < 0.1 {
                ", i.e. the rule clusters overlap strongly in the full code space"
            } else {
                ""
            }
        );
    }
    s
}

/// Sentences for the PCA-by-target figure: the strongest correlation of the answer value with a
/// principal component.
pub fn pca_target_text(e: &Entry, target: &Array1<i64>) -> String {
    let mut best: Option<(LayerSel, usize, f64)> = None;
    for a in per_layer(e) {
        for c in 0..a.projection.ncols() {
            let r = pearson(
                a.projection.column(c).iter().copied(),
                target.iter().map(|&v| v as f64),
            );
            if r.is_finite() && best.is_none_or(|b| r.abs() > b.2.abs()) {
                best = Some((a.layer, c, r));
            }
        }
    }
    match best {
        Some((layer, c, r)) => format!(
            "The answer value correlates most with component {} at layer {layer} (Pearson r = {r:+.2}){}.",
            c + 1,
            if r.abs() < 0.3 {
                "; the leading components encode the answer only weakly"
            } else {
                ""
            }
        ),
        None => "The answer value is constant on these problems, so no correlation is reported."
            .to_string(),
    }
}

/// Sentences for the decoding figure: first and last layer against the baselines.
pub fn decoding_text(e: &Entry) -> String {
    let layers = per_layer(e);
    let mut s = String::new();
    if let (Some(first), Some(last)) = (layers.first(), layers.last()) {
        let all = all_layers(e).map_or(f64::NAN, |a| a.decoding.accuracy);
        let _ = write!(
            s,
            "Decoding accuracy on OOD codes goes from {} at layer {} to {} at layer {} ({} with all layers concatenated), against a majority baseline of {}",
            pct(first.decoding.accuracy),
            first.layer,
            pct(last.decoding.accuracy),
            last.layer,
            pct(all),
            pct(majority(e))
        );
        let shuffled = e
            .latent
            .layers
            .iter()
            .filter_map(|a| a.decoding.shuffled_control)
            .fold(f64::NEG_INFINITY, f64::max);
        if shuffled.is_finite() {
            let _ = write!(
                s,
                " and a shuffled-label control of at most {}.",
                pct(shuffled)
            );
        } else {
            s.push('.');
        }
    }
    s
}

/// Sentences for the similarity figure: range of the off-diagonal cosine similarities.
pub fn similarity_text(sim: &MeanCodeSimilarity, layer: LayerSel) -> String {
    let n = sim.labels.len();
    let mut pairs = Vec::new();
    for i in 0..n {
        for j in (i + 1)..n {
            let v = sim.cosine[[i, j]];
            if v.is_finite() && sim.counts[i] > 0 && sim.counts[j] > 0 {
                pairs.push((v, i, j));
            }
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|&i| sim.counts[i] == 0)
        .map(|i| rule_name(sim.labels[i]))
        .collect();
    let mut s = match (
        pairs.iter().min_by(|a, b| a.0.total_cmp(&b.0)),
        pairs.iter().max_by(|a, b| a.0.total_cmp(&b.0)),
    ) {
        (Some(lo), Some(hi)) => {
            let mean = pairs.iter().map(|p| p.0).sum::<f64>() / pairs.len() as f64;
            format!(
                "At layer {layer} the mean codes of different rules have cosine similarity {:.2} on average, from {:.2} ({} / {}) to {:.2} ({} / {}){}.",
                mean,
                lo.0,
                rule_name(sim.labels[lo.1]),
                rule_name(sim.labels[lo.2]),
                hi.0,
                rule_name(sim.labels[hi.1]),
                rule_name(sim.labels[hi.2]),
                if mean > 0.9 {
                    ": the mean codes point almost the same way and differ mostly in small components"
                } else {
                    ""
                }
            )
        }
        _ => "Fewer than two rules have codes here, so no similarity is reported.".to_string(),
    };
    if !missing.is_empty() {
        let _ = write!(
            s,
            " No OOD problem has the rule{} {}, so {} left out.",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", "),
            if missing.len() > 1 {
                "they are"
            } else {
                "it is"
            }
        );
    }
    s
}

/// Sentences for the confusion-matrix figure: best and worst recalled rule, the most frequent
/// error, and the rules that were predicted but are absent from the OOD set (their rows are left
/// out of the figure).
pub fn confusion_text(d: &DecodeResult, layer: LayerSel) -> String {
    let c = d.classes.len();
    let mut recall = Vec::new();
    let mut worst_err: Option<(u64, usize, usize, u64)> = None;
    for i in 0..c {
        let row: u64 = d.confusion.row(i).sum();
        if row == 0 {
            continue;
        }
        recall.push((d.confusion[[i, i]] as f64 / row as f64, i));
        for j in 0..c {
            let v = d.confusion[[i, j]];
            if i != j && v > 0 && worst_err.is_none_or(|w| v > w.0) {
                worst_err = Some((v, i, j, row));
            }
        }
    }
    let mut s = String::new();
    if let (Some(hi), Some(lo)) = (
        recall.iter().max_by(|a, b| a.0.total_cmp(&b.0)),
        recall.iter().min_by(|a, b| a.0.total_cmp(&b.0)),
    ) {
        let _ = write!(
            s,
            "With the probe of layer {layer}, {} is recalled best ({}) and {} worst ({}).",
            rule_name(d.classes[hi.1]),
            pct(hi.0),
            rule_name(d.classes[lo.1]),
            pct(lo.0)
        );
    }
    match worst_err {
        Some((v, i, j, row)) => {
            let _ = write!(
                s,
                " The most frequent error is {} decoded as {} ({v} of {row} problems).",
                rule_name(d.classes[i]),
                rule_name(d.classes[j])
            );
        }
        None => s.push_str(" The probe makes no error."),
    }
    let predicted_only: Vec<String> = (0..c)
        .filter(|&i| d.confusion.row(i).sum() == 0 && d.confusion.column(i).sum() > 0)
        .map(|i| rule_name(d.classes[i]))
        .collect();
    if !predicted_only.is_empty() {
        let _ = write!(
            s,
            " No OOD problem has the rule {}, so it has no row; its column counts the problems decoded as it.",
            predicted_only.join(", ")
        );
    }
    s
}

/// Sentences for the training curves, from the rows of `metrics.csv`.
pub fn training_text(rows: &[MetricsRow]) -> String {
    let mut s = String::new();
    let last_step = rows.iter().map(|r| r.step).max().unwrap_or(0);
    let train: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.train_loss.map(|v| (r.step, v)))
        .collect();
    let _ = write!(s, "The log covers {last_step} steps");
    if let (Some(a), Some(b)) = (train.first(), train.last()) {
        let _ = write!(
            s,
            "; the training loss went from {:.3} (step {}) to {:.3} (step {})",
            a.1, a.0, b.1, b.0
        );
    }
    s.push('.');
    let ood: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| r.ood_acc.map(|v| (r.step, v)))
        .collect();
    let id_last = rows
        .iter()
        .rev()
        .find_map(|r| r.id_acc.map(|v| (r.step, v)));
    if let (Some(last), Some(best)) = (ood.last(), ood.iter().max_by(|a, b| a.1.total_cmp(&b.1))) {
        let _ = write!(
            s,
            " At the last evaluation (step {}) the OOD accuracy is {}",
            last.0,
            pct(last.1)
        );
        if let Some((_, v)) = id_last {
            let _ = write!(s, " and the ID accuracy {}", pct(v));
        }
        if best.0 != last.0 && best.1 > last.1 {
            let _ = write!(
                s,
                "; the best OOD accuracy was {} at step {}",
                pct(best.1),
                best.0
            );
        }
        s.push('.');
    } else {
        s.push_str(" The log holds no evaluation, so only the loss is shown.");
    }
    s
}

/// Sentences for the attention figure: how much of the answer query's attention falls on the
/// paper's keys, and which head concentrates most.
pub fn attention_text(a: &AttentionSample, layer: usize, labels: &[String]) -> String {
    let pat = a.pattern.index_axis(Axis(0), layer);
    let (h, _, t) = pat.dim();
    let shares: Vec<f64> = (0..h)
        .map(|head| {
            let row = pat.slice(ndarray::s![head, a.site.query, ..]);
            let total: f64 = row.iter().map(|v| f64::from(v.abs())).sum();
            let on: f64 = a.site.keys.iter().map(|&k| f64::from(row[k].abs())).sum();
            if total > 0.0 {
                on / total
            } else {
                0.0
            }
        })
        .collect();
    let mean = shares.iter().sum::<f64>() / h.max(1) as f64;
    let (best_head, best) = shares
        .iter()
        .copied()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .unwrap_or((0, 0.0));
    let keys: Vec<&str> = a.site.keys.iter().map(|&k| labels[k].as_str()).collect();
    let right = a
        .target
        .iter()
        .zip(&a.prediction)
        .filter(|(t, p)| t == p)
        .count();
    let rules: Vec<String> = a.rules.iter().map(|&r| rule_name(r)).collect();
    format!(
        "On this problem (rules {}; the model gets {right} of {} answer features right), the answer query {} puts on average {} of its absolute attention weight on the paper's keys {} (uniform: {}); head {best_head} concentrates most ({}).",
        rules.join(", "),
        a.target.len(),
        labels[a.site.query],
        pct(mean),
        keys.join(" and "),
        pct(a.site.keys.len() as f64 / t as f64),
        pct(best)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pearson_matches_hand_values() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [2.0, 4.0, 6.0, 8.0];
        assert!((pearson(a.iter().copied(), b.iter().copied()) - 1.0).abs() < 1e-12);
        let c = [4.0, 3.0, 2.0, 1.0];
        assert!((pearson(a.iter().copied(), c.iter().copied()) + 1.0).abs() < 1e-12);
        let r = pearson([1.0, 2.0, 3.0].into_iter(), [1.0, 3.0, 2.0].into_iter());
        assert!((r - 0.5).abs() < 1e-12, "{r}");
        assert!(pearson([1.0, 1.0].into_iter(), [1.0, 2.0].into_iter()).is_nan());
    }

    #[test]
    fn training_text_reports_last_and_best_ood() {
        let row = |step, tl, ood: Option<f64>| MetricsRow {
            step,
            lr: 1e-3,
            train_loss: tl,
            train_acc: None,
            id_loss: None,
            id_acc: ood.map(|v| v + 0.1),
            ood_loss: None,
            ood_acc: ood,
            wall_time_s: 0.0,
            steps_per_s: None,
            extra: Default::default(),
        };
        let rows = vec![
            row(0, None, Some(0.1)),
            row(100, Some(2.0), None),
            row(200, Some(1.0), Some(0.6)),
            row(300, Some(0.5), Some(0.4)),
        ];
        let s = training_text(&rows);
        assert!(s.contains("300 steps"), "{s}");
        assert!(
            s.contains("from 2.000 (step 100) to 0.500 (step 300)"),
            "{s}"
        );
        assert!(s.contains("(step 300) the OOD accuracy is 40.0 %"), "{s}");
        assert!(s.contains("ID accuracy 50.0 %"), "{s}");
        assert!(
            s.contains("best OOD accuracy was 60.0 % at step 200"),
            "{s}"
        );
    }
}
