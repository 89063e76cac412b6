//! Ordinary least squares with intercept (minimum-norm, so rank-deficient inputs still solve),
//! and the paper's linear model: OLS on z-scored features and target.

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::error::SelectorError;
use crate::zscore::ZScore;

/// Fits `y ≈ intercept + X·coefficients` by least squares. Rank-deficient or collinear columns
/// get the minimum-norm solution (singular values below `max(n, p) · ε · σ_max` are dropped, as
/// LAPACK's `gelsd` does for scikit-learn).
pub fn ols_with_intercept<R: AsRef<[f64]>>(
    rows: &[R],
    y: &[f64],
) -> Result<(f64, Vec<f64>), SelectorError> {
    let c = Centred::new(rows, y)?;
    let (n, p) = (rows.len(), c.x_mean.len());
    let (x, yc) = (&c.x, &c.y);
    let coef: Vec<f64> = if p == 0 {
        Vec::new()
    } else {
        let svd = x.clone().svd(true, true);
        let smax = svd.singular_values.iter().cloned().fold(0.0, f64::max);
        let eps = (n.max(p) as f64) * f64::EPSILON * smax;
        let sol = svd
            .solve(yc, eps)
            .map_err(|e| SelectorError::Numerical(format!("least squares failed: {e}")))?;
        sol.iter().copied().collect()
    };
    Ok((c.intercept(&coef), coef))
}

/// Validated rows and targets with every column centred, so that the intercept drops out of
/// the system and is recovered from the means afterwards.
struct Centred {
    x_mean: Vec<f64>,
    y_mean: f64,
    x: DMatrix<f64>,
    y: DVector<f64>,
}

impl Centred {
    fn new<R: AsRef<[f64]>>(rows: &[R], y: &[f64]) -> Result<Centred, SelectorError> {
        let n = rows.len();
        if n == 0 {
            return Err(SelectorError::EmptyTrainingSet);
        }
        if y.len() != n {
            return Err(SelectorError::DimensionMismatch { expected: n, found: y.len() });
        }
        let p = rows[0].as_ref().len();
        for (i, r) in rows.iter().enumerate() {
            let r = r.as_ref();
            if r.len() != p {
                return Err(SelectorError::DimensionMismatch { expected: p, found: r.len() });
            }
            if let Some(j) = r.iter().position(|v| !v.is_finite()) {
                return Err(SelectorError::NonFinite { row: i, column: j });
            }
        }
        if let Some(i) = y.iter().position(|v| !v.is_finite()) {
            return Err(SelectorError::NonFinite { row: i, column: p });
        }
        let x_mean: Vec<f64> =
            (0..p).map(|j| rows.iter().map(|r| r.as_ref()[j]).sum::<f64>() / n as f64).collect();
        let y_mean = y.iter().sum::<f64>() / n as f64;
        let x = DMatrix::from_fn(n, p, |i, j| rows[i].as_ref()[j] - x_mean[j]);
        let y = DVector::from_iterator(n, y.iter().map(|v| v - y_mean));
        Ok(Centred { x_mean, y_mean, x, y })
    }

    fn intercept(&self, coef: &[f64]) -> f64 {
        self.y_mean - coef.iter().zip(&self.x_mean).map(|(c, m)| c * m).sum::<f64>()
    }
}

/// The paper's model: OLS fitted on z-scored features and z-scored target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearModel {
    /// Normalisation of the features, from the fit set (ddof = 1).
    pub x_scale: ZScore,
    /// Mean of the target over the fit set.
    pub y_mean: f64,
    /// Sample standard deviation of the target over the fit set.
    pub y_std: f64,
    /// Intercept in z-scored space (≈ 0 by construction).
    pub intercept: f64,
    /// Coefficients in z-scored space, one per feature.
    pub coefficients: Vec<f64>,
}

impl LinearModel {
    /// Fits the model on raw feature rows and raw targets.
    pub fn fit<R: AsRef<[f64]>>(rows: &[R], y: &[f64]) -> Result<LinearModel, SelectorError> {
        if rows.is_empty() {
            return Err(SelectorError::EmptyTrainingSet);
        }
        let width = rows[0].as_ref().len();
        let x_scale = ZScore::fit(rows, width, 1);
        let (y_mean, y_std) = ZScore::fit_column(y, 1);
        let xz: Vec<Vec<f64>> = rows.iter().map(|r| x_scale.apply(r.as_ref())).collect();
        let yz: Vec<f64> = y.iter().map(|v| (v - y_mean) / y_std).collect();
        let (intercept, coefficients) = ols_with_intercept(&xz, &yz)?;
        Ok(LinearModel { x_scale, y_mean, y_std, intercept, coefficients })
    }

    /// Number of input features.
    pub fn width(&self) -> usize {
        self.coefficients.len()
    }

    /// Prediction in z-scored target units for a row already normalised.
    #[inline]
    pub fn predict_normalised(&self, z: &[f64]) -> f64 {
        self.intercept + self.coefficients.iter().zip(z).map(|(c, v)| c * v).sum::<f64>()
    }

    /// Prediction in z-scored target units, normalising the row with `scale` (the fit set's,
    /// or — in the paper's evaluation — the candidate set's own).
    #[inline]
    pub fn predict_with_scale(&self, row: &[f64], scale: &ZScore) -> f64 {
        let mut acc = self.intercept;
        for (j, (c, v)) in self.coefficients.iter().zip(row).enumerate() {
            acc += c * scale.apply_one(j, *v);
        }
        acc
    }

    /// Prediction in the target's own units, normalising with the fit set's statistics.
    #[inline]
    pub fn predict(&self, row: &[f64]) -> f64 {
        self.y_mean + self.y_std * self.predict_with_scale(row, &self.x_scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_known_coefficients_exactly() {
        let rows: Vec<[f64; 3]> =
            (0..20).map(|i| [i as f64, ((i * 7) % 5) as f64, ((i * i) % 11) as f64]).collect();
        let y: Vec<f64> =
            rows.iter().map(|r| 3.0 + 2.0 * r[0] - 1.5 * r[1] + 0.25 * r[2]).collect();
        let (b0, c) = ols_with_intercept(&rows, &y).unwrap();
        assert!((b0 - 3.0).abs() < 1e-10, "{b0}");
        for (got, want) in c.iter().zip([2.0, -1.5, 0.25]) {
            assert!((got - want).abs() < 1e-10, "{got} vs {want}");
        }
    }

    #[test]
    fn rank_deficient_input_gets_minimum_norm_solution() {
        // Column 1 duplicates column 0: any split of the weight fits; minimum norm splits evenly.
        let rows: Vec<[f64; 2]> = (0..10).map(|i| [i as f64, i as f64]).collect();
        let y: Vec<f64> = rows.iter().map(|r| 1.0 + 4.0 * r[0]).collect();
        let (b0, c) = ols_with_intercept(&rows, &y).unwrap();
        assert!((b0 - 1.0).abs() < 1e-9);
        assert!((c[0] - 2.0).abs() < 1e-9 && (c[1] - 2.0).abs() < 1e-9, "{c:?}");
        // More features than rows also solves.
        let wide = [[1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 0.0, 1.0]];
        let (_, c) = ols_with_intercept(&wide, &[1.0, 2.0]).unwrap();
        assert_eq!(c.len(), 4);
        assert!(c.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let empty: [[f64; 2]; 0] = [];
        assert!(matches!(ols_with_intercept(&empty, &[]), Err(SelectorError::EmptyTrainingSet)));
        assert!(matches!(
            ols_with_intercept(&[[1.0], [2.0]], &[1.0]),
            Err(SelectorError::DimensionMismatch { .. })
        ));
        assert!(matches!(
            ols_with_intercept(&[[1.0], [f64::NAN]], &[1.0, 2.0]),
            Err(SelectorError::NonFinite { row: 1, column: 0 })
        ));
    }

    #[test]
    fn linear_model_predicts_in_target_units() {
        let rows: Vec<[f64; 2]> = (0..12).map(|i| [i as f64, ((i * 5) % 7) as f64]).collect();
        let y: Vec<f64> = rows.iter().map(|r| 10.0 + 3.0 * r[0] - r[1]).collect();
        let m = LinearModel::fit(&rows, &y).unwrap();
        assert!(m.intercept.abs() < 1e-12);
        for (r, want) in rows.iter().zip(&y) {
            assert!((m.predict(r) - want).abs() < 1e-9);
        }
    }
}

/// Ridge regression with an unpenalised intercept: minimises `‖y − b − Xw‖² + α‖w‖²`, with
/// every column centred first (as scikit-learn's `Ridge(fit_intercept=True)` does). Solves the
/// primal system when there are fewer columns than rows, the dual one otherwise, so a model with
/// many per-workload columns still trains in microseconds.
pub fn ridge_with_intercept<R: AsRef<[f64]>>(
    rows: &[R],
    y: &[f64],
    alpha: f64,
) -> Result<(f64, Vec<f64>), SelectorError> {
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(SelectorError::Invalid(format!("ridge strength must be > 0, got {alpha}")));
    }
    let c = Centred::new(rows, y)?;
    let w = solve_ridge(&c.x, &c.y, alpha)?;
    let coef: Vec<f64> = w.iter().copied().collect();
    Ok((c.intercept(&coef), coef))
}

/// [`ridge_with_intercept`] with a non-negative weight per row: minimises
/// `Σ wᵢ (yᵢ − b − xᵢ·w)² + α‖w‖²` (weighted centring, then rows scaled by √wᵢ). The robust
/// slowdown fit calls it once per reweighting step.
pub fn weighted_ridge_with_intercept<R: AsRef<[f64]>>(
    rows: &[R],
    y: &[f64],
    weights: &[f64],
    alpha: f64,
) -> Result<(f64, Vec<f64>), SelectorError> {
    if weights.len() != rows.len() {
        return Err(SelectorError::DimensionMismatch {
            expected: rows.len(),
            found: weights.len(),
        });
    }
    if let Some(i) = weights.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
        return Err(SelectorError::Invalid(format!("row {i}: weight must be a number ≥ 0")));
    }
    let total: f64 = weights.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return Err(SelectorError::EmptyTrainingSet);
    }
    let n = rows.len();
    let p = rows.first().map_or(0, |r| r.as_ref().len());
    let x_mean: Vec<f64> = (0..p)
        .map(|j| rows.iter().zip(weights).map(|(r, w)| w * r.as_ref()[j]).sum::<f64>() / total)
        .collect();
    let y_mean = y.iter().zip(weights).map(|(v, w)| w * v).sum::<f64>() / total;
    let scaled: Vec<Vec<f64>> = rows
        .iter()
        .zip(weights)
        .map(|(r, w)| r.as_ref().iter().zip(&x_mean).map(|(v, m)| w.sqrt() * (v - m)).collect())
        .collect();
    let ys: Vec<f64> = y.iter().zip(weights).map(|(v, w)| w.sqrt() * (v - y_mean)).collect();
    // Centred with the weighted means: the plain solver's unweighted centring would be wrong.
    let x = DMatrix::from_fn(n, p, |i, j| scaled[i][j]);
    let yc = DVector::from_vec(ys);
    let w = solve_ridge(&x, &yc, alpha)?;
    let coef: Vec<f64> = w.iter().copied().collect();
    let b = y_mean - coef.iter().zip(&x_mean).map(|(c, m)| c * m).sum::<f64>();
    Ok((b, coef))
}

/// Solves `(XᵀX + αI) w = Xᵀy` on centred data, in the primal or dual form, whichever is
/// smaller.
fn solve_ridge(
    x: &DMatrix<f64>,
    yc: &DVector<f64>,
    alpha: f64,
) -> Result<DVector<f64>, SelectorError> {
    let (n, p) = x.shape();
    let singular = || SelectorError::Numerical("ridge system is not positive definite".into());
    Ok(if p <= n {
        let mut a = x.tr_mul(x);
        for j in 0..p {
            a[(j, j)] += alpha;
        }
        a.cholesky().ok_or_else(singular)?.solve(&x.tr_mul(yc))
    } else {
        let mut k = x * x.transpose();
        for i in 0..n {
            k[(i, i)] += alpha;
        }
        x.tr_mul(&k.cholesky().ok_or_else(singular)?.solve(yc))
    })
}

#[cfg(test)]
mod ridge_tests {
    use super::*;

    #[test]
    fn ridge_shrinks_towards_ols_as_alpha_vanishes_and_primal_equals_dual() {
        let rows: Vec<[f64; 2]> = (0..30).map(|i| [i as f64, ((i * 7) % 11) as f64]).collect();
        let y: Vec<f64> = rows.iter().map(|r| 1.0 + 0.5 * r[0] - 2.0 * r[1]).collect();
        let (b, w) = ridge_with_intercept(&rows, &y, 1e-9).unwrap();
        assert!((b - 1.0).abs() < 1e-6 && (w[0] - 0.5).abs() < 1e-8 && (w[1] + 2.0).abs() < 1e-8);
        let (_, strong) = ridge_with_intercept(&rows, &y, 1e6).unwrap();
        assert!(strong.iter().all(|c| c.abs() < 0.05), "{strong:?}");
        // More columns than rows goes through the dual system; it must agree with the primal one
        // computed on the transposed-size problem (here: compare with a direct normal-equation
        // solve on the same wide data).
        let wide: Vec<[f64; 5]> = (0..4)
            .map(|i| {
                let f = i as f64;
                [f, f * f, (f * 3.0) % 5.0, 1.0 / (1.0 + f), (f * 7.0) % 3.0]
            })
            .collect();
        let yw = [1.0, 3.0, 2.0, 5.0];
        let (bd, wd) = ridge_with_intercept(&wide, &yw, 0.5).unwrap();
        let n = wide.len();
        let mean: Vec<f64> =
            (0..5).map(|j| wide.iter().map(|r| r[j]).sum::<f64>() / n as f64).collect();
        let x = DMatrix::from_fn(n, 5, |i, j| wide[i][j] - mean[j]);
        let ym = yw.iter().sum::<f64>() / n as f64;
        let yc = DVector::from_iterator(n, yw.iter().map(|v| v - ym));
        let a = x.tr_mul(&x) + DMatrix::identity(5, 5) * 0.5;
        let wp = a.cholesky().unwrap().solve(&x.tr_mul(&yc));
        for j in 0..5 {
            assert!((wd[j] - wp[j]).abs() < 1e-10);
        }
        let bp = ym - (0..5).map(|j| wp[j] * mean[j]).sum::<f64>();
        assert!((bd - bp).abs() < 1e-10);
        assert!(ridge_with_intercept(&rows, &y, 0.0).is_err());
    }
}
