//! Loading the KACE artifact's data for the integration tests. The data stay in
//! `../shared/data/kace-artifact` (or `$KACE_ARTIFACT_DIR`); the tests that read them are ignored
//! unless run with `--include-ignored`.

use std::fs::File;
use std::path::PathBuf;

use kace_selector::dataset::{read_colocations, read_n_occur_splits, ColocationData, SplitRow};

/// The artifact's pair table and its n_occur splits.
pub struct Artifact {
    pub dir: PathBuf,
    pub pairs: ColocationData,
    pub splits: Vec<SplitRow>,
}

impl Artifact {
    /// A colocation table of the artifact, by its path inside the artifact folder.
    #[allow(dead_code)] // not every test binary reads the extra tables
    pub fn table(&self, path: &str) -> ColocationData {
        let f = File::open(self.dir.join(path)).expect("artifact file readable");
        read_colocations(path, f).expect("table parses")
    }
}

/// Loads the artifact; panics when it is absent (only tests marked
/// `#[ignore = "needs ../shared/data/kace-artifact"]` call this).
pub fn load() -> Artifact {
    let dir = kace_test_support::artifact();
    let open = |p: &str| File::open(dir.join(p)).expect("artifact file readable");
    let pairs = read_colocations("pairs", open("pairs/MPS100_kernel_labels_targetMPS100.csv"))
        .expect("pair table parses");
    let splits =
        read_n_occur_splits("splits", open("splits/n_occur_splits.csv")).expect("splits parse");
    Artifact { dir, pairs, splits }
}
