//! Bar charts of evaluation results (`kace eval … --plot`): one bar per policy (the paper's
//! Fig. 4) and grouped bars per target workload (its Fig. 5), on a 0…1 axis of normalised
//! throughput.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::{close, escape, legend, open, text, PALETTE};

/// A bar chart of `values` (label, value in 0…1), in the given order.
pub fn policy_bars(title: &str, values: &[(String, f64)]) -> String {
    let (bar, gap, left, top, height) = (46.0, 18.0, 60.0, 40.0, 260.0);
    let width = left + values.len() as f64 * (bar + gap) + 20.0;
    let mut s = open(width, top + height + 110.0, 12);
    text(&mut s, left, 22.0, 15, title);
    axis(&mut s, left, top, height, width - 20.0);
    for (i, (label, v)) in values.iter().enumerate() {
        let x = left + gap / 2.0 + i as f64 * (bar + gap);
        let h = v.clamp(0.0, 1.0) * height;
        let y = top + height - h;
        let colour = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{bar}" height="{h:.1}" fill="{colour}"><title>{}: {v:.4}</title></rect>"#,
            escape(label)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{v:.3}</text>"#,
            x + bar / 2.0,
            y - 4.0
        );
        let (lx, ly) = (x + bar / 2.0, top + height + 14.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="end" transform="rotate(-40 {lx:.1} {ly:.1})">{}</text>"#,
            escape(label)
        );
    }
    close(&mut s);
    s
}

/// Grouped bars: for each target (x axis), one bar per series (policy).
pub fn per_target_bars(
    title: &str,
    series: &[&str],
    per_target: &BTreeMap<String, BTreeMap<String, f64>>,
) -> String {
    let (bar, gap, left, top, height) = (10.0, 14.0, 60.0, 60.0, 260.0);
    let group_w = series.len() as f64 * bar + gap;
    let width = left + per_target.len() as f64 * group_w + 20.0;
    let mut s = open(width, top + height + 190.0, 11);
    text(&mut s, left, 20.0, 15, title);
    for (j, name) in series.iter().enumerate() {
        let x = left + j as f64 * 110.0;
        legend(&mut s, (x, 32.0), (10.0, 10.0), PALETTE[j % PALETTE.len()], name);
    }
    axis(&mut s, left, top, height, width - 20.0);
    for (i, (target, values)) in per_target.iter().enumerate() {
        let x0 = left + gap / 2.0 + i as f64 * group_w;
        for (j, name) in series.iter().enumerate() {
            let Some(v) = values.get(*name) else { continue };
            let h = v.clamp(0.0, 1.0) * height;
            let colour = PALETTE[j % PALETTE.len()];
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{bar}" height="{h:.1}" fill="{colour}"><title>{} {}: {v:.4}</title></rect>"#,
                x0 + j as f64 * bar,
                top + height - h,
                escape(target),
                escape(name)
            );
        }
        let (lx, ly) = (x0 + series.len() as f64 * bar / 2.0, top + height + 12.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="end" transform="rotate(-60 {lx:.1} {ly:.1})">{}</text>"#,
            escape(target)
        );
    }
    close(&mut s);
    s
}

fn axis(s: &mut String, left: f64, top: f64, height: f64, right: f64) {
    for t in 0..=5 {
        let v = t as f64 / 5.0;
        let y = top + height - v * height;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{v:.1}</text>"##,
            left - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.0}" transform="rotate(-90 14 {:.0})" text-anchor="middle">normalised throughput (oracle = 1)</text>"#,
        top + height / 2.0,
        top + height / 2.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg_with_every_label() {
        let svg = policy_bars("n_occur=3", &[("kace-lr".into(), 0.9), ("a<b".into(), 1.4)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("kace-lr") && svg.contains("a&lt;b"));
        assert_eq!(svg.matches("<rect").count(), 2);
        let mut per = BTreeMap::new();
        per.insert("w1".to_string(), BTreeMap::from([("kace-lr".to_string(), 0.5)]));
        per.insert("w2".to_string(), BTreeMap::from([("memcap".to_string(), 0.7)]));
        let svg = per_target_bars("t", &["kace-lr", "memcap"], &per);
        assert_eq!(svg.matches("<rect").count(), 2 + 2); // two bars and two legend boxes
        assert!(svg.contains(">w1<") && svg.contains(">w2<"));
    }
}
