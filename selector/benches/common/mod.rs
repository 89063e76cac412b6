//! What the selector's benches share: the pair table they run on.

use std::fs::File;

use kace_selector::dataset::{read_colocations, ColocationData, Group};
use kace_selector::Profile;

/// The artifact's pair table, or a synthetic table of the same size when it is absent.
pub fn pairs() -> (ColocationData, &'static str) {
    let path =
        kace_test_support::artifact_dir().join("pairs/MPS100_kernel_labels_targetMPS100.csv");
    if let Ok(f) = File::open(&path) {
        if let Ok(d) = read_colocations("pairs", f) {
            return (d, "artifact, 181 pairs");
        }
    }
    eprintln!("artifact not found at {}: using synthetic pairs", path.display());
    let mut groups = Vec::new();
    for i in 0..181 {
        let p = |s: f64| Profile::new(std::array::from_fn(|j| 1.0 + s * (j as f64 + 1.0)));
        let (a, b) = (p((i % 21) as f64), p((i % 13) as f64 * 0.7));
        groups.push(Group {
            workloads: vec![format!("w{}", i % 21), format!("w{}", i % 13)],
            profiles: vec![a, b],
            throughputs: vec![10.0 + (i % 7) as f64, 5.0 + (i % 5) as f64],
        });
    }
    (ColocationData { k: 2, groups }, "synthetic, 181 pairs")
}
