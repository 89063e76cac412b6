//! What a new workload costs in the simulator (docs/onboarding.md, docs/simulate.md): every
//! workload of the artifact in turn new (never trained on, system profile only) and known, on
//! the traces `kace simulate --new-workload all --policies kace` runs with its defaults.

use std::fs::File;

use kace_selector::dataset::read_colocations;
use kace_selector::eval::paper::PAPER_SEEDS;
use kace_selector::SelectionRules;
use kace_simulator::onboarding::{new_workload_cost, Summary};
use kace_simulator::trace::UserMix;
use kace_simulator::{generate, TraceSpec, World, DEFAULT_WINDOW};
use kace_test_support::artifact;

/// `got` equals the stated figure `want` to its last digit (`digits` decimals).
fn stated(what: &str, got: f64, want: f64, digits: i32) {
    let tolerance = 0.5 * 10f64.powi(-digits) + 1e-12;
    assert!((got - want).abs() <= tolerance, "{what}: measured {got:.6}, stated {want}");
}

#[test]
#[ignore = "needs ../shared/data/kace-artifact"]
fn a_new_workload_is_tried_with_fewer_partners_at_no_cluster_cost() {
    let dir = artifact();
    let path = dir.join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    let data = read_colocations("pairs", File::open(path).expect("pair table")).unwrap();
    let world = World::from_colocations(&data, 32.0).unwrap();
    // kace.conf's default rules on the simulated GPU, as `kace simulate` runs them.
    let rules = SelectionRules {
        gpu_memory_gib: Some(32.0),
        ..kace_config::Config::default().policy().rules
    };
    let gpus = 100;
    let mut costs = Vec::new();
    for (i, seed) in (1..=5u64).enumerate() {
        // `kace simulate`'s default trace: a shared cluster's users, the same-user rule on.
        let spec =
            TraceSpec { users: UserMix::shared_cluster(), ..TraceSpec::new(5000, 2.0, gpus, seed) };
        let jobs = generate(&world, &spec).unwrap();
        for w in world.names() {
            let c = new_workload_cost(
                &data,
                &world,
                &jobs,
                gpus,
                DEFAULT_WINDOW,
                &rules,
                PAPER_SEEDS[i % PAPER_SEEDS.len()],
                w,
                10,
                false,
            )
            .unwrap();
            assert!(c.new.first_jobs_mean_jct_s > 0.0 && c.known.first_jobs_mean_jct_s > 0.0);
            costs.push(c);
        }
    }
    let s = Summary::of(&costs).unwrap();
    eprintln!("{s:?}");
    assert_eq!(s.comparisons, 105);
    stated("partners, known", s.partners_known, 11.91, 2);
    stated("partners, new", s.partners_new, 3.77, 2);
    stated("harmful share, known", s.harmful_share_known, 0.016, 3);
    stated("harmful share, new", s.harmful_share_new, 0.028, 3);
    stated("first 10 jobs' completion time, new / known", s.first_jobs_jct_ratio, 0.921, 3);
    stated("cluster throughput, new / known", s.cluster_work_ratio, 0.983, 3);
}
