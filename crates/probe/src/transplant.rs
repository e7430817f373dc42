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

use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use hyperlens_model::{BlockStart, CodeSite, Config, Evaluator, Reads};
use hyperlens_tasks::sraven::{ProblemSet, Rule};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::error::{step, ProbeError, Result};
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

/// What a transplant writes at the site, named in files (`transplant.csv`'s `kind` column, the
/// Python records) by [`TransplantKind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransplantKind {
    /// `mean_id`: the donor rule's mean ID code at the answer row.
    MeanId,
    /// `donor_problem`: the own code of one ID problem of the donor rule, at the answer row.
    DonorProblem,
    /// `off_row`: the mean donor code at the first row's keys.
    OffRow,
    /// `random`: a random code of the own code's norm.
    Random,
    /// `zero_ablation`: a zero code.
    ZeroAblation,
    /// `mean_ablation`: the mean ID code over all rules.
    MeanAblation,
    /// `identity`: the problem's own code (the logits must not change).
    Identity,
}

impl TransplantKind {
    /// Every kind, in the order of the rows of one layer in the result.
    pub const ALL: [TransplantKind; 7] = [
        TransplantKind::MeanId,
        TransplantKind::DonorProblem,
        TransplantKind::OffRow,
        TransplantKind::Random,
        TransplantKind::ZeroAblation,
        TransplantKind::MeanAblation,
        TransplantKind::Identity,
    ];

    /// The name in files: `mean_id`, `donor_problem`, `off_row`, `random`, `zero_ablation`,
    /// `mean_ablation`, `identity`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransplantKind::MeanId => "mean_id",
            TransplantKind::DonorProblem => "donor_problem",
            TransplantKind::OffRow => "off_row",
            TransplantKind::Random => "random",
            TransplantKind::ZeroAblation => "zero_ablation",
            TransplantKind::MeanAblation => "mean_ablation",
            TransplantKind::Identity => "identity",
        }
    }

    /// Whether the kind writes a donor rule's code (`mean_id`, `donor_problem`, `off_row`), so
    /// that its pairs can move to the donor's answer.
    pub fn has_donor(self) -> bool {
        matches!(
            self,
            TransplantKind::MeanId | TransplantKind::DonorProblem | TransplantKind::OffRow
        )
    }
}

impl fmt::Display for TransplantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransplantKind {
    type Err = ProbeError;

    /// Parses the name in files ([`TransplantKind::as_str`]).
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] naming the valid kinds.
    fn from_str(s: &str) -> Result<TransplantKind> {
        TransplantKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let valid: Vec<&str> = TransplantKind::ALL.iter().map(|k| k.as_str()).collect();
                ProbeError::InvalidInput(format!(
                    "unknown transplant kind `{s}` (expected {})",
                    valid.join(", ")
                ))
            })
    }
}

/// One row of the result: a layer and a kind of transplant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransplantRow {
    /// The layer whose code was replaced.
    pub layer: usize,
    /// What was written at the site.
    pub kind: TransplantKind,
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

/// The site the transplant test replaces, for a model with `cfg`'s shape and answer slot `slot`:
/// the slot's query, and the slot's tokens in the answer's row (panels 6 and 7) as keys; that is
/// `hyperlens_probe::Site::Slot(slot)` resolved for 9 panels (module docs).
pub fn transplant_site(cfg: &Config, slot: usize) -> CodeSite {
    let f = cfg.n_outputs;
    CodeSite {
        query: cfg.n_tokens - f + slot,
        keys: vec![f * 6 + slot, f * 7 + slot],
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

/// The plain pass over `part` (slot `slot`): its logits, and at every layer its codes at `site`
/// (two keys) and (with `streams`) the stream entering the layer.
fn site_values(
    ev: &Evaluator,
    part: &ProblemSet,
    site: &CodeSite,
    slot: usize,
    streams: bool,
) -> Result<SiteValues> {
    let cfg = ev.config();
    let (h, nl) = (cfg.n_heads, cfg.n_layers);
    let sites = [site.clone()];
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
    site: &CodeSite,
    codes: &[f32],
    slot: usize,
) -> Result<Vec<Vec<f32>>> {
    let cfg = ev.config();
    let logits = ev.run_with_site_codes(from, problems, site, codes)?;
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
/// `progress(done, total)` counts steps (an ID batch read for the donors, or one layer of an OOD
/// batch); its `ControlFlow::Break` stops the work.
///
/// # Shapes
/// `id.x`, `ood.x` `[N, T, M]` as the model reads them.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for permuted problems, a slot outside the answer, an empty set or a
/// zero batch; [`ProbeError::Interrupted`] when `progress` breaks; model errors.
pub fn latent_transplant(
    ev: &Evaluator,
    id: &ProblemSet,
    ood: &ProblemSet,
    slot: usize,
    batch: usize,
    seed: u64,
    mut progress: impl FnMut(usize, usize) -> ControlFlow<()>,
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
    let total = id.len().div_ceil(batch) + ood.len().div_ceil(batch) * ev.config().n_layers;
    let mut done = 0;
    let mut tick = || {
        done += 1;
        step(&mut progress, done, total)
    };
    transplant_with(ev, (id, ood), slot, batch, seed, &mut tick)
}

/// The positions the test reads and writes, from the model's shape and the answer slot.
struct Layout {
    /// The answer slot.
    slot: usize,
    /// Feature slots `F` and values per feature `M`.
    f: usize,
    m: usize,
    /// Heads and layers.
    h: usize,
    n_layers: usize,
    /// The site ([`transplant_site`]), and the control's site with the slot's tokens of the first
    /// row (panels 0, 1) as keys.
    answer_row: CodeSite,
    first_row: CodeSite,
}

impl Layout {
    fn new(ev: &Evaluator, slot: usize) -> Layout {
        let cfg = ev.config();
        let f = cfg.n_outputs;
        // Token `f p + slot` shows panel p's value of feature `slot`.
        let answer_row = transplant_site(cfg, slot);
        let first_row = CodeSite {
            query: answer_row.query,
            keys: vec![slot, f + slot],
        };
        Layout {
            slot,
            f,
            m: cfg.d_in,
            h: cfg.n_heads,
            n_layers: cfg.n_layers,
            answer_row,
            first_row,
        }
    }

    /// The width of one problem's code at the site, `H * 2`.
    fn width(&self) -> usize {
        self.h * 2
    }

    /// The value of the slot in panel `p` of problem `i` of `set`.
    fn value(&self, set: &ProblemSet, i: usize, p: usize) -> u8 {
        set.x
            .slice(ndarray::s![i, self.f * p + self.slot, ..])
            .iter()
            .position(|&v| v > 0.5)
            .unwrap_or(0) as u8
    }
}

/// The donors, from the ID problems, per layer: the mean code `[H * 2]` of each rule of the slot
/// (`None` for a rule no ID problem has), the mean over all ID problems (the mean ablation), and
/// every ID problem's own code by its rule (the donor problems).
struct Donors {
    means: Vec<Vec<Option<Vec<f32>>>>,
    grand: Vec<Option<Vec<f32>>>,
    by_rule: Vec<Vec<Vec<Vec<f32>>>>,
}

/// A rule's (or all rules') sum of codes and their count.
type CodeSum = Option<(Vec<f32>, usize)>;

/// Reads the donors of every layer from `id`, one plain pass per batch of `batch`, `tick()` after
/// each.
///
/// # Errors
/// Model errors; `tick`'s.
fn donors(
    ev: &Evaluator,
    id: &ProblemSet,
    at: &Layout,
    batch: usize,
    tick: &mut dyn FnMut() -> Result<()>,
) -> Result<Donors> {
    let mut sums: Vec<Vec<CodeSum>> = vec![vec![None; Rule::COUNT]; at.n_layers];
    let mut by_rule: Vec<Vec<Vec<Vec<f32>>>> = vec![vec![Vec::new(); Rule::COUNT]; at.n_layers];
    for s in (0..id.len()).step_by(batch) {
        let part = id.slice(s, s + batch);
        let plain = site_values(ev, &part, &at.answer_row, at.slot, false)?;
        for (l, codes) in plain.codes.iter().enumerate() {
            for (i, c) in codes.chunks_exact(at.width()).enumerate() {
                let r = part.rules[[i, at.slot]] as usize;
                let e = sums[l][r].get_or_insert_with(|| (vec![0.0; c.len()], 0));
                for (a, b) in e.0.iter_mut().zip(c) {
                    *a += b;
                }
                e.1 += 1;
                by_rule[l][r].push(c.to_vec());
            }
        }
        tick()?;
    }
    let grand = sums.iter().map(|sums| grand_mean(sums)).collect();
    let means = sums
        .into_iter()
        .map(|sums| {
            sums.into_iter()
                .map(|s| s.map(|(v, n)| v.into_iter().map(|x| x / n as f32).collect()))
                .collect()
        })
        .collect();
    Ok(Donors {
        means,
        grand,
        by_rule,
    })
}

/// The mean code over all rules' sums (`None` without any code).
fn grand_mean(sums: &[CodeSum]) -> Option<Vec<f32>> {
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
}

/// The random codes' directions `[L][N * width]` for `n` OOD problems, drawn from `seed` layer by
/// layer and problem by problem.
fn random_directions(seed: u64, n_layers: usize, n: usize, width: usize) -> Vec<Vec<f32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n_layers)
        .map(|_| {
            (0..n * width)
                .map(|_| rng.gen::<f32>() * 2.0 - 1.0)
                .collect()
        })
        .collect()
}

/// Random codes: each problem's direction of `directions` scaled to the norm of its own code.
///
/// # Shapes
/// `own [B * width]`, `directions [B * width]`; returns `[B * width]`.
fn with_own_norms(own: &[f32], directions: &[f32], width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(own.len());
    for (c, r) in own.chunks_exact(width).zip(directions.chunks_exact(width)) {
        let norm: f32 = c.iter().map(|v| v * v).sum::<f32>().sqrt();
        let rn: f32 = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        out.extend(r.iter().map(|v| v / rn * norm));
    }
    out
}

/// One batch of OOD problems after its plain pass: the problems, the index of the first in the
/// set, the slot's logits `[B][C]` and the model's predictions `[B]`.
struct Receivers<'a> {
    part: &'a ProblemSet,
    start: usize,
    base: &'a [Vec<f32>],
    pred: Vec<usize>,
}

/// Adds the passes `got` (of the receivers `problems`) to `row`: to the donor where the prediction
/// became `expected` (donor transplants only), unchanged where it stayed, elsewhere otherwise.
fn score(
    row: &mut TransplantRow,
    got: &[Vec<f32>],
    problems: &[usize],
    expected: Option<&[usize]>,
    on: &Receivers<'_>,
) {
    for (k, (g, &i)) in got.iter().zip(problems).enumerate() {
        row.max_logit_change = row.max_logit_change.max(max_change(g, &on.base[i]));
        row.n += 1;
        let p = argmax(g);
        if expected.is_some_and(|e| p == e[k]) {
            row.to_donor += 1;
        } else if p == on.pred[i] {
            row.unchanged += 1;
        } else {
            row.elsewhere += 1;
        }
    }
}

/// The receivers a donor rule is scored on, with the answer it should give: not of the donor's
/// rule, and with an expected answer that differs from the original and from the prediction
/// (module docs); and the number left out.
fn donor_targets(
    at: &Layout,
    on: &Receivers<'_>,
    ood: &ProblemSet,
    donor: usize,
) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    let donor_rule = Rule::from_index(donor)?;
    let b = on.pred.len();
    let (mut keep, mut expected, mut excluded) = (Vec::with_capacity(b), Vec::with_capacity(b), 0);
    for (i, &predicted) in on.pred.iter().enumerate() {
        if on.part.rules[[i, at.slot]] as usize == donor {
            continue;
        }
        let pi = on.start + i;
        let row0 = [
            at.value(ood, pi, 0),
            at.value(ood, pi, 1),
            at.value(ood, pi, 2),
        ];
        let expect = answer_under(
            donor_rule,
            row0,
            at.value(ood, pi, 6),
            at.value(ood, pi, 7),
            at.m,
        );
        let original = on.part.y[[i, at.slot]] as usize;
        match expect
            .map(usize::from)
            .filter(|&e| e != original && e != predicted)
        {
            Some(e) => {
                keep.push(i);
                expected.push(e);
            }
            None => excluded += 1,
        }
    }
    Ok((keep, expected, excluded))
}

/// An empty row of `layer` and `kind`.
fn empty_row(layer: usize, kind: TransplantKind) -> TransplantRow {
    TransplantRow {
        layer,
        kind,
        n: 0,
        to_donor: 0,
        elsewhere: 0,
        unchanged: 0,
        excluded: 0,
        max_logit_change: 0.0,
    }
}

/// [`latent_transplant`] with checked arguments: the donors from the ID problems, then per batch
/// of OOD problems one plain pass and, at every layer, the controls and the donors.
fn transplant_with(
    ev: &Evaluator,
    (id, ood): (&ProblemSet, &ProblemSet),
    slot: usize,
    batch: usize,
    seed: u64,
    tick: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<TransplantRow>> {
    let at = Layout::new(ev, slot);
    let directions = random_directions(seed, at.n_layers, ood.len(), at.width());
    let donors = donors(ev, id, &at, batch, tick)?;
    let mut rows: Vec<[TransplantRow; 7]> = (0..at.n_layers)
        .map(|l| TransplantKind::ALL.map(|k| empty_row(l, k)))
        .collect();
    for s in (0..ood.len()).step_by(batch) {
        let part = ood.slice(s, s + batch);
        // One plain pass: the baseline logits, and per layer the own codes [B, H, 2] and the
        // stream entering the block [B, T, D].
        let plain = site_values(ev, &part, &at.answer_row, slot, true)?;
        let on = Receivers {
            part: &part,
            start: s,
            base: &plain.logits,
            pred: plain.logits.iter().map(|v| argmax(v)).collect(),
        };
        for (l, rows) in rows.iter_mut().enumerate() {
            let from = ev.block_start(&plain.streams[l], part.len(), l)?;
            let own = &plain.codes[l];
            let random = with_own_norms(own, &directions[l][s * at.width()..], at.width());
            layer_controls(
                ev,
                &at,
                &from,
                &on,
                [own, &random],
                donors.grand[l].as_ref(),
                rows,
            )?;
            for (donor, code) in donors.means[l].iter().enumerate() {
                let Some(code) = code else { continue };
                let pool = &donors.by_rule[l][donor];
                layer_donor(ev, &at, &from, (&on, ood), (donor, code, pool), rows)?;
            }
            tick()?;
        }
    }
    Ok(rows.into_iter().flatten().collect())
}

/// The controls without a donor rule at one layer (does the answer change at all?): the identity
/// transplant (`own`), a random code of the own code's norm, and the zero and mean ablations of
/// the code (TransformerLens's ablations, on the code alone).
///
/// # Errors
/// Model errors.
fn layer_controls(
    ev: &Evaluator,
    at: &Layout,
    from: &BlockStart,
    on: &Receivers<'_>,
    [own, random]: [&[f32]; 2],
    grand: Option<&Vec<f32>>,
    rows: &mut [TransplantRow; 7],
) -> Result<()> {
    let b = on.pred.len();
    let [_, _, _, random_row, zero_row, mean_row, identity_row] = rows;
    let zeros = vec![0f32; b * at.width()];
    let mean_all = grand.map(|g| g.repeat(b));
    let all: Vec<usize> = (0..b).collect();
    for (codes, row) in [
        (Some(own), identity_row),
        (Some(random), random_row),
        (Some(zeros.as_slice()), zero_row),
        (mean_all.as_deref(), mean_row),
    ] {
        let Some(codes) = codes else { continue };
        let got = transplanted(ev, from, &all, &at.answer_row, codes, at.slot)?;
        score(row, &got, &all, None, on);
    }
    Ok(())
}

/// One donor rule at one layer: its mean ID code at the answer row and at the first row, and the
/// own code of an ID problem of that rule (a different one per OOD problem, from `pool`).
///
/// # Errors
/// Model errors.
fn layer_donor(
    ev: &Evaluator,
    at: &Layout,
    from: &BlockStart,
    (on, ood): (&Receivers<'_>, &ProblemSet),
    (donor, code, pool): (usize, &[f32], &[Vec<f32>]),
    rows: &mut [TransplantRow; 7],
) -> Result<()> {
    let [mean_id, donor_problem, off_row, ..] = rows;
    let (keep, expected, excluded) = donor_targets(at, on, ood, donor)?;
    for row in [&mut *mean_id, &mut *donor_problem, &mut *off_row] {
        row.excluded += excluded;
    }
    if keep.is_empty() {
        return Ok(());
    }
    let codes = code.repeat(keep.len());
    let problem_codes: Vec<f32> = keep
        .iter()
        .flat_map(|&i| pool[(on.start + i) % pool.len()].iter().copied())
        .collect();
    for (keys, codes, row) in [
        (&at.answer_row, &codes, mean_id),
        (&at.answer_row, &problem_codes, donor_problem),
        (&at.first_row, &codes, off_row),
    ] {
        let got = transplanted(ev, from, &keep, keys, codes, at.slot)?;
        score(row, &got, &keep, Some(&expected), on);
    }
    Ok(())
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
        let a =
            latent_transplant(&host, &id, &ood, 3, 8, 0, |_, _| ControlFlow::Continue(())).unwrap();
        let b = latent_transplant(&reference, &id, &ood, 3, 8, 0, |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(a.len(), 14);
        let mut moved = 0;
        for (a, b) in a.iter().zip(&b) {
            let counts = |r: &TransplantRow| {
                (
                    r.layer,
                    r.kind,
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
            if a.kind == TransplantKind::Identity {
                assert_eq!((a.max_logit_change, b.max_logit_change), (0.0, 0.0));
            }
        }
        assert!(moved >= 8, "the transplants hardly moved the logits");
    }

    #[test]
    fn kinds_are_named_in_files_as_before() -> Result<()> {
        let names: Vec<&str> = TransplantKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "mean_id",
                "donor_problem",
                "off_row",
                "random",
                "zero_ablation",
                "mean_ablation",
                "identity"
            ]
        );
        for k in TransplantKind::ALL {
            assert_eq!(k.as_str().parse::<TransplantKind>()?, k);
            assert_eq!(k.to_string(), k.as_str());
            assert_eq!(
                serde_json::to_string(&k).map_err(|e| ProbeError::InvalidInput(e.to_string()))?,
                format!("\"{k}\"")
            );
        }
        assert!("Identity".parse::<TransplantKind>().is_err());
        let donors: Vec<_> = TransplantKind::ALL
            .iter()
            .filter(|k| k.has_donor())
            .collect();
        assert_eq!(donors.len(), 3);
        Ok(())
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
