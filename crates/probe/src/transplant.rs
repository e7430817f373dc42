//! The causal test of the hypernetwork view (Schug et al. 2025): does the latent code *specify* the
//! operation the value network applies? On an OOD SRAVEN problem whose answer slot follows rule r,
//! the code at the site (query `32 + slot`; keys `24 + slot` and `28 + slot`, the slot's tokens in
//! the answer's row, with F = 4 features; `8F + slot`, `6F + slot`, `7F + slot` in general) of one
//! layer is replaced by a donor, the mean in-distribution code of another
//! rule r' (or the code of one in-distribution problem of rule r', at the same site of that
//! problem), and the predicted answer value is read:
//!
//! - **to the donor**: it becomes the value rule r' gives on this problem's own context (the answer
//!   row's first two values, and for distribute-three the first row's three values);
//! - **elsewhere**: it changes to something else;
//! - **unchanged**.
//!
//! Pairs where r' gives no value from the given panels (e.g. constant when the row's two values
//! differ, a progression whose step they do not show, distribute-three when the first row does not
//! hold both values), or gives the original answer or the model's own prediction (a change could not
//! be seen), are left out and counted as `excluded`.
//!
//! Controls: the identity transplant (the problem's own code: the logits must not change), a random
//! code of the same norm as the problem's own code, the same donor put at the keys of the slot in
//! the first row (`slot`, `4 + slot`), outside the answer's row; and the zero and mean ablations of
//! the code (a zero code; the mean ID code over all rules), which say how much the answer depends
//! on the code at all.

use hyperlens_model::{BlockStart, CodeSite, Evaluator, Reads};
use hyperlens_tasks::sraven::{ProblemSet, Rule};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::error::{ProbeError, Result};
use crate::patching::unpermuted;

/// The value `rule` gives for the answer of a row whose first two values are `a`, `b` (values mod
/// `m`), with `row0` the first row's three values (distribute-three); `None` where the rule is not
/// defined from these panels.
pub fn answer_under(rule: Rule, row0: [u8; 3], a: u8, b: u8, m: usize) -> Option<u8> {
    if rule == Rule::DistributeThree {
        let distinct = row0[0] != row0[1] && row0[1] != row0[2] && row0[0] != row0[2];
        if !distinct || a == b || !row0.contains(&a) || !row0.contains(&b) {
            return None;
        }
        return row0.iter().copied().find(|v| *v != a && *v != b);
    }
    rule.complete_row(a, b, m)
}

/// One row of the result: a layer and a kind of transplant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransplantRow {
    /// The layer whose code was replaced.
    pub layer: usize,
    /// `mean_id` (the donor rule's mean ID code at the answer row), `donor_problem` (the own code
    /// of one ID problem of the donor rule, at the answer row), `off_row` (the mean donor code at
    /// the first row's keys), `random` (a random code of the own code's norm), `zero_ablation` (a
    /// zero code), `mean_ablation` (the mean ID code over all rules), `identity` (the own code).
    pub kind: String,
    /// (problem, donor) pairs scored.
    pub n: usize,
    /// Pairs whose prediction became the donor rule's answer (`mean_id`, `donor_problem`,
    /// `off_row` only).
    pub to_donor: usize,
    /// Pairs whose prediction changed to another value.
    pub elsewhere: usize,
    /// Pairs whose prediction did not change.
    pub unchanged: usize,
    /// Pairs left out (donor rule undefined on the panels, or giving the original answer or the
    /// model's own prediction).
    pub excluded: usize,
    /// Largest absolute change of any logit of the slot (the identity transplant's must be ~0).
    pub max_logit_change: f64,
}

/// The site of the codes in a layer: query and the two keys.
#[derive(Debug, Clone, Copy)]
struct Site {
    query: usize,
    keys: [usize; 2],
}

impl Site {
    fn code_site(&self) -> CodeSite {
        CodeSite {
            query: self.query,
            keys: self.keys.to_vec(),
        }
    }
}

/// What the plain pass gives: the slot's logits per problem `[B][C]`, and per layer the codes at
/// the site `[B, H, 2]` and (when asked for) the stream entering the layer `[B, T, D]`.
struct SiteValues {
    logits: Vec<Vec<f32>>,
    codes: Vec<Vec<f32>>,
    streams: Vec<Vec<f32>>,
}

/// The slot's logits `[B][C]` from logits `[B, F, C]`.
fn slot_logits(logits: &[f32], f: usize, c: usize, slot: usize) -> Vec<Vec<f32>> {
    logits
        .chunks_exact(f * c)
        .map(|p| p[slot * c..][..c].to_vec())
        .collect()
}

/// The plain pass over `part` (slot `slot`): its logits, and at every layer its codes at `query`
/// and `keys` and (with `streams`) the stream entering the layer.
fn site_values(
    ev: &Evaluator,
    part: &ProblemSet,
    (query, keys): (usize, [usize; 2]),
    slot: usize,
    streams: bool,
) -> Result<SiteValues> {
    let cfg = ev.config();
    let (h, nl) = (cfg.n_heads, cfg.n_layers);
    let sites = [CodeSite {
        query,
        keys: keys.to_vec(),
    }];
    let layers: Vec<usize> = (0..nl).collect();
    let read = ev.read(
        part.x.view(),
        &Reads {
            sites: &sites,
            layers: &layers,
            resid_pre: streams,
        },
    )?;
    // Codes [B, 1, L, H, 2] -> per layer [B, H, 2].
    let per = h * 2;
    let codes = (0..nl)
        .map(|l| {
            read.codes
                .chunks_exact(nl * per)
                .flat_map(|row| &row[l * per..][..per])
                .copied()
                .collect()
        })
        .collect();
    Ok(SiteValues {
        logits: slot_logits(&read.logits, cfg.n_outputs, cfg.d_out, slot),
        codes,
        streams: read.resid_pre,
    })
}

/// The slot's logits `[P][C]` of the passes of the problems `problems` (indices into the start's
/// batch) with `codes [P, H, 2]` written at `site`.
fn transplanted(
    ev: &Evaluator,
    from: &BlockStart,
    problems: &[usize],
    site: Site,
    codes: &[f32],
    slot: usize,
) -> Result<Vec<Vec<f32>>> {
    let cfg = ev.config();
    let logits = ev.run_with_site_codes(from, problems, &site.code_site(), codes)?;
    Ok(slot_logits(&logits, cfg.n_outputs, cfg.d_out, slot))
}

/// The largest absolute difference between two logit vectors.
fn max_change(a: &[f32], b: &[f32]) -> f64 {
    f64::from(
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max),
    )
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

/// Runs the causal test (module docs) of the model of `ev` on the OOD problems `ood`, with the donors' mean
/// codes from the in-distribution problems `id` (both unpermuted, so that slot `slot` is the same
/// feature in every panel), layer by layer, in batches of `batch`; `seed` draws the random codes.
///
/// # Shapes
/// `id.x`, `ood.x` `[N, T, M]` as the model reads them.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for permuted problems, a slot outside the answer, an empty set or a
/// zero batch; model errors.
pub fn latent_transplant(
    ev: &Evaluator,
    id: &ProblemSet,
    ood: &ProblemSet,
    slot: usize,
    batch: usize,
    seed: u64,
) -> Result<Vec<TransplantRow>> {
    let f = ev.config().n_outputs;
    if slot >= f || batch == 0 || id.is_empty() || ood.is_empty() {
        return Err(ProbeError::InvalidInput(format!(
            "--slot {slot} (of {f}), --batch {batch}, {} ID and {} OOD problems: give a slot below {f}, a positive batch and both sets",
            id.len(),
            ood.len()
        )));
    }
    if !unpermuted(id) || !unpermuted(ood) {
        return Err(ProbeError::InvalidInput(
            "the transplant needs unpermuted problems (slot f is feature f in every panel)".into(),
        ));
    }
    transplant_with(ev, (id, ood), slot, batch, seed)
}

/// [`latent_transplant`] with checked arguments.
fn transplant_with(
    ev: &Evaluator,
    (id, ood): (&ProblemSet, &ProblemSet),
    slot: usize,
    batch: usize,
    seed: u64,
) -> Result<Vec<TransplantRow>> {
    let cfg = ev.config();
    let (t, f, m) = (cfg.n_tokens, cfg.n_outputs, cfg.d_in);
    let query = t - f + slot;
    // Token `f p + slot` shows panel p's value of feature `slot` (panels 6 and 7 are the answer's
    // row, panels 0 and 1 the first row).
    let answer_row = [f * 6 + slot, f * 7 + slot];
    let first_row = [slot, f + slot];
    let (h, n_layers) = (cfg.n_heads, cfg.n_layers);
    // The value of slot `slot` in panel p, per OOD problem.
    let value = |i: usize, p: usize| -> u8 {
        ood.x
            .slice(ndarray::s![i, f * p + slot, ..])
            .iter()
            .position(|&v| v > 0.5)
            .unwrap_or(0) as u8
    };
    let at = |keys: [usize; 2]| Site { query, keys };
    // The random codes' directions `[L][N_ood][H * 2]`, drawn layer by layer and problem by
    // problem (the order of the test's passes before they shared one plain pass per batch).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let directions: Vec<Vec<f32>> = (0..n_layers)
        .map(|_| {
            (0..ood.len() * h * 2)
                .map(|_| rng.gen::<f32>() * 2.0 - 1.0)
                .collect()
        })
        .collect();
    // Per layer: the sum and count of the ID codes [H, 2] per rule of the slot, and every ID
    // problem's own code [H * 2] by its rule (the donor problems); one plain pass per batch
    // reads every layer.
    type Sum = Option<(Vec<f32>, usize)>;
    let mut sums: Vec<Vec<Sum>> = vec![vec![None; Rule::COUNT]; n_layers];
    let mut by_rule: Vec<Vec<Vec<Vec<f32>>>> = vec![vec![Vec::new(); Rule::COUNT]; n_layers];
    for s in (0..id.len()).step_by(batch) {
        let part = id.slice(s, s + batch);
        let plain = site_values(ev, &part, (query, answer_row), slot, false)?;
        for (l, codes) in plain.codes.iter().enumerate() {
            for (i, c) in codes.chunks_exact(h * 2).enumerate() {
                let r = part.rules[[i, slot]] as usize;
                let e = sums[l][r].get_or_insert_with(|| (vec![0.0; c.len()], 0));
                for (a, b) in e.0.iter_mut().zip(c) {
                    *a += b;
                }
                e.1 += 1;
                by_rule[l][r].push(c.to_vec());
            }
        }
    }
    // Per layer: the mean ID code over all problems (mean ablation of the code), and per rule.
    let grand: Vec<Option<Vec<f32>>> = sums
        .iter()
        .map(|sums| {
            let (mut acc, mut count) = (Vec::new(), 0usize);
            for (v, n) in sums.iter().flatten() {
                if acc.is_empty() {
                    acc = vec![0f32; v.len()];
                }
                for (a, b) in acc.iter_mut().zip(v) {
                    *a += b;
                }
                count += n;
            }
            (count > 0).then(|| acc.into_iter().map(|x| x / count as f32).collect())
        })
        .collect();
    let means: Vec<Vec<Option<Vec<f32>>>> = sums
        .into_iter()
        .map(|sums| {
            sums.into_iter()
                .map(|s| s.map(|(v, n)| v.into_iter().map(|x| x / n as f32).collect()))
                .collect()
        })
        .collect();
    let tally = |layer: usize, kind: &str| TransplantRow {
        layer,
        kind: kind.into(),
        n: 0,
        to_donor: 0,
        elsewhere: 0,
        unchanged: 0,
        excluded: 0,
        max_logit_change: 0.0,
    };
    // Per layer, in the order of the result.
    const KINDS: [&str; 7] = [
        "mean_id",
        "donor_problem",
        "off_row",
        "random",
        "zero_ablation",
        "mean_ablation",
        "identity",
    ];
    let mut rows: Vec<[TransplantRow; 7]> =
        (0..n_layers).map(|l| KINDS.map(|k| tally(l, k))).collect();
    for s in (0..ood.len()).step_by(batch) {
        let part = ood.slice(s, s + batch);
        let b = part.len();
        // One plain pass: the baseline logits, and per layer the own codes [B, H, 2] and the
        // stream entering the block [B, T, D].
        let plain = site_values(ev, &part, (query, answer_row), slot, true)?;
        let base = &plain.logits;
        let pred: Vec<usize> = base.iter().map(|v| argmax(v)).collect();
        let all: Vec<usize> = (0..b).collect();
        for l in 0..n_layers {
            let [mean_id, donor_problem, off_row, random, zero_abl, mean_abl, ident] = &mut rows[l];
            let own = &plain.codes[l];
            let from = ev.block_start(&plain.streams[l], b, l)?;
            // Random codes with the own code's norm.
            let mut rand_codes = Vec::with_capacity(b * h * 2);
            for (i, c) in own.chunks_exact(h * 2).enumerate() {
                let norm: f32 = c.iter().map(|v| v * v).sum::<f32>().sqrt();
                let r = &directions[l][(s + i) * h * 2..][..h * 2];
                let rn: f32 = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                rand_codes.extend(r.iter().map(|v| v / rn * norm));
            }
            // Zero and mean ablation of the code (TransformerLens's ablations, on the code alone).
            let zeros = vec![0f32; b * h * 2];
            let mean_all = grand[l].as_ref().map(|g| g.repeat(b));
            // The controls without a donor rule: does the answer change at all?
            for (codes, row) in [
                (Some(own), ident),
                (Some(&rand_codes), random),
                (Some(&zeros), zero_abl),
                (mean_all.as_ref(), mean_abl),
            ] {
                let Some(codes) = codes else { continue };
                let got = transplanted(ev, &from, &all, at(answer_row), codes, slot)?;
                for (i, g) in got.iter().enumerate() {
                    row.max_logit_change = row.max_logit_change.max(max_change(g, &base[i]));
                    row.n += 1;
                    if argmax(g) == pred[i] {
                        row.unchanged += 1;
                    } else {
                        row.elsewhere += 1;
                    }
                }
            }
            // Donors: every other rule's mean ID code, at the answer row and at the first row;
            // and the own code of an ID problem of that rule (a different one per OOD problem).
            for (donor, code) in means[l].iter().enumerate() {
                let Some(code) = code else { continue };
                let donor_rule = Rule::from_index(donor)?;
                // The problems this donor is scored on: not of the donor's rule, and with an
                // expected answer that differs from the original and from the prediction (module
                // docs); only they are run.
                let mut keep = Vec::with_capacity(b);
                let mut expected = Vec::with_capacity(b);
                let mut n_excluded = 0;
                for (i, &predicted) in pred.iter().enumerate() {
                    if part.rules[[i, slot]] as usize == donor {
                        continue;
                    }
                    let pi = s + i;
                    let row0 = [value(pi, 0), value(pi, 1), value(pi, 2)];
                    let expect = answer_under(donor_rule, row0, value(pi, 6), value(pi, 7), m);
                    let original = part.y[[i, slot]] as usize;
                    match expect
                        .map(usize::from)
                        .filter(|&e| e != original && e != predicted)
                    {
                        Some(e) => {
                            keep.push(i);
                            expected.push(e);
                        }
                        None => n_excluded += 1,
                    }
                }
                for row in [&mut *mean_id, &mut *donor_problem, &mut *off_row] {
                    row.excluded += n_excluded;
                }
                if keep.is_empty() {
                    continue;
                }
                let codes = code.repeat(keep.len());
                let pool = &by_rule[l][donor];
                let problem_codes: Vec<f32> = keep
                    .iter()
                    .flat_map(|&i| pool[(s + i) % pool.len()].iter().copied())
                    .collect();
                for (keys, codes, row) in [
                    (answer_row, &codes, &mut *mean_id),
                    (answer_row, &problem_codes, &mut *donor_problem),
                    (first_row, &codes, &mut *off_row),
                ] {
                    let got = transplanted(ev, &from, &keep, at(keys), codes, slot)?;
                    for ((g, &i), &expect) in got.iter().zip(&keep).zip(&expected) {
                        row.max_logit_change = row.max_logit_change.max(max_change(g, &base[i]));
                        row.n += 1;
                        let p = argmax(g);
                        if p == expect {
                            row.to_donor += 1;
                        } else if p == pred[i] {
                            row.unchanged += 1;
                        } else {
                            row.elsewhere += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(rows.into_iter().flatten().collect())
}

/// `transplant.csv`: `layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change`.
pub fn transplant_csv(rows: &[TransplantRow]) -> String {
    let mut s = String::from(
        "layer,kind,n,to_donor,elsewhere,unchanged,excluded,frac_to_donor,frac_changed,max_logit_change\n",
    );
    for r in rows {
        let frac = |k: usize| {
            if r.n > 0 {
                k as f64 / r.n as f64
            } else {
                f64::NAN
            }
        };
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{:.6},{:.6},{:e}\n",
            r.layer,
            r.kind,
            r.n,
            r.to_donor,
            r.elsewhere,
            r.unchanged,
            r.excluded,
            frac(r.to_donor),
            frac(r.to_donor + r.elsewhere),
            r.max_logit_change
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_engine_and_the_reference_passes_give_the_same_tallies() {
        use hyperlens_model::{Config, Mixer};
        use hyperlens_tasks::sraven::{sample, Set, Split};
        let cfg = Config {
            n_layers: 2,
            d_model: 24,
            n_heads: 4,
            d_head: 4,
            d_mlp: 16,
            ..Config::sraven_base(Mixer::Softmax)
        };
        let dev = candle_core::Device::Cpu;
        let (init, _) = hyperlens_model::Transformer::init(&cfg, 3, &dev).unwrap();
        // Noise on every parameter (the biases start at zero), as training would give.
        let tensors = init
            .named_tensors()
            .iter()
            .map(|(n, t)| {
                let v: Vec<f32> = (0..t.elem_count())
                    .map(|i| 0.3 * (i as f32 * 0.917 + 0.4).sin())
                    .collect();
                let noise = candle_core::Tensor::from_vec(v, t.dims(), &dev).unwrap();
                (n.clone(), (t + noise).unwrap())
            })
            .collect();
        let model = hyperlens_model::Transformer::from_tensors(&cfg, tensors, &dev).unwrap();
        let split = Split::named("paper-seed0").unwrap();
        let id = sample(&split, Set::Id, 64, 1, true).unwrap();
        let ood = sample(&split, Set::Ood, 21, 2, true).unwrap();
        let host = Evaluator::new(model.clone()).unwrap();
        assert_eq!(host.engine_name(), "host");
        let reference = Evaluator::reference(model);
        let a = latent_transplant(&host, &id, &ood, 3, 8, 0).unwrap();
        let b = latent_transplant(&reference, &id, &ood, 3, 8, 0).unwrap();
        assert_eq!(a.len(), 14);
        let mut moved = 0;
        for (a, b) in a.iter().zip(&b) {
            let counts = |r: &TransplantRow| {
                (
                    r.layer,
                    r.kind.clone(),
                    r.n,
                    r.to_donor,
                    r.elsewhere,
                    r.unchanged,
                    r.excluded,
                )
            };
            assert_eq!(counts(a), counts(b));
            assert!(
                (a.max_logit_change - b.max_logit_change).abs() < 1e-4,
                "{a:?} {b:?}"
            );
            moved += usize::from(a.max_logit_change > 1e-3);
            if a.kind == "identity" {
                assert_eq!((a.max_logit_change, b.max_logit_change), (0.0, 0.0));
            }
        }
        assert!(moved >= 8, "the transplants hardly moved the logits");
    }

    #[test]
    fn answers_under_each_rule_follow_the_rows() {
        let row0 = [2, 5, 7];
        assert_eq!(answer_under(Rule::Constant, row0, 3, 3, 8), Some(3));
        assert_eq!(answer_under(Rule::Constant, row0, 3, 4, 8), None);
        assert_eq!(answer_under(Rule::Addition, row0, 6, 5, 8), Some(3));
        assert_eq!(answer_under(Rule::Subtraction, row0, 1, 3, 8), Some(6));
        assert_eq!(
            answer_under(Rule::from_index(1).unwrap(), row0, 7, 0, 8),
            Some(1)
        );
        assert_eq!(
            answer_under(Rule::from_index(1).unwrap(), row0, 7, 1, 8),
            None
        );
        assert_eq!(answer_under(Rule::DistributeThree, row0, 7, 2, 8), Some(5));
        assert_eq!(answer_under(Rule::DistributeThree, row0, 7, 3, 8), None);
        assert_eq!(
            answer_under(Rule::DistributeThree, [2, 2, 7], 7, 2, 8),
            None
        );
    }
}
