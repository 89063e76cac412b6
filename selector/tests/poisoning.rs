//! The re-audit's H1 (../shared/reference/audits/2026-12-02/reliability-reaudit.md) at the level
//! it lives, the activation rule: forged pairs inside the plausibility bound, the only groups
//! the active model has not seen, used to get the new model activated. With the trusted
//! reference (the admin's imported groups) the forged model is refused and an honest retrain
//! still activates, on the demo's data (in the repository) and on the KACE artifact's.

use kace_selector::dataset::{read_colocations, Group};
use kace_selector::training::{
    not_worse, train, Active, Refusal, Trained, TrainingPolicy, ACTIVATION_MARGIN,
    MAX_RATIO_TO_EXCLUSIVE,
};
use kace_selector::{Model, ModelKind, Objective, Predictor};

fn policy() -> TrainingPolicy {
    TrainingPolicy::new(ModelKind::Slowdown, Objective::ThroughputSum)
}

/// The demo's 28 pairs, as `kace observations import packaging/demo/pairs.csv` stores them.
fn demo_groups() -> Vec<Group> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/demo/pairs.csv");
    let f = std::fs::File::open(path).expect("the demo's pair table is in the repository");
    read_colocations("pairs", f).expect("the demo's pairs parse").groups
}

/// `n` copies of the pair `a`+`b` from `groups`, each job at `ratio` times its exclusive
/// throughput: what one user's progress lines can claim inside the store's 4× bound.
fn forged(groups: &[Group], a: &str, b: &str, ratio: f64, n: usize) -> Vec<Group> {
    let template =
        groups.iter().find(|g| g.workloads == [a, b]).expect("the pair is observed").clone();
    let throughputs = template.profiles.iter().map(|p| ratio * p.exclusive_throughput()).collect();
    vec![Group { throughputs, ..template }; n]
}

/// Re-observations of `groups`' pairs, each throughput off by a deterministic ±2 %: what honest
/// jobs measure after the admin's import.
fn honest(groups: &[Group], n: usize) -> Vec<Group> {
    (0..n)
        .map(|i| {
            let mut g = groups[(i * 7) % groups.len()].clone();
            for (j, t) in g.throughputs.iter_mut().enumerate() {
                *t *= 1.0 + 0.02 * (((i * 3 + j * 5) % 5) as f64 - 2.0) / 2.0;
            }
            g
        })
        .collect()
}

/// Retrains on `old` (which the active model saw, and which are trusted when `trusted_old`)
/// plus `new` (users' observations).
fn retrain(active: &Model, old: &[Group], new: &[Group], trusted_old: bool) -> Trained {
    let all: Vec<Group> = old.iter().chain(new).cloned().collect();
    let seen: Vec<bool> = (0..all.len()).map(|i| i < old.len()).collect();
    let trusted: Vec<bool> = (0..all.len()).map(|i| trusted_old && i < old.len()).collect();
    let a = Active { model: active, seen: Some(&seen), trusted: trusted_old.then_some(&trusted) };
    train(&all, Some(a), &policy()).expect("trains")
}

/// The partner a model's argmax picks for `lead` among `candidates` (profiles from `groups`).
fn argmax_partner<'a>(
    model: &Model,
    groups: &[Group],
    lead: &str,
    candidates: &[&'a str],
) -> &'a str {
    let score = |c: &str| {
        let g = groups.iter().find(|g| g.workloads == [lead, c]).expect("pair observed");
        model.predict(&g.members(), Objective::ThroughputSum)
    };
    let mut best = (candidates[0], f64::NEG_INFINITY);
    for &c in candidates {
        let s = score(c);
        if s > best.1 {
            best = (c, s);
        }
    }
    best.0
}

#[test]
fn forged_pairs_inside_the_bound_are_refused_on_the_trusted_reference() {
    let admin = demo_groups();
    assert_eq!(admin.len(), 28);
    let v1 = train(&admin, None, &policy()).expect("version 1");
    assert!(v1.activate);
    // The audit's attack: 20 pairs resnet50-train + unet-infer at 3.9× their exclusive
    // throughputs, inside the store's bound.
    let attack = forged(&admin, "resnet50-train", "unet-infer", 3.9, 20);
    const { assert!(3.9 < MAX_RATIO_TO_EXCLUSIVE) };

    // The rule before this one compared only on the held-out groups the active model had not
    // seen: the forged ones, where the forged model wins, so it was activated (H1).
    let after = retrain(&v1.model, &admin, &attack, true);
    let unseen = (after.compared_quality.unwrap().mse, after.active_quality.unwrap().mse);
    assert!(unseen.0 < unseen.1, "the forged groups favour the forged model: {unseen:?}");
    assert!(not_worse(unseen.0, Some(unseen.1)), "H1 reproduced: the old rule activates it");
    // And the forged model flips resnet50-train's partner to the forged one.
    let candidates = ["vit-train", "lstm-train", "bert-infer", "whisper-infer", "unet-infer"];
    let lead = "resnet50-train";
    assert_ne!(argmax_partner(&v1.model, &admin, lead, &candidates), "unet-infer");
    assert_eq!(argmax_partner(&after.model, &admin, lead, &candidates), "unet-infer");

    // With the admin's 28 pairs as the trusted reference, it is refused there.
    let reference = after.reference.expect("compared on the trusted reference");
    assert_eq!(reference.groups, 28);
    assert!(!after.activate);
    assert!(matches!(after.refusal, Some(Refusal::WorseOnReference(_))), "{:?}", after.refusal);
    let ratio = reference.new.mse / reference.active.mse;
    assert!(ratio > 1.0 + ACTIVATION_MARGIN, "{reference:?}");
    // The held-out groups both models saw refuse it too, on their own.
    assert!(!after.seen_comparison.expect("seen groups held out").within_margin());
    // Without a trusted reference, the seen held-out groups alone still refuse it here.
    let untrusted = retrain(&v1.model, &admin, &attack, false);
    assert!(matches!(untrusted.refusal, Some(Refusal::WorseOnSeen(_))), "{:?}", untrusted.refusal);
    eprintln!(
        "demo, 20 forged pairs: trusted MSE {:.4} (new) vs {:.4} (active), ×{ratio:.1}: {}",
        reference.new.mse,
        reference.active.mse,
        after.refusal.map(|r| r.to_string()).unwrap_or_default()
    );
    // A forced activation overrides the comparison, not the range check.
    let forced = TrainingPolicy { force_activation: true, ..policy() };
    let all: Vec<Group> = admin.iter().chain(&attack).cloned().collect();
    assert!(train(&all, None, &forced).unwrap().activate);
}

#[test]
fn an_honest_retrain_still_activates() {
    let admin = demo_groups();
    let v1 = train(&admin, None, &policy()).expect("version 1");
    let t = retrain(&v1.model, &admin, &honest(&admin, 20), true);
    assert!(t.activate, "{:?}", t.refusal.map(|r| r.to_string()));
    let r = t.reference.expect("compared on the trusted reference");
    assert!(r.within_margin());
    eprintln!(
        "demo, 20 honest re-observations: trusted MSE {:.4} (new) vs {:.4} (active): activated",
        r.new.mse, r.active.mse
    );
}

#[test]
fn a_forced_activation_cannot_override_an_out_of_range_model() {
    // The audit's H1(b): pairs 2.9e8× the admin's exclusive throughput (the bound had moved).
    let admin = demo_groups();
    let attack = forged(&admin, "resnet50-train", "bert-infer", 2.9e8, 20);
    let all: Vec<Group> = admin.iter().chain(&attack).cloned().collect();
    let forced = TrainingPolicy { force_activation: true, ..policy() };
    let t = train(&all, None, &forced).expect("trains");
    assert!(!t.activate);
    match t.refusal {
        Some(r @ Refusal::OutOfRange { predicted, bound, .. }) => {
            assert!(predicted > bound && !r.overridable(), "{r}");
        }
        other => panic!("expected out of range, got {other:?}"),
    }
}

/// The KACE artifact's 181 measured pairs: a seeded half is the admin's trusted import (the
/// active model's data), the other half arrives as users' observations.
#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn artifact_activation() {
    let path = kace_test_support::artifact().join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    let f = std::fs::File::open(path).expect("artifact pair table readable");
    let data = read_colocations("pairs", f).expect("artifact pairs parse");
    let n = data.groups.len();
    let (user_idx, admin_idx) = kace_selector::training::holdout_split(n, 0.5, 7);
    let pick = |idx: &[usize]| idx.iter().map(|&i| data.groups[i].clone()).collect::<Vec<_>>();
    let (admin, users) = (pick(&admin_idx), pick(&user_idx));
    let v1 = train(&admin, None, &policy()).expect("active model");
    let honest = retrain(&v1.model, &admin, &users, true);
    let hr = honest.reference.expect("reference");
    eprintln!(
        "artifact, {} admin + {} honest user pairs: trusted MSE {:.4} vs {:.4} (×{:.3}), seen {:?}: \
         activate {}",
        admin.len(),
        users.len(),
        hr.new.mse,
        hr.active.mse,
        hr.new.mse / hr.active.mse,
        honest.seen_comparison.map(|c| (c.groups, c.new.mse, c.active.mse)),
        honest.activate
    );
    assert!(honest.activate, "{:?}", honest.refusal.map(|r| r.to_string()));
    // 20 forged pairs of the first admin pair of two different workloads, at 3.9×.
    let g = admin.iter().find(|g| !g.is_self_group()).expect("a mixed pair");
    let attack = forged(&admin, &g.workloads[0], &g.workloads[1], 3.9, 20);
    let with_users: Vec<Group> = users.iter().chain(&attack).cloned().collect();
    let forged_t = retrain(&v1.model, &admin, &with_users, true);
    let fr = forged_t.reference.expect("reference");
    eprintln!(
        "artifact, + 20 forged {}+{} at 3.9x: trusted MSE {:.4} vs {:.4} (×{:.2}): {}",
        g.workloads[0],
        g.workloads[1],
        fr.new.mse,
        fr.active.mse,
        fr.new.mse / fr.active.mse,
        forged_t.refusal.map(|r| r.to_string()).unwrap_or_else(|| "activated".into())
    );
    assert!(!forged_t.activate);
    assert!(matches!(forged_t.refusal, Some(Refusal::WorseOnReference(_))));
}
