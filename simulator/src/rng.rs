//! A tiny deterministic random number generator (SplitMix64) and the distributions the trace
//! generator needs (exponential gaps, bounded-Pareto lengths, Zipf users). Written here rather
//! than pulling in `rand`: traces must be reproducible from a seed across versions, and a few
//! functions are all we use.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, trivially seedable.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator from a seed; equal seeds give equal streams.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (n > 0). Lemire's multiply-shift; the bias is below 2^-32 for the small
    /// n used here, far under anything a simulation could notice.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 32).wrapping_mul(n as u64) >> 32) as usize
    }

    /// Exponentially distributed with the given rate (mean 1 / rate).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        // 1 − u lies in (0, 1], so the logarithm is finite.
        -(1.0 - self.next_f64()).ln() / rate
    }
}

/// A Pareto distribution truncated to [low, low × ratio]: heavy-tailed job lengths that still
/// end (an untruncated α ≤ 2 Pareto has infinite variance and would make makespans meaningless).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundedPareto {
    /// Tail index α (> 0, ≠ 1); smaller is heavier.
    pub alpha: f64,
    /// Smallest value.
    pub low: f64,
    /// Largest over smallest value (> 1).
    pub ratio: f64,
}

impl BoundedPareto {
    /// The distribution with tail `alpha`, spread `ratio` and the given mean.
    pub fn with_mean(alpha: f64, ratio: f64, mean: f64) -> Self {
        let unit = BoundedPareto { alpha, low: 1.0, ratio };
        BoundedPareto { alpha, low: mean / unit.mean(), ratio }
    }

    /// The distribution's mean.
    pub fn mean(&self) -> f64 {
        let (a, r) = (self.alpha, self.ratio);
        self.low * a / (a - 1.0) * (1.0 - r.powf(1.0 - a)) / (1.0 - r.powf(-a))
    }

    /// One draw, by inverting the CDF.
    pub fn sample(&self, rng: &mut SplitMix64) -> f64 {
        let u = rng.next_f64();
        let tail = 1.0 - self.ratio.powf(-self.alpha);
        self.low * (1.0 - u * tail).powf(-1.0 / self.alpha)
    }
}

/// Zipf's law over ranks 0..n: rank k is drawn with weight 1 / (k + 1)^s. Who submits jobs on
/// a shared cluster is skewed this way: a few heavy users, many light ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Zipf {
    /// Cumulative probabilities, the last one 1.
    cumulative: Vec<f64>,
}

impl Zipf {
    /// The law over `n` ranks (n > 0) with exponent `s` (≥ 0; 0 is uniform).
    pub fn new(n: usize, s: f64) -> Self {
        let weights: Vec<f64> = (0..n.max(1)).map(|k| (k as f64 + 1.0).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = 1.0;
        }
        Zipf { cumulative }
    }

    /// The probability of rank `k`.
    pub fn probability(&self, k: usize) -> f64 {
        let below = if k == 0 { 0.0 } else { self.cumulative[k - 1] };
        self.cumulative.get(k).map_or(0.0, |c| c - below)
    }

    /// One draw.
    pub fn sample(&self, rng: &mut SplitMix64) -> usize {
        let u = rng.next_f64();
        self.cumulative.partition_point(|&c| c <= u).min(self.cumulative.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_stream() {
        // First outputs of the reference splitmix64.c seeded with 1234567.
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn uniform_and_below_stay_in_range() {
        let mut r = SplitMix64::new(7);
        let mut seen = [0usize; 5];
        for _ in 0..10_000 {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            seen[r.below(5)] += 1;
        }
        assert!(seen.iter().all(|&c| c > 1_800 && c < 2_200), "{seen:?}");
    }

    #[test]
    fn distributions_have_their_means() {
        let mut r = SplitMix64::new(42);
        let n = 200_000;
        let m = (0..n).map(|_| r.exponential(0.5)).sum::<f64>() / n as f64;
        assert!((m - 2.0).abs() < 0.03, "{m}");
        let p = BoundedPareto::with_mean(1.5, 100.0, 30.0);
        assert!((p.mean() - 30.0).abs() < 1e-9);
        let draws: Vec<f64> = (0..n).map(|_| p.sample(&mut r)).collect();
        let m = draws.iter().sum::<f64>() / n as f64;
        assert!((m - 30.0).abs() < 0.6, "{m}");
        assert!(draws.iter().all(|&d| d >= p.low && d <= p.low * p.ratio * (1.0 + 1e-12)));
    }

    #[test]
    fn zipf_draws_follow_their_weights() {
        let z = Zipf::new(30, 1.0);
        let h30: f64 = (1..=30).map(|k| 1.0 / k as f64).sum();
        assert!((z.probability(0) - 1.0 / h30).abs() < 1e-12);
        assert!((0..30).map(|k| z.probability(k)).sum::<f64>() - 1.0 < 1e-12);
        let mut r = SplitMix64::new(9);
        let n = 100_000;
        let mut seen = [0usize; 30];
        for _ in 0..n {
            seen[z.sample(&mut r)] += 1;
        }
        for k in [0, 1, 9, 29] {
            let f = seen[k] as f64 / n as f64;
            assert!((f - z.probability(k)).abs() < 0.01, "rank {k}: {f}");
        }
        let u = Zipf::new(4, 0.0);
        assert!((u.probability(3) - 0.25).abs() < 1e-12);
    }
}
