//! kace retrained every simulated night during a cluster run, as production runs `kace retrain`
//! nightly: the engine's night hook ([`crate::engine::Nights`]) stores the day's colocations as
//! observations (the artifact's measured throughputs, the simulator's ground truth, with the
//! site history's measurement noise), trains through the one night's training both simulations
//! share ([`crate::night::retrain`]: the store's training set with its per-user cap, the active
//! model as competitor, `train_observed`, the activation rule), and, when the rule accepts the
//! new model, rebuilds kace's pairing table from it for the next day.
//!
//! Before the first night the store holds what the model was trained on (the n_occur = 3 split,
//! [`crate::model::train_kace`]) as the admin's trusted import: the reference the activation rule
//! checks a new model against.
//!
//! Pure: randomness (the noise) comes only from the seed.

use kace_selector::dataset::{ColocationData, Group};
use kace_selector::training::TrainingPolicy;
use kace_selector::{Model, SelectionRules};

use crate::engine::{simulate, simulate_with_nights, Colocation, Nights, Outcome};
use crate::error::SimError;
use crate::model::TrainedKace;
use crate::night::{measured, retrain, Store, Training, Verdict, MEASUREMENT_NOISE};
use crate::policy::{PairingPolicy, PolicyKind};
use crate::rng::SplitMix64;
use crate::trace::Job;
use crate::world::{PairKind, World};

/// Whether kace's model is retrained during a cluster run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retrain {
    /// Every 24 simulated hours, as production runs `kace retrain` nightly.
    #[default]
    Nightly,
    /// Never: the model trained before the run decides for the whole trace.
    Never,
}

impl Retrain {
    /// Every mode, the default first.
    pub const ALL: [Retrain; 2] = [Retrain::Nightly, Retrain::Never];

    /// Stable name (CLI, JSON).
    pub fn key(self) -> &'static str {
        match self {
            Retrain::Nightly => "nightly",
            Retrain::Never => "never",
        }
    }

    /// Parses [`Retrain::key`].
    pub fn from_key(s: &str) -> Option<Retrain> {
        Retrain::ALL.into_iter().find(|r| r.key() == s)
    }
}

/// One night of a cluster run.
#[derive(Debug, Clone, PartialEq)]
pub struct NightReport {
    /// 1-based; it falls at `night × DAY_S`.
    pub night: u32,
    /// Colocations that ended during the day, stored as observations.
    pub observed: usize,
    /// Observations stored by then, the import included (training keeps the capped share).
    pub stored: usize,
    /// Whether the activation rule accepted the new model.
    pub activated: bool,
    /// Why it did not (the rule's words).
    pub refusal: Option<String>,
}

/// kace during one cluster run, retrained every night: the night hook [`simulate_kace`] gives
/// the engine.
#[derive(Debug, Clone)]
pub struct NightlyKace<'a> {
    world: &'a World,
    rules: SelectionRules,
    kind: PolicyKind,
    multi_user: bool,
    training: TrainingPolicy,
    noise: f64,
    rng: SplitMix64,
    store: Store,
    /// Observations the active model was trained on (the first ones in the store).
    active_upto: usize,
    /// The model of each day so far: `[0]` decided day 1.
    models: Vec<Model>,
    nights: Vec<NightReport>,
}

impl<'a> NightlyKace<'a> {
    /// kace as `kind` (kace or kace-at-start) with `trained`'s model, whose training split of
    /// `data` becomes the trusted import; observations carry `noise` (the standard deviation of
    /// a member's log throughput) drawn from `seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        world: &'a World,
        data: &ColocationData,
        trained: &TrainedKace,
        kind: PolicyKind,
        rules: &SelectionRules,
        multi_user: bool,
        noise: f64,
        seed: u64,
    ) -> Result<NightlyKace<'a>, SimError> {
        if !matches!(kind, PolicyKind::Kace | PolicyKind::KaceAtStart) {
            return Err(SimError::Config(format!("{} has no model to retrain", kind.key())));
        }
        if !(noise.is_finite() && noise >= 0.0) {
            return Err(SimError::Config(format!("noise {noise}: must be a number ≥ 0")));
        }
        let mut store = Store::default();
        for &row in &trained.fit_rows {
            let g = data.groups.get(row).ok_or_else(|| {
                SimError::World(format!("the model was fitted on row {row}, which the data lack"))
            })?;
            store.push(g.clone(), Vec::new(), true, 0);
        }
        Ok(NightlyKace {
            world,
            rules: rules.clone(),
            kind,
            multi_user,
            training: TrainingPolicy::new(trained.model.kind(), rules.objective),
            noise,
            rng: SplitMix64::new(seed ^ 0x6e69_6768_746c_7921),
            active_upto: store.len(),
            store,
            models: vec![trained.model.clone()],
            nights: Vec::new(),
        })
    }

    /// The pairing table of `model`, with the pairs it was fitted on marked as seen.
    fn policy(&self, model: &Model, fit_pairs: &[[String; 2]]) -> PairingPolicy {
        let p = if self.kind == PolicyKind::KaceAtStart {
            PairingPolicy::kace_at_start(self.world, model, &self.rules)
        } else {
            PairingPolicy::kace(self.world, model, &self.rules)
        };
        p.multi_user(self.multi_user).with_seen_pairs(self.world, fit_pairs)
    }

    /// The observation a site stores of one colocation: the measured pair with noise.
    fn observation(&mut self, c: &Colocation) -> Option<(Group, Vec<String>)> {
        // The engine forms measured pairs only: anything else has no throughput to observe.
        let PairKind::Measured { first, second } = self.world.pair(c.first, c.second) else {
            return None;
        };
        let group = Group {
            workloads: vec![
                self.world.name(c.first).to_string(),
                self.world.name(c.second).to_string(),
            ],
            profiles: vec![*self.world.profile(c.first), *self.world.profile(c.second)],
            throughputs: vec![
                measured(first, self.noise, &mut self.rng),
                measured(second, self.noise, &mut self.rng),
            ],
        };
        let mut users: Vec<String> = c.users.iter().map(|u| format!("u{u}")).collect();
        users.sort_unstable();
        users.dedup();
        Some((group, users))
    }

    /// The model of each day so far: `[0]` decided day 1, `[d]` day d + 1 (the previous day's
    /// when that night's model was refused).
    pub fn day_models(&self) -> &[Model] {
        &self.models
    }

    /// Every night so far.
    pub fn nights(&self) -> &[NightReport] {
        &self.nights
    }
}

impl Nights for NightlyKace<'_> {
    fn night(
        &mut self,
        night: u32,
        ended: &[Colocation],
    ) -> Result<Option<PairingPolicy>, SimError> {
        let mut observed = 0;
        for c in ended {
            if let Some((g, users)) = self.observation(c) {
                self.store.push(g, users, false, i64::from(night));
                observed += 1;
            }
        }
        let active = self.models.last().cloned().ok_or_else(|| {
            SimError::Config("a nightly retraining started without a model".into())
        })?;
        let verdict =
            retrain(&self.store, &active, self.active_upto, Training::Repeats, &self.training)?;
        let (model, next, refusal) = match verdict {
            Verdict::Activated { model, fit } => {
                let fit_pairs: Vec<[String; 2]> = fit
                    .iter()
                    .filter_map(|&i| {
                        let w = &self.store.group(i)?.workloads;
                        Some([w.first()?.clone(), w.get(1)?.clone()])
                    })
                    .collect();
                let next = self.policy(&model, &fit_pairs);
                self.active_upto = self.store.len();
                (*model, Some(next), None)
            }
            Verdict::Refused(why) => (active, None, Some(why)),
        };
        self.models.push(model);
        self.nights.push(NightReport {
            night,
            observed,
            stored: self.store.len(),
            activated: next.is_some(),
            refusal,
        });
        Ok(next)
    }
}

/// What retraining did in one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RetrainReport {
    /// The mode run.
    pub mode: Retrain,
    /// Each night (none under [`Retrain::Never`]).
    pub nights: Vec<NightReport>,
}

impl RetrainReport {
    /// Nights whose model the activation rule accepted.
    pub fn activated(&self) -> usize {
        self.nights.iter().filter(|n| n.activated).count()
    }

    /// Nights whose model it refused.
    pub fn refused(&self) -> usize {
        self.nights.len() - self.activated()
    }
}

/// Runs `jobs` under kace (`kind`: kace or kace-at-start) with `trained`'s model, retrained as
/// `retrain` says ([`NightlyKace`]; the noise is [`MEASUREMENT_NOISE`], drawn from `seed`).
/// Under [`Retrain::Never`] this is [`simulate`] with the model's table, nothing else.
#[allow(clippy::too_many_arguments)]
pub fn simulate_kace(
    world: &World,
    data: &ColocationData,
    trained: &TrainedKace,
    kind: PolicyKind,
    rules: &SelectionRules,
    multi_user: bool,
    jobs: &[Job],
    gpus: usize,
    window: usize,
    retrain: Retrain,
    seed: u64,
) -> Result<(Outcome, RetrainReport), SimError> {
    let mut nightly =
        NightlyKace::new(world, data, trained, kind, rules, multi_user, MEASUREMENT_NOISE, seed)?;
    let first = nightly.policy(&trained.model, &trained.fit_pairs);
    match retrain {
        Retrain::Never => Ok((
            simulate(world, &first, jobs, gpus, window)?,
            RetrainReport { mode: retrain, nights: Vec::new() },
        )),
        Retrain::Nightly => {
            let o = simulate_with_nights(world, &first, jobs, gpus, window, &mut nightly)?;
            Ok((o, RetrainReport { mode: retrain, nights: nightly.nights }))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::DAY_S;
    use crate::metrics::Metrics;
    use crate::model::deployed;
    use crate::trace::{generate, TraceSpec, UserMix};
    use kace_selector::features::{Feature, FEATURE_COUNT};
    use kace_selector::{ModelKind, Objective, Profile};

    /// Eight workloads, every pair measured, each pair with its own interference (±36 %, which
    /// profiles alone cannot explain) times `sign`: −1 turns every effect the other way, 0
    /// leaves the profiles' share alone.
    pub(crate) fn data(sign: f64) -> ColocationData {
        let prof = |i: usize| {
            let mut f = [1.0 + i as f64; FEATURE_COUNT];
            f[Feature::ExclusiveThroughput.index()] = 10.0 + 3.0 * i as f64;
            f[Feature::SmUtil.index()] = 20.0 + 9.0 * i as f64;
            Profile::new(f)
        };
        let mut groups = Vec::new();
        for a in 0..8 {
            for b in a..8 {
                let (pa, pb) = (prof(a), prof(b));
                let effect = sign * (((a * 5 + b * 3) % 7) as f64 - 3.0) * 0.12;
                let slow = |p: &Profile| 0.75 - p.get(Feature::SmUtil) / 400.0;
                groups.push(Group {
                    workloads: vec![format!("w{a}"), format!("w{b}")],
                    throughputs: vec![
                        pa.exclusive_throughput() * slow(&pb) * effect.exp(),
                        pb.exclusive_throughput() * slow(&pa) * effect.exp(),
                    ],
                    profiles: vec![pa, pb],
                });
            }
        }
        ColocationData { k: 2, groups }
    }

    fn rules() -> SelectionRules {
        SelectionRules {
            objective: Objective::NormalisedProgress,
            gpu_memory_gib: Some(32.0),
            memory_margin: 0.0,
            require_same_user: true,
            refuse_likely_harm: true,
            ..SelectionRules::default()
        }
    }

    /// kace trained as `kace train` does on `rows` of `import`.
    fn trained(import: &ColocationData, rows: Vec<usize>) -> TrainedKace {
        let observed: Vec<Group> = rows.iter().map(|&r| import.groups[r].clone()).collect();
        let (model, _) =
            deployed(&observed, ModelKind::Slowdown, Objective::NormalisedProgress).unwrap();
        let fit_pairs = rows
            .iter()
            .map(|&r| {
                [import.groups[r].workloads[0].clone(), import.groups[r].workloads[1].clone()]
            })
            .collect();
        TrainedKace { model, seed: 0, fit_rows: rows, fit_pairs }
    }

    /// Three days of arrivals on 4 GPUs at load 1.5, three users running every workload.
    fn jobs(world: &World, seed: u64) -> Vec<Job> {
        let spec = TraceSpec {
            users: UserMix { users: 3, skew: 0.0, workloads_per_user: 0 },
            ..TraceSpec::new(900, 1.5, 4, seed)
        };
        generate(world, &spec).unwrap()
    }

    fn nightly<'a>(
        world: &'a World,
        import: &ColocationData,
        t: &TrainedKace,
        seed: u64,
    ) -> (Outcome, NightlyKace<'a>) {
        let mut k = NightlyKace::new(
            world,
            import,
            t,
            PolicyKind::Kace,
            &rules(),
            false,
            MEASUREMENT_NOISE,
            seed,
        )
        .unwrap();
        let first = k.policy(&t.model, &t.fit_pairs);
        let o = simulate_with_nights(world, &first, &jobs(world, seed), 4, 8, &mut k).unwrap();
        (o, k)
    }

    /// Half the pairs, as the world measures them.
    /// kace on `trace` over 4 GPUs with a window of 8, the tests' rules, one user.
    fn run_kace(
        world: &World,
        import: &ColocationData,
        t: &TrainedKace,
        trace: &[Job],
        retrain: Retrain,
        seed: u64,
    ) -> Result<(Outcome, RetrainReport), SimError> {
        simulate_kace(
            world,
            import,
            t,
            PolicyKind::Kace,
            &rules(),
            false,
            trace,
            4,
            8,
            retrain,
            seed,
        )
    }

    fn half_import() -> (ColocationData, TrainedKace) {
        let import = data(1.0);
        let t = trained(&import, (0..36).step_by(2).collect());
        (import, t)
    }

    #[test]
    fn a_run_retrains_at_every_night_while_decisions_are_left() {
        let world = World::from_colocations(&data(1.0), 32.0).unwrap();
        let (import, t) = half_import();
        for seed in 1..=3 {
            let (o, k) = nightly(&world, &import, &t, seed);
            let trace = jobs(&world, seed);
            // A decision is left while a job is still to arrive or waiting to start.
            let last_decision =
                trace.iter().map(|j| j.submit).chain(o.start.iter().copied()).fold(0.0, f64::max);
            let expected = (1..).take_while(|&n| f64::from(n) * DAY_S < last_decision).count();
            assert!(expected >= 2, "the trace spans {} days", last_decision / DAY_S);
            assert_eq!(o.nights as usize, expected, "seed {seed}");
            let nights = k.nights();
            assert_eq!(nights.len(), expected, "one training per night");
            assert_eq!(k.day_models().len(), expected + 1);
            let mut stored = t.fit_rows.len();
            for (i, n) in nights.iter().enumerate() {
                assert_eq!(n.night as usize, i + 1);
                assert_eq!(n.activated, n.refusal.is_none(), "{n:?}");
                stored += n.observed;
                assert_eq!(n.stored, stored, "{n:?}");
            }
            assert!(nights.iter().map(|n| n.observed).sum::<usize>() > 0, "{nights:?}");
            // The library's run is the same run, and counts the same nights.
            let (o2, report) =
                run_kace(&world, &import, &t, &trace, Retrain::Nightly, seed).unwrap();
            assert_eq!(o2, o);
            assert_eq!(report.nights, nights);
            assert_eq!(report.activated() + report.refused(), expected);
        }
    }

    #[test]
    fn what_a_day_observed_changes_the_next_days_model_and_table() {
        let world = World::from_colocations(&data(1.0), 32.0).unwrap();
        let (import, t) = half_import();
        let imported: std::collections::BTreeSet<String> = t
            .fit_pairs
            .iter()
            .map(|[a, b]| kace_selector::slowdown::group_key([a.as_str(), b.as_str()]))
            .collect();
        let mut checked = 0;
        for seed in 1..=3 {
            let (o, k) = nightly(&world, &import, &t, seed);
            let models = k.day_models();
            // A night that learnt from the day's pairs and was activated.
            let Some(n) = k.nights().iter().find(|n| n.observed > 0 && n.activated) else {
                panic!("seed {seed}: no night both observed and activated: {:?}", k.nights());
            };
            let (before, after) = (&models[n.night as usize - 1], &models[n.night as usize]);
            assert_ne!(before, after, "seed {seed}: night {}", n.night);
            // Each pair has its own interference, which only corrections learn: the new model
            // corrects a pair from more than its one imported observation, or one never imported.
            let Model::Slowdown(m) = after else { panic!("a slowdown model") };
            assert!(
                m.corrections.iter().any(|(key, c)| c.count > 1 || !imported.contains(key)),
                "seed {seed}: corrections from the import alone: {:?}",
                m.corrections.iter().map(|(k, c)| (k, c.count)).collect::<Vec<_>>()
            );
            // The pairing table is rebuilt from it, and the run decides differently than with
            // the first model throughout.
            assert_ne!(
                PairingPolicy::kace(&world, before, &rules()),
                PairingPolicy::kace(&world, after, &rules())
            );
            let never =
                simulate(&world, &k.policy(&t.model, &t.fit_pairs), &jobs(&world, seed), 4, 8)
                    .unwrap();
            assert_ne!(o.start, never.start, "seed {seed}");
            checked += 1;
        }
        assert_eq!(checked, 3);
    }

    #[test]
    fn a_refused_retrain_keeps_the_old_model() {
        // The admin's import says every pair's interference is the opposite of what the
        // cluster then measures: the nights' models fit the day's pairs and lose the trusted
        // reference, which the activation rule refuses.
        let world = World::from_colocations(&data(1.0), 32.0).unwrap();
        let import = data(-1.0);
        let t = trained(&import, (0..36).collect());
        let mut refused = 0;
        for seed in 1..=2 {
            let (_, k) = nightly(&world, &import, &t, seed);
            let models = k.day_models();
            for n in k.nights().iter().filter(|n| !n.activated) {
                let why = n.refusal.as_deref().unwrap_or_default();
                assert!(why.contains("trusted"), "{why}");
                assert_eq!(models[n.night as usize], models[n.night as usize - 1], "{n:?}");
                refused += 1;
            }
            assert!(k.nights().iter().any(|n| n.observed > 0 && !n.activated), "{:?}", k.nights());
        }
        assert!(refused >= 2, "{refused}");
    }

    #[test]
    fn never_is_the_first_models_table_for_the_whole_run() {
        let world = World::from_colocations(&data(1.0), 32.0).unwrap();
        let (import, t) = half_import();
        let trace = jobs(&world, 1);
        let (o, report) = run_kace(&world, &import, &t, &trace, Retrain::Never, 1).unwrap();
        let table = PairingPolicy::kace(&world, &t.model, &rules())
            .multi_user(false)
            .with_seen_pairs(&world, &t.fit_pairs);
        assert_eq!(o, simulate(&world, &table, &trace, 4, 8).unwrap());
        assert_eq!((o.nights, report.nights.len(), report.mode), (0, 0, Retrain::Never));
        assert!(o.finish.iter().fold(0.0, |m: f64, &f| m.max(f)) > 2.0 * DAY_S, "spans days");
    }

    #[test]
    fn never_reproduces_the_metrics_of_the_simulator_before_nights() {
        // Pairs whose interference the profiles explain, so that the first model forms pairs;
        // every pair imported.
        let world = World::from_colocations(&data(0.0), 32.0).unwrap();
        let import = data(0.0);
        let t = trained(&import, (0..36).collect());
        let (o, _) = run_kace(&world, &import, &t, &jobs(&world, 1), Retrain::Never, 1).unwrap();
        // `Metrics::of(&simulate(..))` on the same world, model, table and trace at commit
        // 5a867ea, before the engine held nights.
        let before = Metrics {
            makespan_s: 354312.90526622924,
            mean_jct_s: 31772.39128245611,
            p95_jct_s: 56032.22840583374,
            mean_wait_s: 28996.57978480989,
            gpu_busy_h: 368.7691644986485,
            shared_fraction: 0.8818082996581341,
            steps_per_s: 92.47454019599024,
            sustained_steps_per_s: 98.52739919557939,
            sustained_work_per_s: 4.891623010986383,
            queued_fraction: 0.9884287923591935,
            ooms: 0.0,
            pairings: 810.0,
            seen_share: 1.0,
            energy_per_work: 0.5496610586160113,
        };
        let now = Metrics::of(&o);
        for ((name, a), b) in Metrics::NAMES.iter().zip(now.values()).zip(before.values()) {
            assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{name}: {a} now, {b} before");
        }
    }

    #[test]
    fn modes_round_trip_and_only_kace_is_retrained() {
        for r in Retrain::ALL {
            assert_eq!(Retrain::from_key(r.key()), Some(r));
        }
        assert_eq!(Retrain::default(), Retrain::Nightly);
        let world = World::from_colocations(&data(1.0), 32.0).unwrap();
        let (import, t) = half_import();
        let new = |kind, noise| {
            NightlyKace::new(&world, &import, &t, kind, &rules(), false, noise, 1).map(|_| ())
        };
        assert!(matches!(new(PolicyKind::Oracle, 0.0), Err(SimError::Config(_))));
        assert!(matches!(new(PolicyKind::Kace, f64::NAN), Err(SimError::Config(_))));
        assert!(new(PolicyKind::KaceAtStart, 0.0).is_ok());
    }
}
