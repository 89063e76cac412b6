//! `ncu::aggregate` on the three real Nsight Compute exports in `shared/data/ncu-samples`
//! (skipped with a message when absent) and on synthetic and malformed ones.

use std::path::PathBuf;

use kace_profiling::ncu::{aggregate, Layout, NcuError};

/// `$KACE_DATA_DIR/ncu-samples`, default `<workspace>/../shared/data/ncu-samples`.
fn samples_dir() -> Option<PathBuf> {
    let base = std::env::var_os("KACE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    let dir = base.join("ncu-samples");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIP: {} not found (set KACE_DATA_DIR)", dir.display());
        None
    }
}

fn read(name: &str) -> Option<String> {
    let path = samples_dir()?.join(name);
    // The files are not all valid UTF-8 in kernel names; lossy is what the CLI does too.
    Some(String::from_utf8_lossy(&std::fs::read(&path).expect("read sample")).into_owned())
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[test]
fn cgcnn_raw_metric_names_match_the_reference_values() {
    let Some(text) = read("ai4materials_cgcnn-torch_ncu2020.2_details_cmdline-metrics.csv") else {
        return;
    };
    let m = aggregate(&text).unwrap();
    assert_eq!(m.layout, Layout::Details);
    assert_eq!(m.kernels, 14);
    assert!(close(m.total_duration_ns, 79_040.0, 1e-9), "{}", m.total_duration_ns);
    // Reference values from the samples README (KACE weighting, all 14 launches).
    assert!(close(m.threads, 24_983.423, 1e-7), "threads {}", m.threads);
    assert!(close(m.sm_throughput, 16.247097, 1e-6), "sm {}", m.sm_throughput);
    assert!(close(m.dram_throughput, 11.879247, 1e-6), "dram {}", m.dram_throughput);
    assert!(close(m.memory_throughput, 19.265534, 1e-6), "mem {}", m.memory_throughput);
    assert!(close(m.registers, 802_167.50, 1e-7), "regs {}", m.registers);
    assert!(close(m.static_shared_memory, 831_021.41, 1e-7), "smem {}", m.static_shared_memory);
}

#[test]
fn bert_without_dram_throughput_names_the_missing_metric() {
    let Some(text) = read("leleucas_bert-mha-torch_ncu2021.2_details_launchstats.csv") else {
        return;
    };
    // Duration is absent too, but cycles ÷ rate stands in for it; DRAM % has no substitute.
    let err = aggregate(&text).unwrap_err();
    match &err {
        NcuError::MissingMetric { names, kernels_missing, kernels, .. } => {
            assert_eq!(names[0], "DRAM Throughput");
            assert_eq!((*kernels_missing, *kernels), (26, 26));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string().contains("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "{err}"
    );
}

#[test]
fn bert_aggregates_once_dram_is_supplied() {
    let Some(text) = read("leleucas_bert-mha-torch_ncu2021.2_details_launchstats.csv") else {
        return;
    };
    // Append a DRAM % row per kernel (30 %) to exercise the Launch Statistics names and the
    // cycles ÷ rate duration on real rows.
    let mut extra = String::new();
    for id in 0..26 {
        extra.push_str(&format!(
            "\"{id}\",\"1\",\"p\",\"h\",\"k\",\"t\",\"1\",\"7\",\"GPU Speed Of Light Throughput\",\
             \"DRAM Throughput\",\"%\",\"30\"\n"
        ));
    }
    let m = aggregate(&format!("{text}\n{extra}")).unwrap();
    assert_eq!(m.kernels, 26);
    assert!(close(m.dram_throughput, 30.0, 1e-12));
    assert!(m.total_duration_ns > 0.0);
    // Launch Statistics "Threads" is ncu's own grid × block, so threads is a weighted mean of
    // integers ≥ 1 and registers ≥ threads.
    assert!(m.threads >= 1.0 && m.registers >= m.threads);
    assert!(m.sm_throughput > 0.0 && m.sm_throughput <= 100.0);
}

#[test]
fn deepseek_without_launch_stats_names_registers() {
    let Some(text) = read("llm-perf-opt_deepseek-ocr_kernel0009_ncu2025_details_sol.csv") else {
        return;
    };
    // Threads is derivable from the (x, y, z) columns; registers per thread is not there.
    let err = aggregate(&text).unwrap_err();
    match &err {
        NcuError::MissingMetric { names, kernels, .. } => {
            assert_eq!(names[0], "Registers Per Thread");
            assert_eq!(*kernels, 1);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn deepseek_picks_the_sol_memory_throughput_and_multiplies_tuples() {
    let Some(text) = read("llm-perf-opt_deepseek-ocr_kernel0009_ncu2025_details_sol.csv") else {
        return;
    };
    let extra = "\"0\",\"1\",\"p\",\"h\",\"k\",\"1\",\"7\",\"(32, 4, 1)\",\"(4, 12, 54)\",\"0\",\"12.0\",\
                 \"Launch Statistics\",\"Registers Per Thread\",\"register/thread\",\"96\",\n\
                 \"0\",\"1\",\"p\",\"h\",\"k\",\"1\",\"7\",\"(32, 4, 1)\",\"(4, 12, 54)\",\"0\",\"12.0\",\
                 \"Launch Statistics\",\"Static Shared Memory Per Block\",\"Kbyte/block\",\"1.5\",\n";
    let m = aggregate(&format!("{text}{extra}")).unwrap();
    assert_eq!(m.kernels, 1);
    assert!(close(m.total_duration_ns, 160_740.0, 1e-12), "{}", m.total_duration_ns);
    // 37.26 % (SOL), not the 657.28 Gbyte/s row of Memory Workload Analysis.
    assert!(close(m.memory_throughput, 37.26, 1e-12));
    assert!(close(m.sm_throughput, 36.75, 1e-12));
    assert!(close(m.dram_throughput, 37.26, 1e-12));
    assert!(close(m.threads, 128.0 * 2592.0, 1e-12));
    assert!(close(m.registers, 128.0 * 2592.0 * 96.0, 1e-12));
    assert!(close(m.static_shared_memory, 2592.0 * 1500.0, 1e-12));
}

/// A synthetic `--page raw` export (no real one of a DL workload exists, see the samples
/// README): header, units row, one row per kernel, mixed duration units.
const RAW: &str = "\
\"ID\",\"Kernel Name\",\"gpu__time_duration.sum\",\"sm__throughput.avg.pct_of_peak_sustained_elapsed\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed\",\"launch__block_size\",\"launch__grid_size\",\"launch__registers_per_thread\",\"launch__shared_mem_per_block_static\"
\"\",\"\",\"usecond\",\"%\",\"%\",\"%\",\"\",\"\",\"register/thread\",\"byte/block\"
\"0\",\"k(a, b)\",\"1\",\"10\",\"20\",\"30\",\"128\",\"10\",\"32\",\"1,024\"
\"1\",\"k(a, b)\",\"3\",\"50\",\"60\",\"70\",\"256\",\"4\",\"64\",\"0\"
";

#[test]
fn raw_page_is_read_with_its_units_row() {
    let m = aggregate(RAW).unwrap();
    assert_eq!(m.layout, Layout::Raw);
    assert_eq!(m.kernels, 2);
    assert!(close(m.total_duration_ns, 4000.0, 1e-12));
    // weights 1 and 3
    assert!(close(m.sm_throughput, (10.0 + 150.0) / 4.0, 1e-12));
    assert!(close(m.threads, (1280.0 + 3.0 * 1024.0) / 4.0, 1e-12));
    assert!(close(m.registers, (1280.0 * 32.0 + 3.0 * 1024.0 * 64.0) / 4.0, 1e-12));
    assert!(close(m.static_shared_memory, (10.0 * 1024.0) / 4.0, 1e-12));
}

#[test]
fn malformed_exports_are_errors_not_panics() {
    assert_eq!(aggregate(""), Err(NcuError::NoHeader));
    assert_eq!(aggregate("hello\nworld\n"), Err(NcuError::NoHeader));
    assert_eq!(
        aggregate("\"ID\",\"Metric Name\",\"Metric Value\"\n"),
        Err(NcuError::MissingColumn("Section Name"))
    );
    let header = "\"ID\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n";
    assert_eq!(aggregate(header), Err(NcuError::NoKernels));
    // Unknown duration unit.
    let bad_unit = format!("{header}\"0\",\"s\",\"gpu__time_duration.sum\",\"fortnight\",\"3\"\n");
    assert!(matches!(aggregate(&bad_unit), Err(NcuError::BadValue { .. })));
    // A truncated file: the last row stops mid-field.
    let mut cut = RAW.to_string();
    cut.truncate(cut.len() - 12);
    assert!(aggregate(&cut).is_err());
    // Zero durations.
    let zero = format!(
        "{header}\"0\",\"x\",\"gpu__time_duration.sum\",\"ns\",\"0\"\n\
         \"0\",\"x\",\"sm__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"1\"\n\
         \"0\",\"x\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"1\"\n\
         \"0\",\"x\",\"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"1\"\n\
         \"0\",\"x\",\"launch__block_size\",\"\",\"1\"\n\"0\",\"x\",\"launch__grid_size\",\"\",\"1\"\n\
         \"0\",\"x\",\"launch__registers_per_thread\",\"\",\"1\"\n\
         \"0\",\"x\",\"launch__shared_mem_per_block_static\",\"byte/block\",\"1\"\n"
    );
    assert_eq!(aggregate(&zero), Err(NcuError::ZeroDuration));
    // Binary junk.
    let junk: String = (0u8..=255).map(char::from).collect();
    assert!(aggregate(&junk).is_err());
}
