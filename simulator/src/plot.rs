//! An SVG of a comparison: each policy's job-completion-time CDF, and its running jobs per GPU
//! over time, drawn with kace's one SVG writer (kace-plot); the caller writes the file.
use kace_plot::{close, legend, open, text, Panel, GREY, PALETTE};

use crate::engine::Outcome;

/// Series colours: the first run (the baseline, exclusive FIFO) grey, the others coloured.
fn colour(i: usize) -> &'static str {
    if i == 0 {
        GREY
    } else {
        PALETTE[(i - 1) % (PALETTE.len() - 1)]
    }
}

/// A panel's title above its frame.
fn titled(s: &mut String, p: &Panel, title: &str) {
    text(s, p.x, p.y - 8.0, 13, title);
}

/// The comparison chart of `runs` (label, outcome): completion-time CDFs (hours) on the left,
/// running jobs per GPU over time on the right.
pub fn comparison_svg(title: &str, runs: &[(&str, &Outcome)]) -> String {
    let (width, height) = (980.0, 430.0);
    let left = Panel { x: 70.0, y: 60.0, w: 360.0, h: 280.0 };
    let right = Panel { x: 540.0, y: 60.0, w: 360.0, h: 280.0 };
    let mut s = open(width, height, 11);
    text(&mut s, 20.0, 24.0, 15, title);
    let cdfs: Vec<Vec<f64>> = runs
        .iter()
        .map(|(_, o)| {
            let mut v: Vec<f64> =
                o.finish.iter().zip(&o.submit).map(|(f, s)| (f - s) / 3600.0).collect();
            v.sort_unstable_by(f64::total_cmp);
            v
        })
        .collect();
    // The 99th percentile bounds the axis: the heavy tail would squash everything else.
    let xmax = cdfs
        .iter()
        .filter(|v| !v.is_empty())
        .map(|v| v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)])
        .fold(0.0, f64::max)
        .max(1e-9);
    titled(&mut s, &left, "job completion time CDF");
    left.axes(&mut s, xmax, 1.0, "hours", "fraction of jobs");
    for (i, v) in cdfs.iter().enumerate() {
        let step = (v.len() / 400).max(1);
        let n = v.len() as f64;
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k + 1 == v.len())
            .map(|(k, t)| (*t, (k + 1) as f64 / n))
            .collect();
        left.polyline(&mut s, &pts, xmax, 1.0, colour(i));
    }
    let tmax = runs
        .iter()
        .map(|(_, o)| o.finish.iter().copied().fold(0.0, f64::max) / 3600.0)
        .fold(0.0, f64::max)
        .max(1e-9);
    titled(&mut s, &right, "running jobs per GPU");
    right.axes(&mut s, tmax, 2.0, "hours", "jobs / GPU");
    for (i, (_, o)) in runs.iter().enumerate() {
        let g = o.gpus.max(1) as f64;
        let pts: Vec<(f64, f64)> =
            o.timeline.points().iter().map(|(t, _, j)| (t / 3600.0, j / g)).collect();
        right.polyline(&mut s, &pts, tmax, 2.0, colour(i));
    }
    for (i, (label, _)) in runs.iter().enumerate() {
        legend(&mut s, (70.0 + i as f64 * 150.0, 395.0), (14.0, 4.0), colour(i), label);
    }
    close(&mut s);
    s
}
