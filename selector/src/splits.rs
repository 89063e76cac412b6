//! The SM split as a second decision (issue 33, item 3): for a pair that kace has decided to
//! co-locate, which `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` each member gets.
//!
//! **The model's form.** For each candidate split `s` other than 100/100, a ridge regression
//! predicts the log gain of the pair's normalised throughput (Σ colocated / exclusive) at `s`
//! over 100/100, `ln(N_s / N_100/100)`, from z-scored pair features in slot order
//! ([`pair_features`]: log exclusive throughput, SM %, memory %, memcap, of the first member
//! then the second: the system profile an exclusive run sampled by NVML gives, so a workload
//! without a kernel profile still gets a split). Where each workload's exclusive sweep is known
//! (its throughput alone at 10…100 %), the two members' throughput alone at their share of `s`
//! may be added ([`FeatureSet::SystemAndAlone`]). One regression per split, one shared ridge
//! strength; 100/100 is predicted at 0 by construction. Slot order matters: the first member
//! gets the first percentage, so (a, b) and (b, a) are different questions.
//!
//! **The fallback rule.** Each split's predicted gain is discounted by `κ` times its doubt (the
//! regression's residual spread, widened for a pair unlike the training pairs:
//! [`SplitModel::doubts`]); the chooser takes the split with the highest discounted gain when
//! that exceeds a margin, and keeps 100/100 otherwise: a split the model is unsure of is not
//! worth the risk of slowing the pair below what MPS gives unasked. The features, the ridge
//! strength, `κ` and the margin are chosen by cross-validation inside the training pairs only
//! ([`tune`]): of the settings whose out-of-fold choices never fall more than
//! [`MAX_LOSS_VS_DEFAULT`] below 100/100, the one whose choices come closest to the best split
//! on average; when none is that safe, the chooser never leaves 100/100.
//!
//! Pure: sweeps and profiles are read by [`crate::dataset`]'s readers and passed in.
//!
//! Nothing in the node sets the percentage yet; this module is evaluated
//! (`kace eval splits`, docs/models.md, *The SM split*), not used.

use std::collections::HashMap;

use crate::dataset::{SweepRow, ThreadSplit};
use crate::error::SelectorError;
use crate::features::Profile;
use crate::linear::ridge_with_intercept;
use crate::numpy_rng::permutation;
use crate::tuning::{FOLD_SEED, GROUP_FOLDS};
use crate::zscore::ZScore;
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

/// A job measured above this many times its exclusive throughput is a broken measurement, not
/// interference: the same plausibility bound `kace_sql` applies to observations before
/// training (`MAX_RATIO_TO_EXCLUSIVE`; this crate cannot depend on that one).
pub const MAX_RATIO_TO_EXCLUSIVE: f64 = 4.0;

/// Ridge strengths tried.
pub const ALPHAS: [f64; 4] = [0.3, 1.0, 3.0, 10.0];

/// Doubt weights `κ` tried, smallest first: a split's predicted gain is discounted by `κ` times
/// its doubt ([`SplitModel::doubts`]) before it is compared with the margin.
pub const DOUBT_WEIGHTS: [f64; 6] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0];

/// Margins tried, in log-gain units (0.01 ≈ a 1 % predicted gain), smallest first.
pub const MARGINS: [f64; 9] = [0.0, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5];

/// The safety target the margin is chosen for: out of fold, no chosen split may give less than
/// `1 − MAX_LOSS_VS_DEFAULT` of 100/100's normalised throughput (the issue's "never below
/// 100/100 by more than 1 %").
pub const MAX_LOSS_VS_DEFAULT: f64 = 0.01;

/// Number of pair features.
pub const PAIR_FEATURES: usize = 8;

/// The candidate splits the artifact measured: first member 10…90 % with the second getting
/// the rest, then 100/100.
pub fn artifact_candidates() -> Vec<ThreadSplit> {
    let mut out: Vec<ThreadSplit> =
        (1..=9).map(|i| ThreadSplit { first: 10 * i, second: 100 - 10 * i }).collect();
    out.push(ThreadSplit::DEFAULT);
    out
}

/// The features of a pair, in slot order: for the first member then the second, ln exclusive
/// throughput, SM utilisation %, memory utilisation %, memcap (GiB). The log because exclusive
/// throughputs span three orders of magnitude.
pub fn pair_features(profiles: &[Profile; 2]) -> [f64; PAIR_FEATURES] {
    let mut out = [0.0; PAIR_FEATURES];
    for (i, p) in profiles.iter().enumerate() {
        out[4 * i] = p.exclusive_throughput().max(f64::MIN_POSITIVE).ln();
        out[4 * i + 1] = p.get(crate::Feature::SmUtil);
        out[4 * i + 2] = p.get(crate::Feature::MemUtil);
        out[4 * i + 3] = p.memcap();
    }
    out
}

/// What is known about an ordered pair before it runs: its members' profiles and, where
/// measured, how each member runs alone at each candidate's share.
#[derive(Debug, Clone, PartialEq)]
pub struct PairInput {
    /// The members' profiles (only the system features are read).
    pub profiles: [Profile; 2],
    /// Per candidate, each member's throughput running alone at its share of that split over
    /// its throughput alone at 100 % (1 at 100/100); `None` without an exclusive sweep.
    pub alone: Option<Vec<[f64; 2]>>,
}

/// One ordered pair measured at every candidate split.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitExample {
    /// The two workloads: the first gets [`ThreadSplit::first`].
    pub workloads: [String; 2],
    /// What the chooser sees.
    pub input: PairInput,
    /// Normalised throughput (Σ colocated / exclusive) at each candidate, in candidate order.
    pub normalised: Vec<f64>,
}

impl SplitExample {
    /// The pair regardless of slot order: both orders of one pair are held out together.
    pub fn unordered(&self) -> (&str, &str) {
        let (a, b) = (self.workloads[0].as_str(), self.workloads[1].as_str());
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// The best measured normalised throughput over the candidates.
    pub fn best(&self) -> f64 {
        self.normalised.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// Sweep rows that could not become examples, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Some candidate split was not measured.
    pub unmeasured: usize,
    /// A workload has no profile (or a non-positive exclusive throughput).
    pub unprofiled: usize,
    /// A job ran above [`MAX_RATIO_TO_EXCLUSIVE`] times its exclusive throughput.
    pub implausible: usize,
}

/// A workload's throughput running alone at `percent` over its throughput alone at 100 %, from
/// its exclusive sweep (percentage → steps/s); `None` when either was not measured.
pub fn alone_ratio(sweep: &HashMap<u8, f64>, percent: u8) -> Option<f64> {
    let full = *sweep.get(&100)?;
    let at = *sweep.get(&percent)?;
    (full > 0.0 && at.is_finite()).then(|| at / full)
}

/// Turns sweep rows into examples over `candidates`: rows measured at every candidate, with
/// both workloads profiled and every ratio plausible. With `exclusive_sweeps` (workload →
/// percentage → steps/s alone), each example also carries [`PairInput::alone`] where both
/// members' sweeps cover every share (otherwise `None`; the row is kept).
pub fn examples(
    rows: &[SweepRow],
    profiles: &HashMap<String, Profile>,
    exclusive_sweeps: Option<&HashMap<String, HashMap<u8, f64>>>,
    candidates: &[ThreadSplit],
) -> (Vec<SplitExample>, Dropped) {
    let mut out = Vec::new();
    let mut dropped = Dropped::default();
    for r in rows {
        let cells: Option<Vec<[f64; 2]>> = candidates.iter().map(|&s| r.at(s)).collect();
        let Some(cells) = cells else {
            dropped.unmeasured += 1;
            continue;
        };
        let (Some(a), Some(b)) = (profiles.get(&r.workloads[0]), profiles.get(&r.workloads[1]))
        else {
            dropped.unprofiled += 1;
            continue;
        };
        let excl = [a.exclusive_throughput(), b.exclusive_throughput()];
        if excl.iter().any(|e| !(e.is_finite() && *e > 0.0)) {
            dropped.unprofiled += 1;
            continue;
        }
        let ratios: Vec<[f64; 2]> =
            cells.iter().map(|c| [c[0] / excl[0], c[1] / excl[1]]).collect();
        if ratios.iter().flatten().any(|r| *r > MAX_RATIO_TO_EXCLUSIVE) {
            dropped.implausible += 1;
            continue;
        }
        let alone = exclusive_sweeps.and_then(|sw| {
            let (sa, sb) = (sw.get(&r.workloads[0])?, sw.get(&r.workloads[1])?);
            candidates
                .iter()
                .map(|s| Some([alone_ratio(sa, s.first)?, alone_ratio(sb, s.second)?]))
                .collect::<Option<Vec<[f64; 2]>>>()
        });
        out.push(SplitExample {
            workloads: r.workloads.clone(),
            input: PairInput { profiles: [*a, *b], alone },
            normalised: ratios.iter().map(|r| r[0] + r[1]).collect(),
        });
    }
    (out, dropped)
}

/// Which features the per-split regressions use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FeatureSet {
    /// The eight [`pair_features`] of the system profiles.
    System,
    /// Those, plus each member's throughput alone at its share of the split over alone at
    /// 100 % ([`PairInput::alone`]): how much the member needs the SM share it would lose.
    /// Needs each workload's exclusive sweep (nine short runs alone), which kace's profiles
    /// do not have yet.
    SystemAndAlone,
}

impl FeatureSet {
    /// A short stable name for reports.
    pub fn key(self) -> &'static str {
        match self {
            FeatureSet::System => "system",
            FeatureSet::SystemAndAlone => "system+alone",
        }
    }

    /// The raw feature row of `input` for candidate `s`; `None` when a feature is missing.
    fn row(self, input: &PairInput, s: usize) -> Option<Vec<f64>> {
        let mut x = pair_features(&input.profiles).to_vec();
        if self == FeatureSet::SystemAndAlone {
            x.extend_from_slice(input.alone.as_ref()?.get(s)?);
        }
        Some(x)
    }
}

/// One candidate's regression: the normalisation of its feature rows, its ridge terms, and
/// what its doubt is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitTerm {
    /// Normalisation of the feature rows, from the training pairs.
    pub scale: ZScore,
    /// Intercept of the predicted log gain.
    pub intercept: f64,
    /// Coefficients, one per z-scored feature.
    pub coefficients: Vec<f64>,
    /// Standard deviation of the training residuals (n − p − 1 degrees of freedom, at least 1).
    pub sigma: f64,
    /// `(ZᵀZ + αI)⁻¹` of the z-scored training rows, row-major: how far a new pair's features
    /// are from what the regression saw.
    pub inverse: Vec<f64>,
    /// Training pairs.
    pub n: usize,
}

impl SplitTerm {
    fn predict(&self, z: &[f64]) -> f64 {
        self.intercept + self.coefficients.iter().zip(z).map(|(c, v)| c * v).sum::<f64>()
    }

    /// The prediction's doubt: `σ · √(1 + 1/n + zᵀ(ZᵀZ + αI)⁻¹z)`, the ridge analogue of a
    /// prediction interval's half-width per unit of `t`; larger for a pair unlike the training
    /// pairs.
    fn doubt(&self, z: &[f64]) -> f64 {
        let p = z.len();
        let mut q = 0.0;
        for i in 0..p {
            for j in 0..p {
                q += z[i] * self.inverse.get(i * p + j).copied().unwrap_or(0.0) * z[j];
            }
        }
        self.sigma * (1.0 + 1.0 / self.n.max(1) as f64 + q.max(0.0)).sqrt()
    }
}

/// The split chooser: per-split ridge regressions of the log gain over 100/100, and the
/// fallback margin (see the module's documentation for the form). Stored as JSON
/// (`kace splits train`, the store's `split_models`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitModel {
    /// The candidates, 100/100 among them.
    pub candidates: Vec<ThreadSplit>,
    /// The features used.
    pub features: FeatureSet,
    /// Per candidate, its regression; `None` for 100/100 (predicted at 0).
    pub terms: Vec<Option<SplitTerm>>,
    /// The ridge strength.
    pub alpha: f64,
    /// The least predicted log gain, less `doubt_weight` times its doubt, for which a split
    /// other than 100/100 is chosen; `None`: never (cross-validation found nothing safe enough).
    pub margin: Option<f64>,
    /// `κ`, how many doubts a predicted gain is discounted by.
    pub doubt_weight: f64,
}

/// Every example has one normalised value per candidate (what indexing by candidate relies on).
pub fn check_widths(
    examples: &[&SplitExample],
    candidates: &[ThreadSplit],
) -> Result<(), SelectorError> {
    match examples.iter().find(|e| e.normalised.len() != candidates.len()) {
        Some(e) => Err(SelectorError::DimensionMismatch {
            expected: candidates.len(),
            found: e.normalised.len(),
        }),
        None => Ok(()),
    }
}

/// Position of 100/100 among `candidates`.
fn default_index(candidates: &[ThreadSplit]) -> Result<usize, SelectorError> {
    candidates
        .iter()
        .position(|s| s.is_default())
        .ok_or_else(|| SelectorError::Invalid("the candidate splits must include 100/100".into()))
}

/// The settings of one fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SplitSettings {
    /// The features.
    pub features: FeatureSet,
    /// The ridge strength.
    pub alpha: f64,
    /// The fallback margin (`None`: never leave 100/100).
    pub margin: Option<f64>,
    /// The doubt weight `κ`.
    pub doubt_weight: f64,
}

impl SplitModel {
    /// Fits the per-split regressions on `examples` (normalised values in `candidates` order).
    pub fn fit(
        examples: &[&SplitExample],
        candidates: &[ThreadSplit],
        settings: SplitSettings,
    ) -> Result<SplitModel, SelectorError> {
        let d = default_index(candidates)?;
        if examples.is_empty() {
            return Err(SelectorError::EmptyTrainingSet);
        }
        check_widths(examples, candidates)?;
        let mut terms = Vec::with_capacity(candidates.len());
        for s in 0..candidates.len() {
            if s == d {
                terms.push(None);
                continue;
            }
            let raw: Vec<Vec<f64>> = examples
                .iter()
                .map(|e| settings.features.row(&e.input, s))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    SelectorError::Invalid(format!(
                        "features '{}' need every training pair's exclusive sweeps",
                        settings.features.key()
                    ))
                })?;
            let width = raw[0].len();
            let scale = ZScore::fit(&raw, width, 1);
            let x: Vec<Vec<f64>> = raw.iter().map(|r| scale.apply(r)).collect();
            // A non-positive measurement has no log; such a split is simply a large loss.
            let y: Vec<f64> = examples
                .iter()
                .map(|e| (e.normalised[s].max(1e-6) / e.normalised[d].max(1e-6)).ln())
                .collect();
            let (intercept, coefficients) = ridge_with_intercept(&x, &y, settings.alpha)?;
            let n = x.len();
            let zt = DMatrix::from_fn(n, width, |i, j| x[i][j]);
            let a = zt.tr_mul(&zt) + DMatrix::identity(width, width) * settings.alpha;
            let inv = a
                .try_inverse()
                .ok_or_else(|| SelectorError::Numerical("ridge system is not invertible".into()))?;
            let inverse: Vec<f64> = (0..width)
                .flat_map(|i| (0..width).map(move |j| (i, j)))
                .map(|(i, j)| inv[(i, j)])
                .collect();
            let sse: f64 = x
                .iter()
                .zip(&y)
                .map(|(r, v)| {
                    let f = intercept + coefficients.iter().zip(r).map(|(c, z)| c * z).sum::<f64>();
                    (v - f) * (v - f)
                })
                .sum();
            let dof = (n as f64 - width as f64 - 1.0).max(1.0);
            let sigma = (sse / dof).sqrt();
            terms.push(Some(SplitTerm { scale, intercept, coefficients, sigma, inverse, n }));
        }
        Ok(SplitModel {
            candidates: candidates.to_vec(),
            features: settings.features,
            terms,
            alpha: settings.alpha,
            margin: settings.margin,
            doubt_weight: settings.doubt_weight,
        })
    }

    /// Predicted log gain over 100/100 at each candidate (0 at 100/100); `None` when the pair
    /// lacks a feature the model uses.
    pub fn predicted_gains(&self, input: &PairInput) -> Option<Vec<f64>> {
        self.terms
            .iter()
            .enumerate()
            .map(|(s, t)| match t {
                None => Some(0.0),
                Some(t) => {
                    let x = self.features.row(input, s)?;
                    Some(t.predict(&t.scale.apply(&x)))
                }
            })
            .collect()
    }

    /// Each candidate's doubt (0 at 100/100, known exactly); `None` when the pair lacks a
    /// feature the model uses.
    pub fn doubts(&self, input: &PairInput) -> Option<Vec<f64>> {
        self.terms
            .iter()
            .enumerate()
            .map(|(s, t)| match t {
                None => Some(0.0),
                Some(t) => Some(t.doubt(&t.scale.apply(&self.features.row(input, s)?))),
            })
            .collect()
    }

    fn default_index(&self) -> usize {
        self.terms.iter().position(Option::is_none).unwrap_or(0)
    }

    /// The candidate with the highest predicted gain, without the fallback rule (ties: the
    /// earlier candidate; 100/100 when a feature is missing).
    pub fn best_predicted(&self, input: &PairInput) -> usize {
        self.predicted_gains(input).map_or(self.default_index(), |g| argmax(&g))
    }

    /// The split chosen: the one whose predicted gain less `κ` times its doubt is highest,
    /// when that exceeds the margin; otherwise 100/100 (also when a feature is missing:
    /// nothing to go on). Returns its index in [`SplitModel::candidates`].
    pub fn choose(&self, input: &PairInput) -> usize {
        let d = self.default_index();
        match (self.predicted_gains(input), self.doubts(input)) {
            (Some(g), Some(u)) => pick(&g, &u, self.doubt_weight, self.margin, d),
            _ => d,
        }
    }
}

/// The fallback rule on predicted gains `g` and doubts `u`.
fn pick(g: &[f64], u: &[f64], kappa: f64, margin: Option<f64>, default: usize) -> usize {
    let lower: Vec<f64> = g.iter().zip(u).map(|(g, u)| g - kappa * u).collect();
    let b = argmax(&lower);
    match margin {
        Some(m) if lower.get(b).is_some_and(|v| *v > m) => b,
        _ => default,
    }
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// What [`tune`] chose, and how its choices fared out of fold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SplitTuned {
    /// The settings chosen.
    pub settings: SplitSettings,
    /// Out of fold, the mean ratio of the chosen split's normalised throughput to the best's.
    pub cv_chosen_vs_best: f64,
    /// Out of fold, the smallest ratio of the chosen split's to 100/100's.
    pub cv_worst_vs_default: f64,
}

/// Seeded folds of `examples` by unordered pair: both orders of a pair fall in one fold.
pub fn pair_folds(examples: &[&SplitExample], folds: usize, seed: u32) -> Vec<Vec<usize>> {
    let mut keys: Vec<(&str, &str)> = examples.iter().map(|e| e.unordered()).collect();
    keys.sort_unstable();
    keys.dedup();
    let k = folds.clamp(2, keys.len().max(2));
    let mut fold_of = HashMap::new();
    for (pos, i) in permutation(seed, keys.len()).into_iter().enumerate() {
        fold_of.insert(keys[i], pos % k);
    }
    let mut out = vec![Vec::new(); k];
    for (i, e) in examples.iter().enumerate() {
        if let Some(&f) = fold_of.get(&e.unordered()) {
            out[f].push(i);
        }
    }
    out.retain(|f| !f.is_empty() && f.len() < examples.len());
    out
}

/// The feature sets `examples` support, simplest first.
pub fn feature_sets(examples: &[&SplitExample]) -> Vec<FeatureSet> {
    let mut out = vec![FeatureSet::System];
    if !examples.is_empty() && examples.iter().all(|e| e.input.alone.is_some()) {
        out.push(FeatureSet::SystemAndAlone);
    }
    out
}

/// Chooses the features, the ridge strength, the doubt weight (from `doubt_weights`) and the
/// margin by cross-validation on `examples` only: 5 seeded folds of pairs ([`pair_folds`]); for each feature set ([`feature_sets`]) and
/// strength, every example's gains predicted by the model fitted without its fold; for each
/// margin, the choices those predictions make. Of the settings whose worst out-of-fold choice
/// is at least `1 − MAX_LOSS_VS_DEFAULT` of 100/100, the one with the highest mean ratio to the
/// best split wins (ties: the earlier — simpler features, smaller strength and margin); with
/// none, the margin is `None` (never leave 100/100).
pub fn tune(
    examples: &[&SplitExample],
    candidates: &[ThreadSplit],
    doubt_weights: &[f64],
) -> Result<SplitTuned, SelectorError> {
    let d = default_index(candidates)?;
    check_widths(examples, candidates)?;
    let folds = pair_folds(examples, GROUP_FOLDS, FOLD_SEED);
    if folds.len() < 2 {
        return Err(SelectorError::Invalid(format!(
            "cross-validation needs at least two pairs ({} examples)",
            examples.len()
        )));
    }
    let mut best: Option<SplitTuned> = None;
    let mut unsafe_best: Option<SplitTuned> = None;
    for features in feature_sets(examples) {
        for alpha in ALPHAS {
            let settings = SplitSettings { features, alpha, margin: None, doubt_weight: 0.0 };
            let mut gains: Vec<Vec<f64>> = vec![Vec::new(); examples.len()];
            let mut doubts: Vec<Vec<f64>> = vec![Vec::new(); examples.len()];
            for held in &folds {
                let fit: Vec<&SplitExample> = (0..examples.len())
                    .filter(|i| !held.contains(i))
                    .map(|i| examples[i])
                    .collect();
                let m = SplitModel::fit(&fit, candidates, settings)?;
                for &i in held {
                    // Every example has the features here (feature_sets checked).
                    gains[i] = m.predicted_gains(&examples[i].input).unwrap_or_default();
                    doubts[i] = m.doubts(&examples[i].input).unwrap_or_default();
                }
            }
            for (kappa, margin) in
                doubt_weights.iter().flat_map(|&k| MARGINS.into_iter().map(move |m| (k, m)))
            {
                let (mut sum, mut worst) = (0.0, f64::INFINITY);
                for ((e, g), u) in examples.iter().zip(&gains).zip(&doubts) {
                    let p = if g.is_empty() { d } else { pick(g, u, kappa, Some(margin), d) };
                    sum += e.normalised[p] / e.best();
                    worst = worst.min(e.normalised[p] / e.normalised[d]);
                }
                let t = SplitTuned {
                    settings: SplitSettings {
                        margin: Some(margin),
                        doubt_weight: kappa,
                        ..settings
                    },
                    cv_chosen_vs_best: sum / examples.len() as f64,
                    cv_worst_vs_default: worst,
                };
                let better = |b: &Option<SplitTuned>| {
                    b.as_ref().is_none_or(|b| t.cv_chosen_vs_best > b.cv_chosen_vs_best)
                };
                if worst >= 1.0 - MAX_LOSS_VS_DEFAULT {
                    if better(&best) {
                        best = Some(t);
                    }
                } else if better(&unsafe_best) {
                    unsafe_best = Some(t);
                }
            }
        }
    }
    if let Some(b) = best {
        return Ok(b);
    }
    // Nothing safe: never leave 100/100, out of fold exactly what 100/100 scores.
    let settings = unsafe_best.map_or(
        SplitSettings {
            features: FeatureSet::System,
            alpha: ALPHAS[0],
            margin: None,
            doubt_weight: 0.0,
        },
        |u| SplitSettings { margin: None, ..u.settings },
    );
    let cv = examples.iter().map(|e| e.normalised[d] / e.best()).sum::<f64>();
    Ok(SplitTuned {
        settings,
        cv_chosen_vs_best: cv / examples.len() as f64,
        cv_worst_vs_default: 1.0,
    })
}

/// Tunes on `examples` (doubt weights from `doubt_weights`: [`DOUBT_WEIGHTS`], or `[0.0]` for
/// the margin alone) and fits the chosen setting on all of them.
pub fn fit_tuned(
    examples: &[&SplitExample],
    candidates: &[ThreadSplit],
    doubt_weights: &[f64],
) -> Result<(SplitModel, SplitTuned), SelectorError> {
    let t = tune(examples, candidates, doubt_weights)?;
    Ok((SplitModel::fit(examples, candidates, t.settings)?, t))
}

/// The splits kace can set when it adds a joiner beside a running lead, among those `rows`
/// measured: the lead keeps 100 % (none set), the joiner gets a percentage. MPS reads
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` when a client creates its CUDA context, and the control
/// daemon's `set_active_thread_percentage` applies to a server's later clients only (NVIDIA's
/// MPS guide, "Environment Variables" and "mps-control"), so a running lead's share cannot
/// change. 100/100 is always among them; sorted.
pub fn joiner_candidates(rows: &[SweepRow]) -> Vec<ThreadSplit> {
    let mut out: Vec<ThreadSplit> = rows
        .iter()
        .flat_map(|r| r.cells.iter().map(|(s, _)| *s))
        .filter(|s| s.first == 100 && (1..=100).contains(&s.second))
        .collect();
    out.push(ThreadSplit::DEFAULT);
    out.sort_unstable();
    out.dedup();
    out
}

/// The chooser kace deploys, as trained from sweeps ([`train_joiner_chooser`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JoinerTraining {
    /// The chooser, fitted on every usable pair with the settings cross-validation chose.
    pub model: SplitModel,
    /// What cross-validation inside the pairs chose and measured.
    pub tuned: SplitTuned,
    /// Ordered pairs it was fitted on.
    pub examples: usize,
    /// Rows that could not be used, by reason.
    pub dropped: Dropped,
}

/// Trains the joiner's split chooser on `rows` (sweeps with the lead at 100 %,
/// [`joiner_candidates`]) and the workloads' system `profiles`: the system features only, the
/// one form the decider can evaluate (it has no exclusive sweeps), tuned by [`tune`] with every
/// doubt weight. Fails when the sweeps hold no joiner-only split, or too few usable pairs to
/// cross-validate.
pub fn train_joiner_chooser(
    rows: &[SweepRow],
    profiles: &HashMap<String, Profile>,
) -> Result<JoinerTraining, SelectorError> {
    let candidates = joiner_candidates(rows);
    if candidates.len() < 2 {
        return Err(SelectorError::Invalid(
            "the sweeps hold no split with the lead at 100 % and the joiner below it (columns \
             such as '(LS100, BE50)'): kace can set only a joiner's share, a running lead's \
             cannot change"
                .into(),
        ));
    }
    let (ex, dropped) = examples(rows, profiles, None, &candidates);
    let refs: Vec<&SplitExample> = ex.iter().collect();
    let (model, tuned) = fit_tuned(&refs, &candidates, &DOUBT_WEIGHTS)?;
    Ok(JoinerTraining { model, tuned, examples: ex.len(), dropped })
}

impl SplitModel {
    /// The share the joiner `joiner` gets beside the running `lead`: `Some(p)` when the chosen
    /// split leaves the lead at 100 % and gives the joiner `p` < 100; `None` (set nothing)
    /// otherwise, also for a model with other candidates or a profile missing a feature.
    pub fn joiner_share(&self, lead: &Profile, joiner: &Profile) -> Option<u8> {
        if self.features != FeatureSet::System {
            return None;
        }
        let input = PairInput { profiles: [*lead, *joiner], alone: None };
        let chosen = *self.candidates.get(self.choose(&input))?;
        (chosen.first == 100 && chosen.second < 100).then_some(chosen.second)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::features::{Feature, FEATURE_COUNT};

    pub(crate) fn profile(excl: f64, sm: f64) -> Profile {
        let mut f = [0.0; FEATURE_COUNT];
        f[Feature::ExclusiveThroughput.index()] = excl;
        f[Feature::SmUtil.index()] = sm;
        f[Feature::MemUtil.index()] = sm / 3.0;
        f[Feature::Memcap.index()] = 1.0 + sm / 20.0;
        Profile::new(f).system_only()
    }

    /// Ordered pairs of 12 workloads whose best split is learnable from the profiles: the
    /// first member's share of the GPU should be its SM utilisation's share of the pair's, and
    /// the normalised throughput falls off quadratically around that; 100/100 loses `penalty`.
    /// With `noise`, a deterministic pseudo-random term of that size replaces the structure.
    pub(crate) fn synthetic(penalty: f64, noise: f64) -> (Vec<SplitExample>, Vec<ThreadSplit>) {
        let c = artifact_candidates();
        let ws: Vec<(String, Profile)> = (0..12)
            .map(|i| (format!("w{i}"), profile(5.0 + 3.0 * i as f64, 10.0 + 7.5 * i as f64)))
            .collect();
        let mut out = Vec::new();
        let mut state = 12345u64;
        let mut rand = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        for (i, a) in ws.iter().enumerate() {
            for (j, b) in ws.iter().enumerate() {
                if i == j {
                    continue;
                }
                let share = a.1.get(Feature::SmUtil)
                    / (a.1.get(Feature::SmUtil) + b.1.get(Feature::SmUtil));
                let normalised = c
                    .iter()
                    .map(|s| {
                        if s.is_default() {
                            1.3 * (1.0 - penalty) + noise * rand()
                        } else {
                            let d = s.first as f64 / 100.0 - share;
                            1.3 - 1.5 * d * d + noise * rand()
                        }
                    })
                    .collect();
                out.push(SplitExample {
                    workloads: [a.0.clone(), b.0.clone()],
                    input: PairInput { profiles: [a.1, b.1], alone: None },
                    normalised,
                });
            }
        }
        (out, c)
    }

    /// Sweep rows of 12 workloads with the lead at 100 % and the joiner at 30, 50, 70 and 100,
    /// plus a complementary column the joiner's chooser must ignore: the pair does best with
    /// the joiner at `1 − its SM % / 150` of the SMs (a hungry joiner is worth capping).
    fn joiner_rows() -> (Vec<SweepRow>, HashMap<String, Profile>) {
        let ws: Vec<(String, Profile)> = (0..12)
            .map(|i| (format!("w{i}"), profile(5.0 + 3.0 * i as f64, 10.0 + 7.5 * i as f64)))
            .collect();
        let mut rows = Vec::new();
        for (i, a) in ws.iter().enumerate() {
            for (j, b) in ws.iter().enumerate() {
                if i == j {
                    continue;
                }
                let target = 1.0 - b.1.get(Feature::SmUtil) / 150.0;
                let (ea, eb) = (a.1.exclusive_throughput(), b.1.exclusive_throughput());
                let cell = |p: u8| {
                    let d = f64::from(p) / 100.0 - target;
                    let n = 1.2 - 1.5 * d * d;
                    Some([ea * n / 2.0, eb * n / 2.0])
                };
                let mut cells: Vec<(ThreadSplit, Option<[f64; 2]>)> = [30u8, 50, 70, 100]
                    .iter()
                    .map(|&p| (ThreadSplit { first: 100, second: p }, cell(p)))
                    .collect();
                cells.push((ThreadSplit { first: 30, second: 70 }, Some([ea, eb])));
                rows.push(SweepRow { workloads: [a.0.clone(), b.0.clone()], cells });
            }
        }
        (rows, ws.into_iter().collect())
    }

    #[test]
    fn the_joiners_chooser_learns_from_lead_at_100_sweeps_and_caps_only_the_joiner() {
        let (rows, profiles) = joiner_rows();
        let cands = joiner_candidates(&rows);
        assert!(cands.iter().all(|c| c.first == 100), "{cands:?}");
        assert_eq!(cands.len(), 4);
        let t = train_joiner_chooser(&rows, &profiles).unwrap();
        assert_eq!(t.examples, rows.len());
        assert!(t.tuned.cv_worst_vs_default >= 1.0 - MAX_LOSS_VS_DEFAULT, "{:?}", t.tuned);
        // A hungry joiner (SM 92.5 %: best at 38 %) is capped; a light one (10 %: best at
        // 93 %) runs unset.
        let (lead, hungry, light) = (profiles["w0"], profiles["w11"], profiles["w1"]);
        let share = t.model.joiner_share(&lead, &hungry);
        assert!(share.is_some_and(|p| p <= 50), "{share:?}");
        assert_eq!(t.model.joiner_share(&lead, &profiles["w0"]), None);
        let light_share = t.model.joiner_share(&hungry, &light);
        assert!(light_share.is_none_or(|p| p >= 70), "{light_share:?}");
        // It survives the store's JSON.
        let json = serde_json::to_string(&t.model).unwrap();
        let back: SplitModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back.joiner_share(&lead, &hungry), share);
    }

    #[test]
    fn sweeps_without_a_joiner_only_split_train_no_chooser() {
        let (ex, c) = synthetic(0.1, 0.0);
        let rows: Vec<SweepRow> = ex
            .iter()
            .map(|e| SweepRow {
                workloads: e.workloads.clone(),
                cells: c.iter().zip(&e.normalised).map(|(s, n)| (*s, Some([*n, 0.0]))).collect(),
            })
            .collect();
        let profiles: HashMap<String, Profile> =
            ex.iter().map(|e| (e.workloads[0].clone(), e.input.profiles[0])).collect();
        let e = train_joiner_chooser(&rows, &profiles).unwrap_err();
        assert!(e.to_string().contains("lead at 100 %"), "{e}");
        // An artifact-style model (complementary splits) never yields a joiner's share.
        let refs: Vec<&SplitExample> = ex.iter().collect();
        let (m, _) = fit_tuned(&refs, &c, &DOUBT_WEIGHTS).unwrap();
        for e in &ex {
            assert_eq!(m.joiner_share(&e.input.profiles[0], &e.input.profiles[1]), None);
        }
    }

    #[test]
    fn a_learnable_best_split_is_chosen() {
        let (ex, c) = synthetic(0.1, 0.0);
        let refs: Vec<&SplitExample> = ex.iter().collect();
        let (m, t) = fit_tuned(&refs, &c, &DOUBT_WEIGHTS).unwrap();
        assert!(t.settings.margin.is_some(), "{t:?}");
        assert!(t.cv_worst_vs_default >= 1.0 - MAX_LOSS_VS_DEFAULT);
        let mean = ex.iter().map(|e| e.normalised[m.choose(&e.input)] / e.best()).sum::<f64>()
            / ex.len() as f64;
        assert!(mean > 0.99, "chosen/best {mean}");
        // Every pair's best split is one other than 100/100 here. A linear model of a quadratic
        // optimum is not exact, so a few pairs whose predicted gain stays under the margin keep
        // 100/100; never one that loses to it.
        let d = c.len() - 1;
        let kept = ex.iter().filter(|e| m.choose(&e.input) == d).count();
        assert!(kept * 10 <= ex.len(), "kept 100/100 for {kept} of {}", ex.len());
        assert!(ex.iter().all(|e| e.normalised[m.choose(&e.input)] >= e.normalised[d] * 0.99));
    }

    #[test]
    fn noise_falls_back_to_the_default() {
        // 100/100 is as good as any split on average and the gains are pure noise.
        let (ex, c) = synthetic(0.0, 0.4);
        let flat: Vec<SplitExample> = ex
            .into_iter()
            .map(|mut e| {
                for v in e.normalised.iter_mut().take(9) {
                    *v -= 0.2;
                }
                e
            })
            .collect();
        let refs: Vec<&SplitExample> = flat.iter().collect();
        let (m, t) = fit_tuned(&refs, &c, &DOUBT_WEIGHTS).unwrap();
        let d = c.len() - 1;
        let left = flat.iter().filter(|e| m.choose(&e.input) != d).count();
        assert!(left * 20 <= flat.len(), "left 100/100 for {left} of {} pairs ({t:?})", flat.len());
        assert!(t.cv_worst_vs_default >= 1.0 - MAX_LOSS_VS_DEFAULT);
    }

    #[test]
    fn doubt_grows_for_a_pair_unlike_the_training_pairs() {
        let (ex, c) = synthetic(0.1, 0.05);
        let refs: Vec<&SplitExample> = ex.iter().collect();
        let settings = SplitSettings {
            features: FeatureSet::System,
            alpha: 1.0,
            margin: Some(0.0),
            doubt_weight: 1.0,
        };
        let m = SplitModel::fit(&refs, &c, settings).unwrap();
        let seen = m.doubts(&ex[0].input).unwrap();
        let far = PairInput { profiles: [profile(500.0, 400.0), profile(0.5, 1.0)], alone: None };
        let unseen = m.doubts(&far).unwrap();
        assert_eq!((seen[9], unseen[9]), (0.0, 0.0), "100/100 is known exactly");
        assert!(seen[..9].iter().zip(&unseen[..9]).all(|(s, u)| u > s && *s > 0.0));
        // A huge doubt weight leaves 100/100 for every pair; none leaves it where gains are seen.
        let timid = SplitModel { doubt_weight: 1e6, ..m.clone() };
        assert!(ex.iter().all(|e| timid.choose(&e.input) == 9));
        assert!(ex.iter().any(|e| m.choose(&e.input) != 9));
    }

    #[test]
    fn folds_keep_both_orders_of_a_pair_together() {
        let (ex, _) = synthetic(0.1, 0.0);
        let refs: Vec<&SplitExample> = ex.iter().collect();
        let f = pair_folds(&refs, GROUP_FOLDS, FOLD_SEED);
        assert_eq!(f.len(), GROUP_FOLDS);
        assert_eq!(f.iter().map(Vec::len).sum::<usize>(), ex.len());
        for fold in &f {
            for &i in fold {
                let twin = ex.iter().position(|e| {
                    e.workloads == [ex[i].workloads[1].clone(), ex[i].workloads[0].clone()]
                });
                assert!(twin.is_some_and(|t| fold.contains(&t)));
            }
        }
    }

    #[test]
    fn examples_keep_complete_profiled_plausible_rows() {
        let c = vec![ThreadSplit { first: 50, second: 50 }, ThreadSplit::DEFAULT];
        let row = |a: &str, b: &str, half: Option<[f64; 2]>, full: [f64; 2]| SweepRow {
            workloads: [a.into(), b.into()],
            cells: vec![(c[0], half), (c[1], Some(full))],
        };
        let profiles: HashMap<String, Profile> =
            [("a".to_string(), profile(10.0, 50.0)), ("b".to_string(), profile(20.0, 30.0))].into();
        let rows = [
            row("a", "b", Some([5.0, 10.0]), [6.0, 12.0]),
            row("a", "b", None, [6.0, 12.0]),
            row("a", "z", Some([5.0, 10.0]), [6.0, 12.0]),
            row("a", "b", Some([50.0, 10.0]), [6.0, 12.0]),
        ];
        let (ex, dropped) = examples(&rows, &profiles, None, &c);
        assert_eq!(dropped, Dropped { unmeasured: 1, unprofiled: 1, implausible: 1 });
        assert_eq!(ex.len(), 1);
        assert!(
            (ex[0].normalised[0] - 1.0).abs() < 1e-12 && (ex[0].normalised[1] - 1.2).abs() < 1e-12
        );
        let system = SplitSettings {
            features: FeatureSet::System,
            alpha: 1.0,
            margin: None,
            doubt_weight: 0.0,
        };
        assert!(SplitModel::fit(&[&ex[0]], &c[..1], system).is_err(), "no 100/100");
        let alone = SplitSettings { features: FeatureSet::SystemAndAlone, ..system };
        assert!(SplitModel::fit(&[&ex[0]], &c, alone).is_err(), "no exclusive sweeps");
        // With exclusive sweeps, each member's share alone over 100 % alone.
        let sweeps: HashMap<String, HashMap<u8, f64>> = [
            ("a".to_string(), [(50, 6.0), (100, 10.0)].into()),
            ("b".to_string(), [(50, 15.0), (100, 20.0)].into()),
        ]
        .into();
        let (ex, _) = examples(&rows, &profiles, Some(&sweeps), &c);
        assert_eq!(ex[0].input.alone, Some(vec![[0.6, 0.75], [1.0, 1.0]]));
        assert!(tune(&[&ex[0]], &c, &DOUBT_WEIGHTS).is_err(), "one pair cannot be cross-validated");
    }
}
