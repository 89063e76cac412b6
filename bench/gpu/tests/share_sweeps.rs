//! The contract between `bench/gpu/run`'s joiner-share sweep (step 5b) and kace's sweep reader:
//! the `share-sweeps.csv` the script writes is what `kace_selector::dataset::read_mps_sweeps`
//! takes, lead unset (LS100) and joiner at p (BE p). The sample is a dry run's file as written;
//! `KACE_SHARE_SWEEPS_CSV=$OUT/share-sweeps.csv` checks a real run's file the same way.

use kace_selector::dataset::{read_mps_sweeps, ThreadSplit};

const SAMPLE: &str = r#"workload1,workload2,"(LS100, BE30)","(LS100, BE50)","(LS100, BE70)","(LS100, BE100)"
resnet18,mobilenet,"(46.22819974807988, 16.81959906971097)","(48.20849264678011, 25.359087222386954)","(32.51758955927069, 23.303677940187825)","(40.55541342836367, 49.690215640132394)"
mobilenet,resnet18,"(72.40091585772888, 12.27042776484789)","(None, None)","(54.34033668805669, 25.652248346202782)","(49.690215640132394, 40.55541342836367)"
"#;

fn check(source: &str, text: &str) {
    let rows = read_mps_sweeps(source, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!rows.is_empty(), "{source}: no rows");
    for r in &rows {
        for (split, _) in &r.cells {
            assert_eq!(split.first, 100, "{source}: the lead always runs unset");
        }
        assert!(r.cells.iter().any(|(_, v)| v.is_some()), "{source}: {:?} measured nothing", r);
    }
}

#[test]
fn the_runs_share_sweeps_are_what_kace_reads() {
    check("sample", SAMPLE);
    let rows = read_mps_sweeps("sample", SAMPLE.as_bytes()).unwrap();
    let at = |p| ThreadSplit { first: 100, second: p };
    assert_eq!(rows[0].workloads, ["resnet18".to_string(), "mobilenet".to_string()]);
    assert_eq!(rows[0].at(at(30)), Some([46.22819974807988, 16.81959906971097]));
    assert_eq!(rows[1].at(at(50)), None);
    assert_eq!(rows[1].at(ThreadSplit::DEFAULT), Some([49.690215640132394, 40.55541342836367]));
    if let Ok(path) = std::env::var("KACE_SHARE_SWEEPS_CSV") {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        check(&path, &text);
    }
}
