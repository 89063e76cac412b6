//! kace's default model: it predicts each job's *slowdown* — colocated over exclusive
//! throughput — from its own profile, its partners' profiles, their interaction, and two learnt
//! per-workload terms (how sensitive a workload is to sharing, and how much it presses on
//! others). A group's throughput sum or normalised progress follows from the slowdowns.
//!
//! Why this shape: the paper's model regresses the raw throughput *sum* on summed features, so a
//! fast inference job's own speed swamps everything else and one model must learn interference
//! and speed at once. Predicting each job's ratio in log space separates the two (speed is known
//! exactly from the profile), treats the two jobs of a pair asymmetrically, and doubles the
//! training samples. The per-workload terms are ridge-shrunk to zero, so a workload never seen in
//! training falls back to the profile-only part. A job is never predicted to run faster beside
//! partners than it was ever measured to (its *ceiling*, at least [`MAX_SLOWDOWN`]): a
//! log-linear model would otherwise extrapolate past it. See `docs/models.md` for the
//! evaluation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dataset::Group;
use crate::error::SelectorError;
use crate::features::{combine, Feature, Profile, FEATURE_COUNT};
use crate::linear::{ridge_with_intercept, weighted_ridge_with_intercept};
use crate::zscore::ZScore;

/// The ceiling on the predicted slowdown (colocated / exclusive throughput) of a workload never
/// measured faster than alone, and of one never seen in training.
///
/// Sharing a GPU cannot make a job faster than running alone. Without a ceiling a log-linear
/// model extrapolates to ratios above 1 for partners unlike any it was trained on, and such a
/// candidate wins every choice it is in: on the 3-way data that was the largest source of wrong
/// picks (`docs/models.md`). A workload measured faster beside partners than "alone" (the
/// artifact has ratios up to 2.6 for short inference jobs whose exclusive throughput was
/// measured low) keeps its largest measured ratio as its ceiling: a flat cap at 1 hid exactly
/// those jobs' real progress and lost 0.08 on the normalised-progress objective.
pub const MAX_SLOWDOWN: f64 = 1.0;

/// Width of the profile part of a job's feature vector: own, partners', and their product.
pub const PROFILE_WIDTH: usize = 3 * FEATURE_COUNT;

/// Huber threshold of the robust fit, in robust standard deviations of the residuals (the
/// usual 95 %-efficiency constant): a sample further out than this counts linearly, not
/// quadratically, so one absurd observation cannot pull the fit towards itself.
pub const HUBER_K: f64 = 1.345;

/// Iterations of reweighted ridge in the robust fit (each is one closed-form solve).
const HUBER_ITERATIONS: usize = 3;

/// A sample further than this many robust standard deviations from the fit does not raise its
/// workload's ceiling: a ceiling is the largest *plausible* measured ratio.
const CEILING_OUTLIER_K: f64 = 4.0;

/// A profile without kernel metrics (a system profile sampled by NVML) gets the mean kernel
/// metrics, in log space, of this many trained workloads nearest to it in system-profile space
/// (z-scored log exclusive throughput, SM %, memory-bandwidth % and memcap).
pub const KERNEL_FILL_NEIGHBOURS: usize = 3;

/// `profile` with its absent kernel metrics filled from the nearest of `donors` (log profiles
/// of workloads with kernel metrics; see [`KERNEL_FILL_NEIGHBOURS`]). Without donors it is
/// returned as it is: every workload then lacks them alike and the kernel columns carry nothing.
fn fill_kernel_metrics(
    donors: &BTreeMap<String, [f64; FEATURE_COUNT]>,
    profile: &Profile,
) -> Profile {
    if profile.has_kernel_metrics || donors.is_empty() {
        return *profile;
    }
    let own = LogProfile::of(profile).0;
    let system: Vec<usize> = Feature::SYSTEM.iter().map(|f| f.index()).collect();
    let rows: Vec<Vec<f64>> =
        donors.values().map(|d| system.iter().map(|&j| d[j]).collect()).collect();
    let scale = ZScore::fit(&rows, system.len(), 0);
    let mut near: Vec<(f64, &[f64; FEATURE_COUNT])> = donors
        .values()
        .zip(&rows)
        .map(|(d, r)| {
            let dist = (0..system.len())
                .map(|c| (scale.apply_one(c, r[c]) - scale.apply_one(c, own[system[c]])).powi(2))
                .sum::<f64>();
            (dist, d)
        })
        .collect();
    near.sort_by(|a, b| a.0.total_cmp(&b.0));
    let k = KERNEL_FILL_NEIGHBOURS.min(near.len());
    let mut out = *profile;
    for f in Feature::KERNEL {
        let j = f.index();
        let mean_log = near[..k].iter().map(|(_, d)| d[j]).sum::<f64>() / k as f64;
        out.features[j] = mean_log.exp_m1();
    }
    out
}

/// Training settings of a [`SlowdownModel`]. The defaults are the centre of the grid that
/// [`crate::tuning`] chooses from by cross-validation on the training data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlowdownParams {
    /// Ridge strength on every coefficient (the features are z-scored, ddof = 0).
    pub alpha: f64,
    /// Value of a workload's indicator column; larger means its per-workload terms are
    /// penalised less (effective strength α / scale²).
    pub workload_scale: f64,
    /// Fit with the Huber loss (threshold [`HUBER_K`]) instead of squared error. Absent in
    /// models stored before it existed: those were fitted without it.
    #[serde(default)]
    pub robust: bool,
    /// A workload never trained on borrows the mean sensitivity and pressure of this many
    /// trained workloads nearest to it in profile space (0: it gets none, only the profile
    /// part). Absent in models stored before it existed: 0.
    #[serde(default)]
    pub neighbours: usize,
}

impl Default for SlowdownParams {
    fn default() -> Self {
        SlowdownParams { alpha: 1.0, workload_scale: 1.0, robust: true, neighbours: 0 }
    }
}

/// A member of a group as the model sees it: its profile and, if known, its workload name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member<'a> {
    /// The workload's profile.
    pub profile: &'a Profile,
    /// The workload's name, for its learnt per-workload terms.
    pub workload: Option<&'a str>,
}

/// The log-feature transform of a profile, computed once per profile and reused for every
/// group it is scored in (the prolog scores one lead against many candidates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogProfile(pub [f64; FEATURE_COUNT]);

impl LogProfile {
    /// `ln(1 + |v|)` of every feature: the features span six orders of magnitude.
    pub fn of(p: &Profile) -> LogProfile {
        LogProfile(p.features.map(|v| v.abs().ln_1p()))
    }
}

/// Per-workload spreads of a fit, with the widest of them kept beside them: every group with a
/// workload the model never trained on is given the widest, and a decision among a thousand
/// new candidates would otherwise scan every spread a thousand times. Stored as the plain map.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "BTreeMap<String, f64>")]
pub struct Spreads {
    by_workload: BTreeMap<String, f64>,
    widest: f64,
}

impl Spreads {
    /// A workload's spread, if the model trained on it.
    pub fn get(&self, workload: &str) -> Option<f64> {
        self.by_workload.get(workload).copied()
    }

    /// The largest spread (0 when there is none).
    pub fn widest(&self) -> f64 {
        self.widest
    }

    /// Every workload's spread, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.by_workload.iter().map(|(w, s)| (w.as_str(), *s))
    }
}

impl From<BTreeMap<String, f64>> for Spreads {
    fn from(by_workload: BTreeMap<String, f64>) -> Spreads {
        let widest = by_workload.values().copied().fold(0.0, f64::max);
        Spreads { by_workload, widest }
    }
}

impl FromIterator<(String, f64)> for Spreads {
    fn from_iter<I: IntoIterator<Item = (String, f64)>>(iter: I) -> Spreads {
        Spreads::from(iter.into_iter().collect::<BTreeMap<_, _>>())
    }
}

impl Serialize for Spreads {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.by_workload.serialize(s)
    }
}

/// The fitted model. Serialisable, so the database can store and version it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowdownModel {
    /// Settings it was trained with.
    pub params: SlowdownParams,
    /// Normalisation of the profile part (ddof = 0).
    pub scale: ZScore,
    /// Intercept of log slowdown.
    pub intercept: f64,
    /// Coefficients of the normalised profile part, [`PROFILE_WIDTH`] of them.
    pub weights: Vec<f64>,
    /// Per-workload sensitivity: added to the workload's own log slowdown.
    pub sensitivity: BTreeMap<String, f64>,
    /// Per-workload pressure: added to each partner's log slowdown.
    pub pressure: BTreeMap<String, f64>,
    /// Per-workload ceiling on the predicted slowdown: the largest ratio measured for the
    /// workload in training, at least [`MAX_SLOWDOWN`]. Absent (a model stored before ceilings
    /// existed, or a workload never trained on): [`MAX_SLOWDOWN`].
    #[serde(default)]
    pub ceiling: BTreeMap<String, f64>,
    /// Per-workload spread of the fit: the root-mean-square residual of the workload's own
    /// log slowdowns in training. The gain rule asks a doubtful pair for a larger predicted
    /// gain ([`SlowdownModel::doubt`]). Empty in models stored before it existed.
    #[serde(default)]
    pub spread: Spreads,
    /// How many [`SlowdownModel::doubt`]s of predicted gain a group must show before the gain
    /// rule forms it (`κ`), chosen by cross-validation in training ([`crate::tuning`]). 0 in
    /// models stored before it existed, and straight after [`SlowdownModel::fit`].
    #[serde(default)]
    pub doubt_weight: f64,
    /// Each trained workload's log profile (those with kernel metrics), so that a new workload
    /// can find its nearest neighbours ([`SlowdownParams::neighbours`]) and a system-only
    /// profile its kernel metrics ([`KERNEL_FILL_NEIGHBOURS`]). Empty in models stored before
    /// it existed.
    #[serde(default)]
    pub profiles: BTreeMap<String, [f64; FEATURE_COUNT]>,
    /// How many [`SlowdownModel::doubt`]s of predicted gain a group with a workload the model
    /// never trained on (no observed group yet) must show, whatever the site's rules: a new
    /// workload is paired only where the model is confident the pair helps, is measured there,
    /// and is learnt from. Chosen by cross-validation in training with each workload held out
    /// in turn, its kernel metrics hidden ([`crate::tuning`]). 0 in models stored before it
    /// existed (a new workload then needs only a predicted gain).
    #[serde(default)]
    pub new_workload_weight: f64,
    /// Per-group corrections learnt from the group's own repeated observations on top of the
    /// model above ([`crate::training::repeats`]), keyed by [`group_key`]. Empty in models
    /// stored before they existed and in models trained without them; not written when empty,
    /// so such a model's stored form is what it was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub corrections: BTreeMap<String, Correction>,
}

/// A group's correction: for each member, in the order of the sorted workload names, the shift
/// added to its predicted log slowdown (after the workload's ceiling: it is learnt against the
/// capped prediction, and a measurement may lie above the ceiling) and the posterior standard deviation of that shift
/// (log units), which replaces the workload spreads in the group's doubt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correction {
    /// Shift of each member's log slowdown, in sorted-name order.
    pub shift: Vec<f64>,
    /// Posterior standard deviation of each shift.
    pub sd: Vec<f64>,
    /// Observations it was learnt from (after the window).
    pub count: usize,
}

/// The key of a group's correction: its workload names, sorted, joined by `|` (a character no
/// workload name may contain: `kace_layout`'s rule allows letters, digits and `._+-`).
pub fn group_key<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = names.into_iter().collect();
    v.sort_unstable();
    v.join("|")
}

/// The mean of `values` (parallel to `sorted`) over the positions where `sorted` holds `name`.
fn mean_for(sorted: &[&str], values: &[f64], name: &str) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for (w, v) in sorted.iter().zip(values) {
        if *w == name {
            sum += v;
            n += 1;
        }
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

fn profile_part(own: &LogProfile, others: &LogProfile, out: &mut [f64]) {
    for j in 0..FEATURE_COUNT {
        out[j] = own.0[j];
        out[FEATURE_COUNT + j] = others.0[j];
        out[2 * FEATURE_COUNT + j] = own.0[j] * others.0[j];
    }
}

/// The partners' combined profile (the group minus member `i`).
fn others_of(group: &[Profile], i: usize) -> Profile {
    Profile::new(combine(group.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, p)| p)))
}

fn residuals_of(rows: &[Vec<f64>], y: &[f64], intercept: f64, coef: &[f64]) -> Vec<f64> {
    rows.iter()
        .zip(y)
        .map(|(r, t)| t - intercept - r.iter().zip(coef).map(|(a, b)| a * b).sum::<f64>())
        .collect()
}

/// The median absolute deviation of residuals around their median, scaled to a standard
/// deviation under normal errors.
pub(crate) fn robust_scale(residuals: &[f64]) -> f64 {
    fn median(v: &mut [f64]) -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_unstable_by(f64::total_cmp);
        let m = v.len() / 2;
        if v.len() % 2 == 1 {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        }
    }
    let mut r = residuals.to_vec();
    let mid = median(&mut r);
    let mut dev: Vec<f64> = residuals.iter().map(|v| (v - mid).abs()).collect();
    1.4826 * median(&mut dev)
}

/// Ridge with the Huber loss, by iteratively reweighted closed-form solves: a sample whose
/// residual exceeds [`HUBER_K`] robust standard deviations gets weight `k·s / |r|`.
/// Returns the intercept, the coefficients and the final residuals.
fn huber_ridge(
    rows: &[Vec<f64>],
    y: &[f64],
    alpha: f64,
) -> Result<(f64, Vec<f64>, Vec<f64>), SelectorError> {
    let (mut b, mut c) = ridge_with_intercept(rows, y, alpha)?;
    let mut r = residuals_of(rows, y, b, &c);
    for _ in 0..HUBER_ITERATIONS {
        let s = robust_scale(&r);
        if s.is_nan() || s <= 1e-9 {
            break;
        }
        let cut = HUBER_K * s;
        let w: Vec<f64> =
            r.iter().map(|v| if v.abs() <= cut { 1.0 } else { cut / v.abs() }).collect();
        (b, c) = weighted_ridge_with_intercept(rows, y, &w, alpha)?;
        r = residuals_of(rows, y, b, &c);
    }
    Ok((b, c, r))
}

impl SlowdownModel {
    /// Fits on measured groups of any size k ≥ 2: one sample per member, target
    /// `ln(colocated / exclusive throughput)`.
    pub fn fit(groups: &[&Group], params: SlowdownParams) -> Result<SlowdownModel, SelectorError> {
        let mut names: Vec<&str> =
            groups.iter().flat_map(|g| g.workloads.iter().map(String::as_str)).collect();
        names.sort_unstable();
        names.dedup();
        let index = |w: &str| names.binary_search(&w).ok();
        let mut profile_rows: Vec<[f64; PROFILE_WIDTH]> = Vec::new();
        let mut owners: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut y = Vec::new();
        let mut own_ratio: Vec<(&str, f64)> = Vec::new();
        // Kernel metrics of trained workloads that have them: the donors for those that do not.
        let mut profiles: BTreeMap<String, [f64; FEATURE_COUNT]> = BTreeMap::new();
        for g in groups.iter().filter(|g| g.k() >= 2) {
            for (w, p) in g.workloads.iter().zip(&g.profiles) {
                if p.has_kernel_metrics {
                    profiles.entry(w.clone()).or_insert_with(|| LogProfile::of(p).0);
                }
            }
        }
        for g in groups {
            if g.k() < 2 {
                continue;
            }
            let filled: Vec<Profile> =
                g.profiles.iter().map(|p| fill_kernel_metrics(&profiles, p)).collect();
            for i in 0..g.k() {
                let excl = g.profiles[i].exclusive_throughput();
                let thr = g.throughputs[i];
                if !(excl > 0.0 && thr > 0.0) {
                    return Err(SelectorError::Invalid(format!(
                        "{} in group {:?}: throughputs must be > 0 (exclusive {excl}, colocated {thr})",
                        g.workloads[i], g.workloads
                    )));
                }
                let mut row = [0.0; PROFILE_WIDTH];
                let others = others_of(&filled, i);
                profile_part(&LogProfile::of(&filled[i]), &LogProfile::of(&others), &mut row);
                profile_rows.push(row);
                let own = index(&g.workloads[i]).unwrap_or(0);
                let partners =
                    (0..g.k()).filter(|j| *j != i).filter_map(|j| index(&g.workloads[j])).collect();
                owners.push((own, partners));
                y.push((thr / excl).ln());
                own_ratio.push((g.workloads[i].as_str(), thr / excl));
            }
        }
        if y.is_empty() {
            return Err(SelectorError::EmptyTrainingSet);
        }
        let scale = ZScore::fit(&profile_rows, PROFILE_WIDTH, 0);
        let w = names.len();
        let width = PROFILE_WIDTH + 2 * w;
        let rows: Vec<Vec<f64>> = profile_rows
            .iter()
            .zip(&owners)
            .map(|(r, (own, partners))| {
                let mut row = vec![0.0; width];
                scale.apply_into(r, &mut row[..PROFILE_WIDTH]);
                row[PROFILE_WIDTH + own] = params.workload_scale;
                for p in partners {
                    row[PROFILE_WIDTH + w + p] += params.workload_scale;
                }
                row
            })
            .collect();
        let (intercept, coef, residuals) = if params.robust {
            huber_ridge(&rows, &y, params.alpha)?
        } else {
            let (b, c) = ridge_with_intercept(&rows, &y, params.alpha)?;
            let r = residuals_of(&rows, &y, b, &c);
            (b, c, r)
        };
        // The ceilings and spreads come from the residuals, so that an absurd observation
        // neither lifts its workload's ceiling nor hides in an average.
        let cut = if params.robust {
            CEILING_OUTLIER_K * robust_scale(&residuals).max(1e-9)
        } else {
            f64::INFINITY
        };
        let mut ceiling: BTreeMap<String, f64> = BTreeMap::new();
        let mut sq: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for ((name, ratio), r) in own_ratio.iter().zip(&residuals) {
            let c = ceiling.entry(name.to_string()).or_insert(MAX_SLOWDOWN);
            if r.abs() <= cut {
                *c = c.max(*ratio);
            }
            let e = sq.entry(name.to_string()).or_insert((0.0, 0));
            e.0 += r * r;
            e.1 += 1;
        }
        let spread = sq.into_iter().map(|(w, (s, n))| (w, (s / n as f64).sqrt())).collect();
        let term = |offset: usize| -> BTreeMap<String, f64> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), coef[offset + i] * params.workload_scale))
                .collect()
        };
        Ok(SlowdownModel {
            params,
            scale,
            intercept,
            weights: coef[..PROFILE_WIDTH].to_vec(),
            sensitivity: term(PROFILE_WIDTH),
            pressure: term(PROFILE_WIDTH + w),
            ceiling,
            spread,
            doubt_weight: 0.0,
            profiles,
            new_workload_weight: 0.0,
            corrections: BTreeMap::new(),
        })
    }

    /// The correction learnt for the group of `members`, if any (every member must be named).
    pub fn correction(&self, members: &[Member<'_>]) -> Option<&Correction> {
        if self.corrections.is_empty() {
            return None;
        }
        let names: Option<Vec<&str>> = members.iter().map(|m| m.workload).collect();
        self.corrections.get(&group_key(names?))
    }

    /// [`SlowdownModel::shifts`] for a pair, with one allocation (the key): the prolog asks it
    /// of every candidate.
    fn pair_shifts(&self, a: Option<&str>, b: Option<&str>) -> Option<(f64, f64)> {
        if self.corrections.is_empty() {
            return None;
        }
        let (a, b) = (a?, b?);
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let c = self.corrections.get(&format!("{lo}|{hi}"))?;
        let (s_lo, s_hi) = (*c.shift.first()?, *c.shift.get(1)?);
        if a == b {
            let m = (s_lo + s_hi) / 2.0;
            return Some((m, m));
        }
        Some(if a == lo { (s_lo, s_hi) } else { (s_hi, s_lo) })
    }

    /// The shift of each member's log slowdown from the group's correction (zeros without one).
    /// Members with the same workload get the mean of that workload's shifts, so a self group's
    /// members are treated alike whatever their order.
    fn shifts(&self, names: &[Option<&str>]) -> Option<Vec<f64>> {
        if self.corrections.is_empty() {
            return None;
        }
        let named: Vec<&str> = names.iter().copied().collect::<Option<Vec<&str>>>()?;
        let c = self.corrections.get(&group_key(named.iter().copied()))?;
        let mut sorted = named.clone();
        sorted.sort_unstable();
        Some(named.iter().map(|w| mean_for(&sorted, &c.shift, w)).collect())
    }

    /// Whether the model was trained on groups with `workload` in them.
    pub fn knows(&self, workload: Option<&str>) -> bool {
        workload.is_some_and(|w| self.sensitivity.contains_key(w))
    }

    /// The predicted gain in normalised progress a group with a workload the model never
    /// trained on must show ([`SlowdownModel::new_workload_weight`] ×
    /// [`SlowdownModel::doubt`]); `None` when it knows every member.
    pub fn new_workload_gain(&self, members: &[Member<'_>]) -> Option<f64> {
        members
            .iter()
            .any(|m| !self.knows(m.workload))
            .then(|| self.new_workload_weight * self.doubt(members))
    }

    /// The profile the model predicts from: as measured, or, without kernel metrics, with
    /// those of the trained workloads nearest in system-profile space.
    pub fn completed(&self, profile: &Profile) -> Profile {
        fill_kernel_metrics(&self.profiles, profile)
    }

    /// The predicted gain in normalised progress a group needs before the gain rule forms it:
    /// [`SlowdownModel::doubt_weight`] × [`SlowdownModel::doubt`].
    pub fn required_gain(&self, members: &[Member<'_>]) -> f64 {
        self.doubt_weight * self.doubt(members)
    }

    /// How doubtful the model is about a group: the root-sum-square of its members' spreads
    /// (log units; a workload never trained on gets the largest spread the model has).
    /// A group with a correction ([`SlowdownModel::corrections`]) is doubted by its
    /// correction's posterior standard deviations instead: its own observations, not the
    /// workloads' average fit, say how well it is known.
    pub fn doubt(&self, members: &[Member<'_>]) -> f64 {
        if let Some(c) = self.correction(members) {
            return c.sd.iter().map(|s| s * s).sum::<f64>().sqrt();
        }
        members
            .iter()
            .map(|m| m.workload.and_then(|w| self.spread.get(w)).unwrap_or(self.spread.widest()))
            .map(|s| s * s)
            .sum::<f64>()
            .sqrt()
    }

    /// Predicted log slowdown of a job with log profile `own` beside partners whose combined
    /// profile has log transform `others`, before the workload's ceiling is applied.
    /// `terms` is the job's sensitivity plus its partners' pressures ([`SlowdownModel::terms`]).
    #[inline]
    pub fn log_slowdown(&self, own: &LogProfile, others: &LogProfile, terms: f64) -> f64 {
        let mut part = [0.0; PROFILE_WIDTH];
        profile_part(own, others, &mut part);
        let mut acc = self.intercept + terms;
        for (j, (w, v)) in self.weights.iter().zip(part).enumerate() {
            acc += w * self.scale.apply_one(j, v);
        }
        acc
    }

    /// A workload's (sensitivity, pressure): learnt when it was trained on, borrowed from its
    /// nearest trained neighbours in profile space when not (and the model asks for that), or 0.
    /// `kernel_measured`: whether `profile`'s kernel metrics were measured; filled ones do not
    /// count towards the distance.
    pub fn terms(
        &self,
        workload: Option<&str>,
        profile: &LogProfile,
        kernel_measured: bool,
    ) -> (f64, f64) {
        if let Some(w) = workload {
            if let (Some(s), Some(p)) = (self.sensitivity.get(w), self.pressure.get(w)) {
                return (*s, *p);
            }
        }
        let k = self.params.neighbours.min(self.profiles.len());
        if k == 0 {
            return (0.0, 0.0);
        }
        // Distance on the z-scored own-profile columns, the model's own normalisation.
        let z = |v: &[f64; FEATURE_COUNT], j: usize| self.scale.apply_one(j, v[j]);
        let mut near: Vec<(f64, &str)> = self
            .profiles
            .iter()
            .map(|(n, p)| {
                let d = (0..FEATURE_COUNT)
                    .filter(|&j| kernel_measured || !Feature::ALL[j].is_kernel_metric())
                    .map(|j| (z(p, j) - z(&profile.0, j)).powi(2))
                    .sum();
                (d, n.as_str())
            })
            .collect();
        near.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        let (mut s, mut p) = (0.0, 0.0);
        for (_, n) in &near[..k] {
            s += self.sensitivity.get(*n).copied().unwrap_or(0.0);
            p += self.pressure.get(*n).copied().unwrap_or(0.0);
        }
        (s / k as f64, p / k as f64)
    }

    /// Each member's predicted slowdown (colocated / exclusive throughput) in a group.
    pub fn slowdowns(&self, members: &[Member<'_>]) -> Vec<f64> {
        // Pairs are the prolog's case: a partner's combined profile is its own, so each log
        // profile is computed once.
        if let [a, b] = members {
            if a.profile.has_kernel_metrics && b.profile.has_kernel_metrics {
                let (la, lb) = (LogProfile::of(a.profile), LogProfile::of(b.profile));
                let (sa, sb) = self.pair_slowdowns((&la, a.workload), (&lb, b.workload));
                return vec![sa, sb];
            }
        }
        self.slowdowns_any_k(members)
    }

    /// [`SlowdownModel::slowdowns`] for any group size, without the pair shortcut.
    fn slowdowns_any_k(&self, members: &[Member<'_>]) -> Vec<f64> {
        let profiles: Vec<Profile> = members.iter().map(|m| self.completed(m.profile)).collect();
        let logs: Vec<LogProfile> = profiles.iter().map(LogProfile::of).collect();
        let terms: Vec<(f64, f64)> = members
            .iter()
            .zip(&logs)
            .map(|(m, l)| self.terms(m.workload, l, m.profile.has_kernel_metrics))
            .collect();
        let names: Vec<Option<&str>> = members.iter().map(|m| m.workload).collect();
        let shifts = self.shifts(&names);
        (0..members.len())
            .map(|i| {
                let others = LogProfile::of(&others_of(&profiles, i));
                let pressure: f64 =
                    terms.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, t)| t.1).sum();
                let own_name = members[i].workload;
                let shift = shifts.as_ref().map_or(0.0, |s| s[i]);
                let log = self.log_slowdown(&logs[i], &others, terms[i].0 + pressure);
                self.capped(log, own_name) * shift.exp()
            })
            .collect()
    }

    /// Predicted throughput sum of a group (steps per second).
    pub fn throughput_sum(&self, members: &[Member<'_>]) -> f64 {
        self.sum_and_progress(members).0
    }

    /// Predicted throughput sum and normalised progress of a group, from one prediction of its
    /// slowdowns (what a choice asks of every candidate).
    pub fn sum_and_progress(&self, members: &[Member<'_>]) -> (f64, f64) {
        let s = self.slowdowns(members);
        let sum = s.iter().zip(members).map(|(s, m)| s * m.profile.exclusive_throughput()).sum();
        (sum, s.iter().sum())
    }

    /// Predicted normalised progress of a group (Σ slowdowns).
    pub fn normalised_progress(&self, members: &[Member<'_>]) -> f64 {
        self.slowdowns(members).iter().sum()
    }

    /// Fast path for pairs: the predicted (lead, candidate) slowdowns from precomputed log
    /// profiles with measured kernel metrics. Equivalent to [`SlowdownModel::slowdowns`] on a
    /// pair.
    #[inline]
    pub fn pair_slowdowns(
        &self,
        lead: (&LogProfile, Option<&str>),
        cand: (&LogProfile, Option<&str>),
    ) -> (f64, f64) {
        let (lt, ct) = (self.terms(lead.1, lead.0, true), self.terms(cand.1, cand.0, true));
        let a = self.capped(self.log_slowdown(lead.0, cand.0, lt.0 + ct.1), lead.1);
        let b = self.capped(self.log_slowdown(cand.0, lead.0, ct.0 + lt.1), cand.1);
        // A correction is learnt against the capped prediction, so it applies after the cap.
        match self.pair_shifts(lead.1, cand.1) {
            Some((sa, sb)) => (a * sa.exp(), b * sb.exp()),
            None => (a, b),
        }
    }

    /// The ceiling on a workload's predicted slowdown.
    pub fn ceiling_of(&self, workload: Option<&str>) -> f64 {
        workload.and_then(|w| self.ceiling.get(w)).copied().unwrap_or(MAX_SLOWDOWN)
    }

    /// A slowdown from its predicted logarithm, at most the workload's ceiling.
    #[inline]
    fn capped(&self, log_slowdown: f64, workload: Option<&str>) -> f64 {
        log_slowdown.exp().min(self.ceiling_of(workload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Feature;

    fn prof(excl: f64, sm: f64) -> Profile {
        crate::features::test_profile(excl, sm)
    }

    /// Synthetic truth: a job slows down by its partner's SM utilisation.
    fn group(a: (&str, Profile), b: (&str, Profile)) -> Group {
        let slow = |p: &Profile| 1.0 / (1.0 + p.get(Feature::SmUtil) / 100.0);
        Group {
            workloads: vec![a.0.into(), b.0.into()],
            throughputs: vec![
                a.1.exclusive_throughput() * slow(&b.1),
                b.1.exclusive_throughput() * slow(&a.1),
            ],
            profiles: vec![a.1, b.1],
        }
    }

    /// Eight workloads (exclusive throughput and SM % rising together) and every pair of them.
    fn eight_workloads_paired() -> (Vec<(String, Profile)>, Vec<Group>) {
        let ws: Vec<(String, Profile)> = (0..8)
            .map(|i| (format!("w{i}"), prof(10.0 + 5.0 * i as f64, 10.0 + 11.0 * i as f64)))
            .collect();
        let mut groups = Vec::new();
        for i in 0..8 {
            for j in (i + 1)..8 {
                groups.push(group((&ws[i].0, ws[i].1), (&ws[j].0, ws[j].1)));
            }
        }
        (ws, groups)
    }

    #[test]
    fn learns_partner_driven_slowdown_and_ranks_partners() {
        let (ws, groups) = eight_workloads_paired();
        let refs: Vec<&Group> = groups.iter().collect();
        let m = SlowdownModel::fit(
            &refs,
            SlowdownParams { alpha: 1e-3, workload_scale: 1.0, robust: false, neighbours: 0 },
        )
        .unwrap();
        for g in &groups {
            let members = g.members();
            let pred = m.throughput_sum(&members);
            assert!((pred - g.total_throughput()).abs() / g.total_throughput() < 0.02);
            let (a, b) = m.pair_slowdowns(
                (&LogProfile::of(&g.profiles[0]), Some(&g.workloads[0])),
                (&LogProfile::of(&g.profiles[1]), Some(&g.workloads[1])),
            );
            let s = m.slowdowns_any_k(&members);
            assert!((a - s[0]).abs() < 1e-12 && (b - s[1]).abs() < 1e-12);
            assert_eq!(m.slowdowns(&members), vec![a, b]);
            assert!((m.normalised_progress(&members) - (a + b)).abs() < 1e-12);
            assert_eq!(m.sum_and_progress(&members), (pred, m.normalised_progress(&members)));
        }
        // An unseen workload still gets a profile-based prediction.
        let new = prof(30.0, 50.0);
        let members = [
            Member { profile: &ws[0].1, workload: Some("w0") },
            Member { profile: &new, workload: Some("never-seen") },
        ];
        let s = m.slowdowns(&members);
        assert!(s.iter().all(|v| v.is_finite() && *v > 0.0 && *v < 1.5), "{s:?}");
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<SlowdownModel>(&json).unwrap(), m);
    }

    /// A correction shifts each member's log slowdown after its ceiling, the same on the
    /// prolog's pair path and the general one, whatever the order of the members.
    #[test]
    fn a_correction_shifts_its_group_alike_on_every_path() {
        let (ws, groups) = eight_workloads_paired();
        let refs: Vec<&Group> = groups.iter().collect();
        let mut m = SlowdownModel::fit(&refs, SlowdownParams::default()).unwrap();
        let plain = m.clone();
        let (sa, sb) = (-0.3, 0.1);
        m.corrections.insert(
            group_key(["w1", "w4"]),
            Correction { shift: vec![sa, sb], sd: vec![0.01, 0.02], count: 2 },
        );
        m.corrections.insert(
            group_key(["w2", "w2"]),
            Correction { shift: vec![0.2, 0.2], sd: vec![0.01, 0.01], count: 3 },
        );
        let member = |i: usize| Member { profile: &ws[i].1, workload: Some(ws[i].0.as_str()) };
        for (i, j, want) in
            [(1, 4, (sa, sb)), (4, 1, (sb, sa)), (2, 2, (0.2, 0.2)), (0, 3, (0.0, 0.0))]
        {
            let members = [member(i), member(j)];
            let before = plain.slowdowns_any_k(&members);
            let general = m.slowdowns_any_k(&members);
            let pair = m.slowdowns(&members);
            assert!((general[0] - before[0] * want.0.exp()).abs() < 1e-12, "{i} {j}");
            assert!((general[1] - before[1] * want.1.exp()).abs() < 1e-12, "{i} {j}");
            assert!((pair[0] - general[0]).abs() < 1e-12 && (pair[1] - general[1]).abs() < 1e-12);
        }
        let corrected = [member(4), member(1)];
        assert!((m.doubt(&corrected) - (0.01f64.powi(2) + 0.02f64.powi(2)).sqrt()).abs() < 1e-15);
        assert_eq!(m.doubt(&[member(0), member(3)]), plain.doubt(&[member(0), member(3)]));
    }

    #[test]
    fn predicted_slowdowns_stay_under_each_workloads_ceiling() {
        let ws: Vec<(String, Profile)> = (0..6)
            .map(|i| (format!("w{i}"), prof(10.0 + i as f64, 1.0 + 2.0 * i as f64)))
            .collect();
        let mut groups = Vec::new();
        for i in 0..6 {
            for j in (i + 1)..6 {
                groups.push(group((&ws[i].0, ws[i].1), (&ws[j].0, ws[j].1)));
            }
        }
        // w0 was measured up to 1.5× faster beside a partner than "alone" (its exclusive
        // throughput was measured low); nobody else ran faster than alone.
        for g in &mut groups {
            for (k, t) in g.throughputs.iter_mut().enumerate() {
                if g.workloads[k] == "w0" {
                    *t = 1.5 * g.profiles[k].exclusive_throughput();
                }
            }
        }
        let refs: Vec<&Group> = groups.iter().collect();
        let p = SlowdownParams { alpha: 1e-3, workload_scale: 1.0, robust: false, neighbours: 0 };
        let mut m = SlowdownModel::fit(&refs, p).unwrap();
        assert!((m.ceiling["w0"] - 1.5).abs() < 1e-12);
        assert!(m.ceiling.iter().filter(|(w, _)| *w != "w0").all(|(_, c)| *c == MAX_SLOWDOWN));
        assert_eq!(m.ceiling_of(Some("never-seen")), MAX_SLOWDOWN);
        assert_eq!(m.ceiling_of(None), MAX_SLOWDOWN);
        // A model that predicts "faster than alone" for everyone still stays under the ceilings.
        m.intercept += 2.0;
        for g in &groups {
            let members = g.members();
            let (a, b) = (LogProfile::of(&g.profiles[0]), LogProfile::of(&g.profiles[1]));
            let terms = m.terms(Some(&g.workloads[0]), &a, true).0
                + m.terms(Some(&g.workloads[1]), &b, true).1;
            assert!(m.log_slowdown(&a, &b, terms) > 0.5);
            let want: Vec<f64> = g.workloads.iter().map(|w| m.ceiling_of(Some(w))).collect();
            assert_eq!(m.slowdowns(&members), want);
            assert_eq!(m.slowdowns_any_k(&members), want);
            assert!((m.normalised_progress(&members) - want.iter().sum::<f64>()).abs() < 1e-12);
        }
        // A stored model's ceilings are checked when it is read back.
        let mut stored = crate::model::Model::Slowdown(m.clone());
        assert_eq!(stored.check(), Ok(()));
        for bad in [0.5, f64::NAN] {
            if let crate::model::Model::Slowdown(sm) = &mut stored {
                sm.ceiling.insert("w1".into(), bad);
            }
            assert!(stored.check().unwrap_err().contains("ceiling"), "{bad}");
        }
        // So are its spreads, doubt weight and profiles.
        for (what, edit) in [
            (
                "spread",
                Box::new(|m: &mut SlowdownModel| {
                    m.spread = [("w1".to_string(), -1.0)].into_iter().collect();
                }) as Box<dyn Fn(&mut SlowdownModel)>,
            ),
            ("doubt weight", Box::new(|m: &mut SlowdownModel| m.doubt_weight = f64::NAN)),
            ("new-workload weight", Box::new(|m: &mut SlowdownModel| m.new_workload_weight = -1.0)),
            (
                "profile",
                Box::new(|m: &mut SlowdownModel| {
                    m.profiles.insert("w1".into(), [f64::INFINITY; FEATURE_COUNT]);
                }),
            ),
        ] {
            let mut sm = m.clone();
            edit(&mut sm);
            let err = crate::model::Model::Slowdown(sm).check().unwrap_err();
            assert!(err.contains(what), "{what}: {err}");
        }
        // A model stored before ceilings existed reads back with the flat ceiling.
        let mut json = serde_json::to_value(&m).unwrap();
        json.as_object_mut().unwrap().remove("ceiling");
        let old: SlowdownModel = serde_json::from_value(json).unwrap();
        assert_eq!(old.ceiling_of(Some("w0")), MAX_SLOWDOWN);
    }

    #[test]
    fn spreads_are_stored_as_a_plain_map_and_read_back_with_their_widest() {
        let spreads: Spreads =
            [("a".to_string(), 0.2), ("b".to_string(), 0.7)].into_iter().collect();
        assert_eq!(spreads.widest(), 0.7);
        let json = serde_json::to_value(&spreads).unwrap();
        assert_eq!(json, serde_json::json!({"a": 0.2, "b": 0.7}));
        let back: Spreads = serde_json::from_value(json).unwrap();
        assert_eq!((back.get("b"), back.widest()), (Some(0.7), 0.7));
        assert_eq!(back, spreads);
        assert_eq!(Spreads::default().widest(), 0.0);
        // A new workload is as doubtful as the most doubtful trained one; a known one, itself.
        let (ws, groups) = eight_workloads_paired();
        let m = SlowdownModel::fit(&groups.iter().collect::<Vec<_>>(), SlowdownParams::default())
            .unwrap();
        let widest = m.spread.iter().map(|(_, s)| s).fold(0.0, f64::max);
        assert!(widest > 0.0 && m.spread.widest() == widest);
        let alone = |w| [Member { profile: &ws[0].1, workload: Some(w) }];
        assert_eq!(m.doubt(&alone("never-seen")), widest);
        assert_eq!(m.doubt(&alone("w0")), m.spread.get("w0").unwrap());
    }

    #[test]
    fn one_absurd_observation_cannot_dominate_the_robust_fit() {
        let (_, clean) = eight_workloads_paired();
        // One finite but absurd rate: w3 beside w5 "ran" a million times faster than alone.
        let mut dirty = clean.clone();
        let bad = dirty.iter().position(|g| g.workloads == ["w3", "w5"]).unwrap();
        dirty[bad].throughputs[0] *= 1e6;
        fn refs(g: &[Group]) -> Vec<&Group> {
            g.iter().collect()
        }
        let sums = |m: &SlowdownModel| -> Vec<f64> {
            clean
                .iter()
                .map(|g| {
                    let members = g.members();
                    m.normalised_progress(&members)
                })
                .collect()
        };
        let worst_shift = |params: SlowdownParams| -> (f64, SlowdownModel) {
            let a = sums(&SlowdownModel::fit(&refs(&clean), params).unwrap());
            let m = SlowdownModel::fit(&refs(&dirty), params).unwrap();
            let b = sums(&m);
            (a.iter().zip(&b).map(|(x, y)| (x - y).abs() / x).fold(0.0, f64::max), m)
        };
        let robust = SlowdownParams { alpha: 0.1, ..SlowdownParams::default() };
        let (shift, m) = worst_shift(robust);
        assert!(shift < 0.05, "the robust fit moved a prediction by {shift}");
        assert!(m.ceiling_of(Some("w3")) < 2.0, "the outlier lifted w3's ceiling");
        assert!(m.spread.get("w3") > m.spread.get("w0"), "the outlier shows up as doubt about w3");
        let (plain, m) = worst_shift(SlowdownParams { robust: false, ..robust });
        assert!(plain > 4.0 * shift, "squared error: {plain} vs robust {shift}");
        assert!(m.ceiling_of(Some("w3")) > 1e5, "without the robust fit the ceiling follows it");
    }

    #[test]
    fn a_system_only_profile_is_predicted_from_its_nearest_trained_workloads() {
        let (ws, groups) = eight_workloads_paired();
        // Kernel metrics that differ per workload (the fixture's are all 1).
        let kernel = |i: usize, p: Profile| {
            let mut p = p;
            for f in Feature::KERNEL {
                p.features[f.index()] = 100.0 * (i + 1) as f64;
            }
            p
        };
        let ws: Vec<(String, Profile)> =
            ws.into_iter().enumerate().map(|(i, (w, p))| (w, kernel(i, p))).collect();
        let groups: Vec<Group> = groups
            .into_iter()
            .map(|mut g| {
                for (w, p) in g.workloads.iter().zip(g.profiles.iter_mut()) {
                    *p = ws.iter().find(|(n, _)| n == w).unwrap().1;
                }
                g
            })
            .collect();
        // w4 is new: trained without its groups.
        let train: Vec<&Group> = groups.iter().filter(|g| !g.contains("w4")).collect();
        let m = SlowdownModel::fit(&train, SlowdownParams::default()).unwrap();
        assert!(!m.knows(Some("w4")) && m.knows(Some("w3")));
        let full = ws[4].1;
        let sys = full.system_only();
        // Its kernel metrics come from w3, w5 and one of w2/w6 (nearest in SM %, throughput).
        let filled = m.completed(&sys);
        assert_ne!(filled.features, sys.features);
        let t = filled.get(Feature::Threads);
        assert!(t > 300.0 && t < 700.0, "filled threads {t}");
        assert_eq!(filled.memcap(), full.memcap());
        for partner in [0, 3, 7] {
            let with = |p: &Profile| {
                let members = [
                    Member { profile: &ws[partner].1, workload: Some(ws[partner].0.as_str()) },
                    Member { profile: p, workload: Some("w4") },
                ];
                m.slowdowns(&members)
            };
            let (a, b) = (with(&full), with(&sys));
            assert!(b.iter().all(|v| v.is_finite() && *v > 0.0), "{b:?}");
            assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 0.1), "{a:?} vs {b:?}");
            // Any group size takes the same path.
            let triple = [
                Member { profile: &ws[partner].1, workload: Some(ws[partner].0.as_str()) },
                Member { profile: &sys, workload: Some("w4") },
                Member { profile: &ws[1].1, workload: Some("w1") },
            ];
            assert!(m.slowdowns(&triple).iter().all(|v| v.is_finite() && *v > 0.0));
        }
        // A new workload's groups ask for the new-workload margin; known ones do not.
        let mut m = m;
        m.new_workload_weight = 2.0;
        let known = [
            Member { profile: &ws[0].1, workload: Some("w0") },
            Member { profile: &ws[1].1, workload: Some("w1") },
        ];
        assert_eq!(m.new_workload_gain(&known), None);
        let new = [known[0], Member { profile: &sys, workload: Some("w4") }];
        let gain = m.new_workload_gain(&new).unwrap();
        assert!((gain - 2.0 * m.doubt(&new)).abs() < 1e-12 && gain > 0.0);
        // The paper's model has no answer without kernel metrics.
        let lr = crate::model::Model::train(
            crate::model::ModelKind::Linear,
            &train,
            crate::policy::Objective::ThroughputSum,
            SlowdownParams::default(),
        )
        .unwrap();
        use crate::selection::Predictor;
        assert!(lr.predict(&new, crate::policy::Objective::ThroughputSum).is_nan());
        assert!(lr.predict(&known, crate::policy::Objective::ThroughputSum).is_finite());
    }

    #[test]
    fn a_site_with_only_system_profiles_trains_on_what_it_has() {
        let (_, groups) = eight_workloads_paired();
        let sys: Vec<Group> = groups
            .iter()
            .map(|g| Group {
                profiles: g.profiles.iter().map(Profile::system_only).collect(),
                ..g.clone()
            })
            .collect();
        let refs: Vec<&Group> = sys.iter().collect();
        let m = SlowdownModel::fit(&refs, SlowdownParams::default()).unwrap();
        assert!(m.profiles.is_empty(), "no donors of kernel metrics");
        for g in &sys {
            let members = g.members();
            let pred = m.normalised_progress(&members);
            assert!((pred - g.normalised_progress()).abs() < 0.1, "{pred} vs measured");
        }
    }

    #[test]
    fn rejects_bad_training_data() {
        let mut g = group(("a", prof(10.0, 10.0)), ("b", prof(20.0, 20.0)));
        g.throughputs[1] = 0.0;
        assert!(matches!(
            SlowdownModel::fit(&[&g], SlowdownParams::default()),
            Err(SelectorError::Invalid(_))
        ));
        assert!(matches!(
            SlowdownModel::fit(&[], SlowdownParams::default()),
            Err(SelectorError::EmptyTrainingSet)
        ));
    }
}
