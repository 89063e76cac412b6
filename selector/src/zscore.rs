//! Z-score normalisation: per-column mean and standard deviation, and their application.

use serde::{Deserialize, Serialize};

/// Per-column mean and standard deviation, learnt from a set of rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZScore {
    /// Column means.
    pub mean: Vec<f64>,
    /// Column standard deviations. A column with no spread stores 1.0, so it maps to 0 instead
    /// of NaN (as scikit-learn's `StandardScaler` does); the model then ignores it.
    pub std: Vec<f64>,
}

impl ZScore {
    /// Learns means and standard deviations from `rows` (each of the same width), with `ddof`
    /// delta degrees of freedom (1 = sample std, as pandas; 0 = population std).
    ///
    /// With fewer than `ddof + 1` rows the spread is undefined and every std is 1.0.
    pub fn fit<R: AsRef<[f64]>>(rows: &[R], width: usize, ddof: usize) -> ZScore {
        let n = rows.len();
        let mut mean = vec![0.0; width];
        for r in rows {
            for (m, v) in mean.iter_mut().zip(r.as_ref()) {
                *m += v;
            }
        }
        if n > 0 {
            mean.iter_mut().for_each(|m| *m /= n as f64);
        }
        let mut std = vec![1.0; width];
        if n > ddof {
            let mut ss = vec![0.0; width];
            for r in rows {
                for ((s, v), m) in ss.iter_mut().zip(r.as_ref()).zip(&mean) {
                    *s += (v - m) * (v - m);
                }
            }
            for ((s, acc), m) in std.iter_mut().zip(ss).zip(&mean) {
                let sd = (acc / (n - ddof) as f64).sqrt();
                // A constant column's computed spread is rounding noise (~1e-16 × its value);
                // dividing by it would turn that noise into ±1.
                let noise = 1e-12 * m.abs().max(f64::MIN_POSITIVE);
                *s = if sd > noise && sd.is_finite() { sd } else { 1.0 };
            }
        }
        ZScore { mean, std }
    }

    /// Learns the mean and std of a single column of values.
    pub fn fit_column(values: &[f64], ddof: usize) -> (f64, f64) {
        let rows: Vec<[f64; 1]> = values.iter().map(|v| [*v]).collect();
        let z = ZScore::fit(&rows, 1, ddof);
        (z.mean[0], z.std[0])
    }

    /// Number of columns.
    pub fn width(&self) -> usize {
        self.mean.len()
    }

    /// Normalises one value of column `j`.
    #[inline]
    pub fn apply_one(&self, j: usize, v: f64) -> f64 {
        (v - self.mean[j]) / self.std[j]
    }

    /// Normalises a row into `out`.
    pub fn apply_into(&self, row: &[f64], out: &mut [f64]) {
        for (j, (o, v)) in out.iter_mut().zip(row).enumerate() {
            *o = self.apply_one(j, *v);
        }
    }

    /// Normalises a row into a new vector.
    pub fn apply(&self, row: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; row.len()];
        self.apply_into(row, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_and_population_std() {
        let rows = [[1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [4.0, 5.0]];
        let s = ZScore::fit(&rows, 2, 1);
        assert_eq!(s.mean, vec![2.5, 5.0]);
        assert!((s.std[0] - (5.0f64 / 3.0).sqrt()).abs() < 1e-15);
        // A constant column keeps std 1.0 so it normalises to 0, not NaN.
        assert_eq!(s.std[1], 1.0);
        assert_eq!(s.apply(&[2.5, 5.0]), vec![0.0, 0.0]);
        let p = ZScore::fit(&rows, 2, 0);
        assert!((p.std[0] - 1.25f64.sqrt()).abs() < 1e-15);
    }

    #[test]
    fn rounding_noise_is_not_spread() {
        let v = 0.6931471805599448;
        let rows = [[v], [v], [v], [v], [v], [v], [v]];
        assert_eq!(ZScore::fit(&rows, 1, 0).std, vec![1.0]);
    }

    #[test]
    fn too_few_rows_give_unit_std() {
        let s = ZScore::fit(&[[3.0]], 1, 1);
        assert_eq!((s.mean[0], s.std[0]), (3.0, 1.0));
        let e: [[f64; 1]; 0] = [];
        assert_eq!(ZScore::fit(&e, 1, 1).std, vec![1.0]);
    }
}
