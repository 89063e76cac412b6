//! kace's one SVG writer: the pieces every chart is drawn from (escaping, the palette, axis
//! bounds and tick labels, a panel with its axes and lines, the document's frame) and the bar
//! charts of `kace eval` ([`bars`]). Pure string building, no dependencies: the caller writes
//! the file. `kace report` (kace-observe) and `kace simulate` (kace-simulator) compose their
//! charts from these.
#![warn(missing_docs)]

use std::fmt::Write;

pub mod bars;

/// The series colours, in order (matplotlib's tab10 without its last two).
pub const PALETTE: [&str; 8] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// The palette's grey, for a baseline drawn beside coloured series.
pub const GREY: &str = PALETTE[7];

/// `s` as SVG text or attribute content.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A document's opening tag.
pub fn open(width: f64, height: f64, font_size: u32) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         font-family=\"sans-serif\" font-size=\"{font_size}\">\n"
    )
}

/// Closes the document `s`.
pub fn close(s: &mut String) {
    s.push_str("</svg>\n");
}

/// A line of text at (x, y) of the given size.
pub fn text(s: &mut String, x: f64, y: f64, font_size: u32, text: &str) {
    let _ = writeln!(s, r#"<text x="{x}" y="{y}" font-size="{font_size}">{}</text>"#, escape(text));
}

/// A legend entry: a colour swatch of `w` × `h` at (x, y) and its label beside it.
pub fn legend(s: &mut String, (x, y): (f64, f64), (w, h): (f64, f64), colour: &str, label: &str) {
    let _ = writeln!(
        s,
        r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}"/><text x="{}" y="{}">{}</text>"#,
        x + w + 4.0,
        y + h.max(6.0),
        escape(label)
    );
}

/// A "nice" upper bound for an axis reaching `max` (1, 2, 2.5 or 5 times a power of ten).
pub fn nice(max: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= max {
            return m * p;
        }
    }
    10.0 * p
}

/// A tick label with as many decimals as the axis's step needs, the same for every tick.
pub fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step.fract() == 0.0 {
        0
    } else if (step * 10.0).fract().abs() < 1e-9 {
        1
    } else {
        2
    };
    format!("{v:.decimals$}")
}

/// A plot area at (x, y) of size w × h, drawing ranges [0, xmax] × [0, ymax].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Panel {
    /// Left edge.
    pub x: f64,
    /// Top edge.
    pub y: f64,
    /// Width.
    pub w: f64,
    /// Height.
    pub h: f64,
}

impl Panel {
    /// The frame, four grid lines with the y ticks, the x ticks (none when `xmax` is 0: a
    /// category axis its caller labels) and both axis labels.
    pub fn axes(&self, s: &mut String, xmax: f64, ymax: f64, x_label: &str, y_label: &str) {
        let (x, y, w, h) = (self.x, self.y, self.w, self.h);
        let _ = writeln!(
            s,
            r##"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##
        );
        for i in 0..=4 {
            let f = f64::from(i) / 4.0;
            let (tx, ty) = (x + f * w, y + h - f * h);
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                x + w,
                x - 4.0,
                ty + 4.0,
                tick_label(f * ymax, ymax / 4.0)
            );
            if xmax > 0.0 {
                let _ = writeln!(
                    s,
                    r##"<text x="{tx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                    y + h + 14.0,
                    tick_label(f * xmax, xmax / 4.0)
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            x + w / 2.0,
            y + h + 30.0,
            escape(x_label)
        );
        let _ = writeln!(
            s,
            r##"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            x - 38.0,
            y + h / 2.0,
            escape(y_label)
        );
    }

    /// Where the value (vx, vy) lies in the panel, clamped to it.
    pub fn at(&self, (vx, vy): (f64, f64), xmax: f64, ymax: f64) -> (f64, f64) {
        let fx = if xmax > 0.0 { (vx / xmax).clamp(0.0, 1.0) } else { 0.0 };
        let fy = if ymax > 0.0 { (vy / ymax).clamp(0.0, 1.0) } else { 0.0 };
        (self.x + fx * self.w, self.y + self.h - fy * self.h)
    }

    /// A line through `pts` (values, in order).
    pub fn polyline(&self, s: &mut String, pts: &[(f64, f64)], xmax: f64, ymax: f64, colour: &str) {
        let mut d = String::new();
        for p in pts {
            let (sx, sy) = self.at(*p, xmax, ymax);
            let _ = write!(d, "{sx:.1},{sy:.1} ");
        }
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.6"/>"#,
            d.trim_end()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_share_their_decimals() {
        assert_eq!((tick_label(0.0, 0.5), tick_label(1.5, 0.5)), ("0.0".into(), "1.5".into()));
        assert_eq!(tick_label(37.5, 12.5), "37.5");
        assert_eq!(tick_label(50.0, 25.0), "50");
        assert_eq!(tick_label(0.25, 0.25), "0.25");
    }

    #[test]
    fn nice_bounds() {
        assert_eq!(nice(37.0), 50.0);
        assert_eq!(nice(0.8), 1.0);
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(f64::NAN), 1.0);
        assert_eq!(nice(101.0), 200.0);
    }

    #[test]
    fn a_panel_maps_and_clamps_values_and_escapes_its_labels() {
        let p = Panel { x: 10.0, y: 20.0, w: 100.0, h: 50.0 };
        assert_eq!(p.at((0.0, 0.0), 4.0, 2.0), (10.0, 70.0));
        assert_eq!(p.at((4.0, 2.0), 4.0, 2.0), (110.0, 20.0));
        assert_eq!(p.at((9.0, -1.0), 4.0, 2.0), (110.0, 70.0));
        let mut s = open(200.0, 100.0, 11);
        p.axes(&mut s, 4.0, 2.0, "a<b", "jobs \"per\" GPU");
        p.polyline(&mut s, &[(0.0, 0.0), (2.0, 1.0)], 4.0, 2.0, PALETTE[0]);
        close(&mut s);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains(">a&lt;b<") && s.contains("jobs &quot;per&quot; GPU"));
        assert!(s.contains(r#"points="10.0,70.0 60.0,45.0""#), "{s}");
        // Five y ticks and five x ticks: 0, 1, 2, 3, 4 on x.
        assert_eq!(s.matches("text-anchor=\"end\"").count(), 5);
        assert!(s.contains(">3<"));
    }
}
