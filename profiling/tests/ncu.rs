//! `ncu::aggregate` on the three real Nsight Compute exports in `shared/data/ncu-samples`
//! (ignored unless run with `--include-ignored`) and on synthetic and malformed ones.

use kace_profiling::ncu::{aggregate, Layout, NcuError};

/// A real export from `../shared/data/ncu-samples` (only tests marked ignored call this).
fn read(name: &str) -> String {
    let path = kace_test_support::shared_file(&format!("ncu-samples/{name}"));
    // The files are not all valid UTF-8 in kernel names; lossy is what the CLI does too.
    String::from_utf8_lossy(&std::fs::read(&path).expect("read sample")).into_owned()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[test]
#[ignore = "needs ../shared/data/ncu-samples"]
fn cgcnn_raw_metric_names_match_the_reference_values() {
    let text = read("ai4materials_cgcnn-torch_ncu2020.2_details_cmdline-metrics.csv");
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
#[ignore = "needs ../shared/data/ncu-samples"]
fn bert_without_dram_throughput_names_the_missing_metric() {
    let text = read("leleucas_bert-mha-torch_ncu2021.2_details_launchstats.csv");
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
#[ignore = "needs ../shared/data/ncu-samples"]
fn bert_aggregates_once_dram_is_supplied() {
    let text = read("leleucas_bert-mha-torch_ncu2021.2_details_launchstats.csv");
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
#[ignore = "needs ../shared/data/ncu-samples"]
fn deepseek_without_launch_stats_names_registers() {
    let text = read("llm-perf-opt_deepseek-ocr_kernel0009_ncu2025_details_sol.csv");
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
#[ignore = "needs ../shared/data/ncu-samples"]
fn deepseek_picks_the_sol_memory_throughput_and_multiplies_tuples() {
    let text = read("llm-perf-opt_deepseek-ocr_kernel0009_ncu2025_details_sol.csv");
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

/// A details-page export of two kernels built row by row, for the nonsense cases below.
fn details(kernels: &[(&str, &str)], cut_last_after: Option<usize>) -> String {
    let mut s =
        String::from("\"ID\",\"Section Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n");
    let rows = |id: &str, grid: &str| {
        [
            ("gpu__time_duration.sum", "ns", "100"),
            ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "10"),
            ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "10"),
            ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "10"),
            ("launch__block_size", "", "128"),
            ("launch__grid_size", "", grid),
            ("launch__registers_per_thread", "register/thread", "32"),
            ("launch__shared_mem_per_block_static", "byte/block", "0"),
        ]
        .iter()
        .map(|(m, u, v)| format!("\"{id}\",\"s\",\"{m}\",\"{u}\",\"{v}\"\n"))
        .collect::<Vec<_>>()
    };
    for (i, (id, grid)) in kernels.iter().enumerate() {
        let mut r = rows(id, grid);
        if i + 1 == kernels.len() {
            if let Some(n) = cut_last_after {
                r.truncate(n);
            }
        }
        s.extend(r);
    }
    s
}

/// The audit's silent acceptances in `profile import-ncu` (§B.2).
#[test]
fn nonsense_exports_are_refused() {
    assert!(aggregate(&details(&[("0", "10"), ("1", "20")], None)).is_ok());
    // Cut at a line boundary inside the last kernel.
    let e = aggregate(&details(&[("0", "10"), ("1", "20")], Some(5))).unwrap_err();
    assert_eq!(e, NcuError::CutOff { id: "1".into(), rows: 5, expected: 8 });
    // Two launches sharing ID 0: merged silently before.
    let e = aggregate(&details(&[("0", "10"), ("0", "20")], None)).unwrap_err();
    assert!(e.to_string().contains("given twice for one kernel ID"), "{e}");
    let dup_raw =
        format!("{RAW}\"1\",\"k\",\"3\",\"50\",\"60\",\"70\",\"256\",\"4\",\"64\",\"0\"\n");
    assert_eq!(aggregate(&dup_raw), Err(NcuError::DuplicateId("1".into())));
    // A fractional grid.
    let e = aggregate(&details(&[("0", "0.001")], None)).unwrap_err();
    assert!(e.to_string().contains("whole number of at least 1"), "{e}");
    // Commas that are no thousands separators.
    let e = aggregate(&details(&[("0", "1,2,3,4")], None)).unwrap_err();
    assert!(matches!(e, NcuError::MissingMetric { .. }), "{e}");
    assert!(aggregate(&details(&[("0", "1,024")], None)).is_ok());
}
