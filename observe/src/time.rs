//! Times for people: Unix seconds as a UTC date, and spans as `1h 02m`. JSON keeps the Unix
//! seconds; only human output goes through here.

/// `YYYY-MM-DD HH:MM:SS UTC` for Unix seconds (`-` when not finite).
pub fn date(unix: f64) -> String {
    if !unix.is_finite() {
        return "-".into();
    }
    let secs = unix.floor() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A span of seconds: `45s`, `3m 05s`, `2h 07m`, `3d 04h`.
pub fn span(seconds: f64) -> String {
    if !seconds.is_finite() {
        return "-".into();
    }
    let neg = seconds < 0.0;
    let s = seconds.abs().round() as u64;
    let text = match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    };
    if neg {
        format!("-{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_spans() {
        assert_eq!(date(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date(951_913_805.0), "2000-03-01 12:30:05 UTC");
        assert_eq!(date(1_709_210_096.9), "2024-02-29 12:34:56 UTC");
        assert_eq!(date(f64::NAN), "-");
        assert_eq!(span(5.4), "5s");
        assert_eq!(span(185.0), "3m 05s");
        assert_eq!(span(7620.0), "2h 07m");
        assert_eq!(span(273_600.0), "3d 04h");
        assert_eq!(span(-61.0), "-1m 01s");
    }
}
