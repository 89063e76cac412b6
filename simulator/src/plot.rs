//! An SVG of a comparison: each policy's job-completion-time CDF, and its running jobs per GPU
//! over time. Hand-written SVG; the caller writes the file.

use std::fmt::Write;

use crate::engine::Outcome;

const PALETTE: [&str; 8] =
    ["#7f7f7f", "#ff7f0e", "#2ca02c", "#1f77b4", "#d62728", "#9467bd", "#8c564b", "#e377c2"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

struct Panel {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Panel {
    fn frame(
        &self,
        s: &mut String,
        title: &str,
        x_label: &str,
        y_label: &str,
        xmax: f64,
        ymax: f64,
    ) {
        let (x, y, w, h) = (self.x, self.y, self.w, self.h);
        let _ = writeln!(
            s,
            r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="#333"/>"##
        );
        let _ =
            writeln!(s, r#"<text x="{x}" y="{}" font-size="13">{}</text>"#, y - 8.0, escape(title));
        for i in 0..=4 {
            let f = i as f64 / 4.0;
            let (gx, gy) = (x + f * w, y + h - f * h);
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                x + w,
                x - 4.0,
                gy + 4.0,
                tick(f * ymax)
            );
            let _ = writeln!(
                s,
                r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y + h + 16.0,
                tick(f * xmax)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x + w / 2.0,
            y + h + 34.0,
            escape(x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {:.1})">{}</text>"#,
            x - 40.0,
            y + h / 2.0,
            x - 40.0,
            y + h / 2.0,
            escape(y_label)
        );
    }

    fn polyline(&self, s: &mut String, pts: &[(f64, f64)], xmax: f64, ymax: f64, colour: &str) {
        let mut d = String::new();
        for (px, py) in pts {
            let sx = self.x + (px / xmax).clamp(0.0, 1.0) * self.w;
            let sy = self.y + self.h - (py / ymax).clamp(0.0, 1.0) * self.h;
            let _ = write!(d, "{sx:.1},{sy:.1} ");
        }
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.6"/>"#,
            d.trim_end()
        );
    }
}

fn tick(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The comparison chart of `runs` (label, outcome): completion-time CDFs (hours) on the left,
/// running jobs per GPU over time on the right.
pub fn comparison_svg(title: &str, runs: &[(&str, &Outcome)]) -> String {
    let (width, height) = (980.0, 430.0);
    let left = Panel { x: 70.0, y: 60.0, w: 360.0, h: 280.0 };
    let right = Panel { x: 540.0, y: 60.0, w: 360.0, h: 280.0 };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<text x="20" y="24" font-size="15">{}</text>"#, escape(title));
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
    left.frame(&mut s, "job completion time CDF", "hours", "fraction of jobs", xmax, 1.0);
    for (i, v) in cdfs.iter().enumerate() {
        let step = (v.len() / 400).max(1);
        let n = v.len() as f64;
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k + 1 == v.len())
            .map(|(k, t)| (*t, (k + 1) as f64 / n))
            .collect();
        left.polyline(&mut s, &pts, xmax, 1.0, PALETTE[i % PALETTE.len()]);
    }
    let tmax = runs
        .iter()
        .map(|(_, o)| o.finish.iter().copied().fold(0.0, f64::max) / 3600.0)
        .fold(0.0, f64::max)
        .max(1e-9);
    right.frame(&mut s, "running jobs per GPU", "hours", "jobs / GPU", tmax, 2.0);
    for (i, (_, o)) in runs.iter().enumerate() {
        let g = o.gpus.max(1) as f64;
        let pts: Vec<(f64, f64)> =
            o.timeline.points().iter().map(|(t, _, j)| (t / 3600.0, j / g)).collect();
        right.polyline(&mut s, &pts, tmax, 2.0, PALETTE[i % PALETTE.len()]);
    }
    for (i, (label, _)) in runs.iter().enumerate() {
        let x = 70.0 + i as f64 * 150.0;
        let colour = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="395" width="14" height="4" fill="{colour}"/><text x="{}" y="401">{}</text>"#,
            x + 18.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}
