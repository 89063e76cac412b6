//! Finding and loading the KACE artifact's data for the integration tests. The data stay in
//! `../shared/data/kace-artifact` (or `$KACE_ARTIFACT_DIR`); without them a test prints why and
//! checks nothing.

use std::fs::File;
use std::path::PathBuf;

use kace_selector::dataset::{read_colocations, read_n_occur_splits, ColocationData, SplitRow};

/// The artifact folder, or `None` (with a message saying where it was looked for).
pub fn artifact_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KACE_ARTIFACT_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/kace-artifact")
    });
    if dir.join("pairs/MPS100_kernel_labels_targetMPS100.csv").is_file() {
        Some(dir)
    } else {
        eprintln!("skipping: artifact data not found at {} (set KACE_ARTIFACT_DIR)", dir.display());
        None
    }
}

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

/// Loads the artifact, or `None` when it is absent.
pub fn load() -> Option<Artifact> {
    let dir = artifact_dir()?;
    let open = |p: &str| File::open(dir.join(p)).expect("artifact file readable");
    let pairs = read_colocations("pairs", open("pairs/MPS100_kernel_labels_targetMPS100.csv"))
        .expect("pair table parses");
    let splits =
        read_n_occur_splits("splits", open("splits/n_occur_splits.csv")).expect("splits parse");
    Some(Artifact { dir, pairs, splits })
}
