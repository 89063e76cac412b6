//! A site's repeated observations of the same group: merged into sufficient statistics (count,
//! mean and spread of each member's log slowdown), aged by a window, and the per-group
//! correction learnt from them on top of the global model (empirical Bayes, shrunk toward zero
//! by the repeat noise; `docs/models.md`, *Learning from a site's history*).
//!
//! Why merge: one group's repeats share that group's own interference, which no profile
//! feature explains (the model fitted on all 181 measured pairs still misses them by 9 %
//! in-sample, while a repeat differs by 1–2 %). Counted as independent points they let a
//! popular pair outweigh the rest and leak across cross-validation folds; merged, the global
//! model weighs each distinct group once and its cost grows with distinct groups, not rows.
//!
//! Who may move a correction: observations from one user alone could be forged (the re-audit's
//! H1), so a group's correction is learnt only when it is *corroborated*: some observation is
//! trusted (an admin imported or marked it), or the observations come from at least
//! [`MIN_USERS`] different users. The same user on several days does not corroborate: one user
//! can write progress lines on any number of days. An uncorroborated group still trains the
//! global model (capped per user by the store, as before), with weight zero in its correction;
//! and since trusted and untrusted observations are merged apart, one user's reports of a pair
//! an admin imported do not move that pair's trusted correction either.

use std::collections::{BTreeMap, BTreeSet};

use crate::dataset::Group;
use crate::slowdown::{group_key, Correction, SlowdownModel};

/// How many different users must have observed a group before its correction counts (unless an
/// observation is trusted).
pub const MIN_USERS: usize = 2;

/// Observations older than this many days before the newest one are not used: a workload's
/// code, drivers and inputs change, and what a pair did a season ago says less than what it
/// does now. Observations without a day are always kept.
pub const WINDOW_DAYS: i64 = 90;

/// The repeat noise (standard deviation of one observation's log slowdown around its group's
/// mean) assumed while no corroborated group has been observed twice: the measured size
/// (self-pair twins 1.7 %, exclusive runs on two days 1.2 %; `docs/models.md`).
pub const DEFAULT_REPEAT_NOISE: f64 = 0.02;

/// The smallest repeat noise used, whatever a few repeats suggest: two nearly equal
/// observations must not make a correction certain.
pub const MIN_REPEAT_NOISE: f64 = 0.01;

/// Fewest corroborated groups from which the spread of true group effects (τ) is estimated;
/// with fewer, no correction is learnt.
pub const MIN_CORRECTED_GROUPS: usize = 3;

/// What the store knows of one observation beside its group: who observed it, whether it is
/// trusted, and on which day.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Evidence {
    /// The users of the observation's jobs (known ones; empty: unknown).
    pub users: Vec<String>,
    /// Whether an admin imported or marked it.
    pub trusted: bool,
    /// The day it was observed (days since any fixed origin), when known.
    pub day: Option<i64>,
}

/// The merged observations of one group: its representative (the first observation's member
/// order and profiles, the mean log slowdown per member as throughput), how many observations,
/// their mean and spread per member, and who observed them.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupStats {
    /// The group as training sees it. With one observation it is that observation verbatim;
    /// with several, each member's throughput is its exclusive throughput × exp(mean log
    /// slowdown).
    pub group: Group,
    /// Observations merged.
    pub count: usize,
    /// Per member (in the representative's order): mean of ln(colocated / exclusive).
    pub mean_log: Vec<f64>,
    /// Per member: sum of squared deviations from the mean (Welford's M2).
    pub m2: Vec<f64>,
    /// The known users that observed it.
    pub users: BTreeSet<String>,
    /// Whether its observations are trusted (trusted and untrusted ones are kept apart, so that
    /// the trusted reference is one that no job's progress lines change).
    pub trusted: bool,
    /// The indices of its observations in the input.
    pub inputs: Vec<usize>,
}

impl GroupStats {
    /// Whether its correction may count: trusted, or seen by [`MIN_USERS`] users.
    pub fn corroborated(&self) -> bool {
        self.trusted || self.users.len() >= MIN_USERS
    }
}

/// Observations merged into groups.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Merged {
    /// One entry per distinct (workload combination, trusted) in order of first appearance.
    pub stats: Vec<GroupStats>,
    /// Observations left out by the window ([`WINDOW_DAYS`]).
    pub aged: usize,
    /// Observations in.
    pub observations: usize,
}

/// Merges `groups` (one observation each, `evidence` parallel to them when known: without it,
/// each counts as trusted, the caller vouching for its data) into sufficient statistics.
/// Observations with a non-positive throughput are not merged: training rejects them anyway,
/// so each stays its own group (and fails training as it did before). O(rows · k log k).
pub fn merge(groups: &[Group], evidence: Option<&[Evidence]>) -> Merged {
    let newest = evidence.and_then(|e| e.iter().filter_map(|x| x.day).max());
    let mut at: BTreeMap<(String, bool), usize> = BTreeMap::new();
    let mut out = Merged { observations: groups.len(), ..Merged::default() };
    for (i, g) in groups.iter().enumerate() {
        let ev = evidence.and_then(|e| e.get(i));
        if let (Some(day), Some(newest)) = (ev.and_then(|e| e.day), newest) {
            if day < newest - WINDOW_DAYS {
                out.aged += 1;
                continue;
            }
        }
        let trusted = ev.is_none_or(|e| e.trusted);
        let logs: Option<Vec<f64>> = g
            .throughputs
            .iter()
            .zip(&g.profiles)
            .map(|(t, p)| {
                let r = t / p.exclusive_throughput();
                (r.is_finite() && r > 0.0).then(|| r.ln())
            })
            .collect();
        let users = || ev.map(|e| e.users.iter().cloned().collect()).unwrap_or_default();
        let Some(logs) = logs else {
            // Kept apart and verbatim: training reports it as invalid data.
            out.stats.push(GroupStats {
                group: g.clone(),
                count: 1,
                mean_log: vec![f64::NAN; g.k()],
                m2: vec![0.0; g.k()],
                users: users(),
                trusted,
                inputs: vec![i],
            });
            continue;
        };
        let key = (group_key(g.workloads.iter().map(String::as_str)), trusted);
        match at.get(&key) {
            None => {
                at.insert(key, out.stats.len());
                out.stats.push(GroupStats {
                    group: g.clone(),
                    count: 1,
                    mean_log: logs,
                    m2: vec![0.0; g.k()],
                    users: users(),
                    trusted,
                    inputs: vec![i],
                });
            }
            Some(&s) => {
                let st = &mut out.stats[s];
                let order = align(&st.group.workloads, &g.workloads);
                st.count += 1;
                let n = st.count as f64;
                for (slot, &from) in order.iter().enumerate() {
                    let x = logs[from];
                    let delta = x - st.mean_log[slot];
                    st.mean_log[slot] += delta / n;
                    st.m2[slot] += delta * (x - st.mean_log[slot]);
                }
                st.users.extend(users());
                st.inputs.push(i);
            }
        }
    }
    for st in &mut out.stats {
        if st.count > 1 {
            let g = &mut st.group;
            for (j, t) in g.throughputs.iter_mut().enumerate() {
                *t = g.profiles[j].exclusive_throughput() * st.mean_log[j].exp();
            }
        }
    }
    out
}

/// For each slot of `reference`, the position in `other` of the same workload (both hold the
/// same names, in any order; equal names are matched in order).
fn align(reference: &[String], other: &[String]) -> Vec<usize> {
    let mut used = vec![false; other.len()];
    reference
        .iter()
        .enumerate()
        .map(|(slot, w)| {
            let found = (0..other.len()).find(|&j| !used[j] && &other[j] == w).unwrap_or(slot);
            if let Some(u) = used.get_mut(found) {
                *u = true;
            }
            found
        })
        .collect()
}

/// What learning the corrections found.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CorrectionSummary {
    /// Groups given a correction.
    pub corrected: usize,
    /// Merged groups (a combination's trusted or untrusted observations) not corroborated:
    /// weight zero.
    pub uncorroborated: usize,
    /// The repeat noise used (σ, log units).
    pub repeat_noise: f64,
    /// The spread of true group effects around the global model (τ, log units).
    pub between: f64,
}

/// Learns each corroborated group's correction on top of `model` from `stats` (the merged
/// observations the model was fitted on) and stores them in the model.
///
/// The hierarchical model: observation k of group g, member j, has log slowdown
/// `ŷ_gj + δ_gj + ε`, with `ŷ` the global model's prediction, the group's own effect
/// `δ_gj ~ N(0, τ²)` and repeat noise `ε ~ N(0, σ²)`. σ² is pooled from the groups' repeats
/// (at least [`MIN_REPEAT_NOISE`]², [`DEFAULT_REPEAT_NOISE`]² without repeats), τ² is the
/// method-of-moments estimate `mean(r̄² − σ²/n)` over corroborated groups (r̄: mean residual).
/// The posterior mean of δ is `b · r̄` with `b = τ² / (τ² + σ²/n)`, its variance `b · σ²/n`:
/// a group seen once is pulled most of the way to its measurement when τ ≫ σ, and every
/// further repeat narrows it. Returns what it found.
pub fn learn_corrections(model: &mut SlowdownModel, stats: &[GroupStats]) -> CorrectionSummary {
    model.corrections.clear();
    // Pool each workload combination's statistics (trusted and untrusted kept apart above).
    let mut pooled: BTreeMap<String, Pool> = BTreeMap::new();
    // Only corroborated parts are pooled: one user's untrusted observations of a combination an
    // admin also imported must not move the trusted correction (they are merged apart, so each
    // part is judged on its own).
    let mut uncorroborated = 0usize;
    for st in stats {
        if st.mean_log.iter().any(|v| !v.is_finite()) || st.group.k() < 2 {
            continue;
        }
        if !st.corroborated() {
            uncorroborated += 1;
            continue;
        }
        let key = group_key(st.group.workloads.iter().map(String::as_str));
        let mut names: Vec<(&str, usize)> =
            st.group.workloads.iter().enumerate().map(|(j, w)| (w.as_str(), j)).collect();
        names.sort_unstable();
        let members = st.group.members();
        let predicted: Vec<f64> = model.slowdowns(&members).iter().map(|s| s.ln()).collect();
        let p = pooled.entry(key).or_insert_with(|| Pool::new(names.len()));
        for (slot, &(_, j)) in names.iter().enumerate() {
            p.add(slot, st.count, st.mean_log[j], st.m2[j], predicted[j]);
        }
        p.count += st.count;
    }
    let (mut within, mut dof) = (0.0, 0usize);
    let corroborated: Vec<(&String, &Pool)> = pooled.iter().collect();
    for (_, p) in &corroborated {
        within += p.m2.iter().sum::<f64>();
        dof += p.m2.len() * p.count.saturating_sub(1);
    }
    let sigma2 = if dof == 0 {
        DEFAULT_REPEAT_NOISE * DEFAULT_REPEAT_NOISE
    } else {
        (within / dof as f64).max(MIN_REPEAT_NOISE * MIN_REPEAT_NOISE)
    };
    let mut summary = CorrectionSummary {
        uncorroborated,
        repeat_noise: sigma2.sqrt(),
        ..CorrectionSummary::default()
    };
    if corroborated.len() < MIN_CORRECTED_GROUPS {
        return summary;
    }
    let (mut moments, mut n_moments) = (0.0, 0usize);
    for (_, p) in &corroborated {
        for r in p.residuals() {
            moments += r * r - sigma2 / p.count as f64;
            n_moments += 1;
        }
    }
    let tau2 = (moments / n_moments.max(1) as f64).max(0.0);
    summary.between = tau2.sqrt();
    if tau2 <= 0.0 {
        return summary;
    }
    for (key, p) in corroborated {
        let n = p.count as f64;
        let b = tau2 / (tau2 + sigma2 / n);
        let residuals = p.residuals();
        let correction = Correction {
            shift: residuals.iter().map(|r| b * r).collect(),
            sd: residuals.iter().map(|_| (b * sigma2 / n).sqrt()).collect(),
            count: p.count,
        };
        model.corrections.insert(key.clone(), correction);
        summary.corrected += 1;
    }
    summary
}

/// One workload combination's observations, per member in sorted-name order.
struct Pool {
    count: usize,
    /// Σ count · mean log slowdown, per slot.
    sum: Vec<f64>,
    m2: Vec<f64>,
    /// Σ count · predicted log slowdown, per slot (the same for every part of the pool).
    predicted: Vec<f64>,
}

impl Pool {
    fn new(k: usize) -> Pool {
        Pool { count: 0, sum: vec![0.0; k], m2: vec![0.0; k], predicted: vec![0.0; k] }
    }

    /// Adds a part of `n` observations (mean `mean`, M2 `m2`) to `slot`; Chan's parallel
    /// update of M2.
    fn add(&mut self, slot: usize, n: usize, mean: f64, m2: f64, predicted: f64) {
        let before = self.count as f64;
        let nf = n as f64;
        if before > 0.0 {
            let old_mean = self.sum[slot] / before;
            let delta = mean - old_mean;
            self.m2[slot] += m2 + delta * delta * before * nf / (before + nf);
        } else {
            self.m2[slot] += m2;
        }
        self.sum[slot] += nf * mean;
        self.predicted[slot] += nf * predicted;
    }

    /// Mean residual per slot: measured minus predicted log slowdown.
    fn residuals(&self) -> Vec<f64> {
        let n = self.count.max(1) as f64;
        self.sum.iter().zip(&self.predicted).map(|(s, p)| (s - p) / n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::Profile;
    use crate::slowdown::SlowdownParams;

    fn prof(excl: f64, sm: f64) -> Profile {
        crate::features::test_profile(excl, sm)
    }

    fn pair(a: usize, b: usize, ra: f64, rb: f64) -> Group {
        let (pa, pb) = (
            prof(10.0 + a as f64, 10.0 + 9.0 * a as f64),
            prof(10.0 + b as f64, 10.0 + 9.0 * b as f64),
        );
        Group {
            workloads: vec![format!("w{a}"), format!("w{b}")],
            throughputs: vec![pa.exclusive_throughput() * ra, pb.exclusive_throughput() * rb],
            profiles: vec![pa, pb],
        }
    }

    fn ev(user: &str, day: i64) -> Evidence {
        Evidence { users: vec![user.into()], trusted: false, day: Some(day) }
    }

    #[test]
    fn repeats_merge_into_count_mean_and_spread_whatever_the_member_order() {
        let mut b_first = pair(0, 1, 0.6, 0.9);
        b_first.workloads.reverse();
        b_first.profiles.reverse();
        b_first.throughputs.reverse();
        let g = vec![pair(0, 1, 0.8, 0.9), b_first, pair(0, 2, 0.7, 0.7), pair(0, 1, 0.7, 0.9)];
        let e = vec![ev("u", 1), ev("v", 2), ev("u", 3), ev("u", 4)];
        let m = merge(&g, Some(&e));
        assert_eq!((m.stats.len(), m.observations, m.aged), (2, 4, 0));
        let s = &m.stats[0];
        assert_eq!((s.count, s.inputs.clone()), (3, vec![0, 1, 3]));
        let logs = [0.8f64.ln(), 0.6f64.ln(), 0.7f64.ln()];
        let mean = logs.iter().sum::<f64>() / 3.0;
        assert!((s.mean_log[0] - mean).abs() < 1e-12);
        let m2: f64 = logs.iter().map(|l| (l - mean).powi(2)).sum();
        assert!((s.m2[0] - m2).abs() < 1e-12);
        assert!(s.m2[1].abs() < 1e-12, "w1 ran at 0.9 every time");
        assert!(
            (s.group.throughputs[0] / s.group.profiles[0].exclusive_throughput() - mean.exp())
                .abs()
                < 1e-12
        );
        assert_eq!(s.users.len(), 2);
        assert!(s.corroborated() && !m.stats[1].corroborated());
        // One observation is kept verbatim (bit for bit: today's training is unchanged).
        assert_eq!(m.stats[1].group, g[2]);
        // Trusted and untrusted observations of one combination stay apart.
        let t = vec![ev("u", 1), Evidence { trusted: true, ..ev("u", 1) }];
        assert_eq!(merge(&g[..2], Some(&t)).stats.len(), 2);
        // Without evidence every observation counts as trusted.
        assert!(merge(&g, None).stats.iter().all(|s| s.trusted));
    }

    #[test]
    fn old_observations_fall_out_of_the_window() {
        let g = vec![pair(0, 1, 0.5, 0.5), pair(0, 1, 0.8, 0.9), pair(0, 1, 0.8, 0.9)];
        let e = vec![ev("u", 0), ev("u", WINDOW_DAYS + 1), Evidence { day: None, ..ev("v", 0) }];
        let m = merge(&g, Some(&e));
        assert_eq!((m.aged, m.stats.len(), m.stats[0].count), (1, 1, 2));
        assert!((m.stats[0].mean_log[0] - 0.8f64.ln()).abs() < 1e-12);
    }

    /// Eight workloads' pairs with a pair-specific effect the profile cannot explain: each pair
    /// is observed `repeats` times with ±1 % noise.
    fn site(repeats: usize, users: &[&str]) -> (Vec<Group>, Vec<Evidence>, BTreeMap<String, f64>) {
        let mut groups = Vec::new();
        let mut evidence = Vec::new();
        let mut effect = BTreeMap::new();
        let mut k = 0usize;
        for a in 0..8 {
            for b in (a + 1)..8 {
                // A deterministic "interference" per pair, from −0.2 to +0.2 in log units.
                let d = (((a * 7 + b * 13) % 9) as f64 - 4.0) * 0.05;
                effect.insert(group_key([format!("w{a}").as_str(), format!("w{b}").as_str()]), d);
                for r in 0..repeats {
                    k += 1;
                    let noise = ((k * 37 % 11) as f64 - 5.0) * 0.002;
                    let base = 0.7f64.ln() + d + noise;
                    groups.push(pair(a, b, base.exp(), (0.8f64.ln() + d - noise).exp()));
                    evidence.push(ev(users[r % users.len()], r as i64));
                }
            }
        }
        (groups, evidence, effect)
    }

    fn fitted(groups: &[Group]) -> SlowdownModel {
        let refs: Vec<&Group> = groups.iter().collect();
        SlowdownModel::fit(&refs, SlowdownParams::default()).unwrap()
    }

    fn log_error(m: &SlowdownModel, g: &Group) -> f64 {
        let s = m.slowdowns(&g.members());
        s.iter()
            .zip(&g.throughputs)
            .zip(&g.profiles)
            .map(|((p, t), pr)| (p.ln() - (t / pr.exclusive_throughput()).ln()).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn corroborated_repeats_correct_their_group_and_narrow_its_doubt() {
        let (groups, evidence, _) = site(3, &["u", "v"]);
        let merged = merge(&groups, Some(&evidence));
        let reps: Vec<Group> = merged.stats.iter().map(|s| s.group.clone()).collect();
        let global = fitted(&reps);
        let mut m = global.clone();
        let s = learn_corrections(&mut m, &merged.stats);
        assert_eq!((s.corrected, s.uncorroborated), (28, 0));
        assert!(s.repeat_noise < 0.02 && s.repeat_noise >= MIN_REPEAT_NOISE, "{s:?}");
        assert!(s.between > s.repeat_noise, "{s:?}");
        let before: f64 = reps.iter().map(|g| log_error(&global, g)).sum::<f64>() / 28.0;
        let after: f64 = reps.iter().map(|g| log_error(&m, g)).sum::<f64>() / 28.0;
        assert!(after < before / 3.0, "corrected error {after} vs global {before}");
        // The doubt of a corrected pair is its posterior sd, far below the workload spreads,
        // and does not depend on the order of its members.
        let g = &reps[0];
        let mut swapped = g.members();
        swapped.reverse();
        assert!(m.doubt(&g.members()) < global.doubt(&g.members()) / 2.0);
        assert_eq!(m.doubt(&g.members()), m.doubt(&swapped));
        let (a, b) = (m.slowdowns(&g.members()), m.slowdowns(&swapped));
        assert!((a[0] - b[1]).abs() < 1e-12 && (a[1] - b[0]).abs() < 1e-12);
        // More repeats narrow it further.
        let (more, ev_more, _) = site(9, &["u", "v"]);
        let mm = merge(&more, Some(&ev_more));
        let mut m9 = fitted(&mm.stats.iter().map(|s| s.group.clone()).collect::<Vec<_>>());
        learn_corrections(&mut m9, &mm.stats);
        assert!(m9.doubt(&g.members()) < m.doubt(&g.members()));
        // The stored form round-trips and checks.
        let back: SlowdownModel =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
        assert!(crate::Model::Slowdown(back).check().is_ok());
    }

    #[test]
    fn one_users_observations_move_no_correction_until_another_user_or_trust_corroborates() {
        let (groups, evidence, _) = site(3, &["mallory"]);
        let merged = merge(&groups, Some(&evidence));
        let reps: Vec<Group> = merged.stats.iter().map(|s| s.group.clone()).collect();
        let mut m = fitted(&reps);
        let global = m.clone();
        let s = learn_corrections(&mut m, &merged.stats);
        assert_eq!((s.corrected, s.uncorroborated), (0, 28));
        for g in &reps {
            assert_eq!(m.slowdowns(&g.members()), global.slowdowns(&g.members()));
        }
        // A trusted observation of the same pairs corroborates them.
        let trusted: Vec<Evidence> =
            evidence.iter().map(|e| Evidence { trusted: true, ..e.clone() }).collect();
        let t = merge(&groups, Some(&trusted));
        assert_eq!(learn_corrections(&mut m, &t.stats).corrected, 28);
    }

    /// An admin imported every pair once; one user then reports a pair at half its speed five
    /// times. The trusted correction of that pair is the import's alone.
    #[test]
    fn one_users_reports_do_not_move_a_trusted_correction() {
        let (groups, evidence, _) = site(1, &["admin"]);
        let trusted: Vec<Evidence> =
            evidence.iter().map(|e| Evidence { trusted: true, ..e.clone() }).collect();
        let honest = merge(&groups, Some(&trusted));
        let mut reference =
            fitted(&honest.stats.iter().map(|s| s.group.clone()).collect::<Vec<_>>());
        learn_corrections(&mut reference, &honest.stats);
        let (mut g, mut e) = (groups.clone(), trusted.clone());
        for _ in 0..5 {
            g.push(pair(0, 1, 0.35, 0.4));
            e.push(ev("mallory", 5));
        }
        let forged = merge(&g, Some(&e));
        assert_eq!(forged.stats.len(), 29, "the forgeries are merged apart from the import");
        let mut m = fitted(&forged.stats.iter().map(|s| s.group.clone()).collect::<Vec<_>>());
        let s = learn_corrections(&mut m, &forged.stats);
        assert_eq!((s.corrected, s.uncorroborated), (28, 1));
        let key = group_key(["w0", "w1"]);
        let (a, b) = (&m.corrections[&key], &reference.corrections[&key]);
        assert_eq!((a.count, b.count), (1, 1));
        let honest_pair = &groups[0];
        assert_eq!(honest_pair.workloads, ["w0", "w1"]);
        let (got, want) =
            (m.normalised_progress(&honest_pair.members()), honest_pair.normalised_progress());
        assert!((got - want).abs() / want < 0.05, "predicted {got}, the import measured {want}");
    }

    #[test]
    fn a_pair_measured_harmful_is_predicted_harmful_after_its_repeats() {
        let (all, all_evidence, _) = site(1, &["u"]);
        let keep: Vec<usize> =
            (0..all.len()).filter(|&i| all[i].workloads != ["w0", "w1"]).collect();
        let mut groups: Vec<Group> = keep.iter().map(|&i| all[i].clone()).collect();
        let mut evidence: Vec<Evidence> = keep.iter().map(|&i| all_evidence[i].clone()).collect();
        let known = groups.len();
        // w0+w1 runs at 0.45 + 0.45 = 0.9 < 1, observed twice by two users; the profile-only
        // part says ~1.5.
        for (user, noise) in [("u", 1.0), ("v", 1.01)] {
            groups.push(pair(0, 1, 0.45 * noise, 0.45 / noise));
            evidence.push(ev(user, 3));
        }
        let trusted: Vec<Evidence> = evidence
            .iter()
            .enumerate()
            .map(|(i, e)| Evidence { trusted: i < known, ..e.clone() })
            .collect();
        let merged = merge(&groups, Some(&trusted));
        let reps: Vec<Group> = merged.stats.iter().map(|s| s.group.clone()).collect();
        let mut m = fitted(&reps);
        let harmful = pair(0, 1, 0.45, 0.45);
        let global = m.normalised_progress(&harmful.members());
        assert!(global > 1.0, "the global model alone would form it: {global}");
        learn_corrections(&mut m, &merged.stats);
        let progress = m.normalised_progress(&harmful.members());
        assert!(progress < 1.0, "predicted {progress}");
    }
}
