//! NumPy's legacy `RandomState` (MT19937) permutation, bit for bit, so that kace's splits are the
//! ones pandas' `sample(frac=1, random_state=s)` and scikit-learn's `train_test_split` produce.
//!
//! Why: the paper's splits and its inner 80 % fit subset come from these two calls; reproducing
//! them lets `kace eval colocations` re-derive the paper's training sets from a seed alone.

/// The Mersenne Twister MT19937, seeded as NumPy's `RandomState(int)` seeds it.
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    /// Seeds with `init_genrand(seed)`, which is what `RandomState(seed)` does for an integer.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        for i in 0..624 {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % 624] & LOWER);
            let mut v = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// The next 32-bit output (`genrand_int32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// A uniform integer in `0..=max` by masked rejection (NumPy's legacy `random_interval`).
    fn interval(&mut self, max: u32) -> u32 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        loop {
            let v = self.next_u32() & mask;
            if v <= max {
                return v;
            }
        }
    }
}

/// `numpy.random.RandomState(seed).permutation(n)`.
pub fn permutation(seed: u32, n: usize) -> Vec<usize> {
    let mut rng = Mt19937::new(seed);
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // n beyond u32 never occurs here (datasets are small); saturate rather than wrap.
        let j = rng.interval(u32::try_from(i).unwrap_or(u32::MAX)) as usize;
        v.swap(i, j);
    }
    v
}

/// The row indices that scikit-learn's `train_test_split(test_size, random_state=seed)` puts in
/// the train part, in the order it returns them.
pub fn train_test_split_train(seed: u32, n: usize, test_size: f64) -> Vec<usize> {
    let n_test = (test_size * n as f64).ceil() as usize;
    let perm = permutation(seed, n);
    perm[n_test.min(n)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_mt19937_outputs() {
        // First outputs of init_genrand(5489), the reference implementation's default seed.
        let mut r = Mt19937::new(5489);
        let got: Vec<u32> = (0..3).map(|_| r.next_u32()).collect();
        assert_eq!(got, vec![3_499_211_612, 581_869_302, 3_890_346_734]);
    }

    #[test]
    fn permutation_is_a_permutation() {
        let mut p = permutation(10, 181);
        p.sort_unstable();
        assert_eq!(p, (0..181).collect::<Vec<_>>());
        assert_eq!(permutation(3, 0), Vec::<usize>::new());
        assert_eq!(permutation(3, 1), vec![0]);
    }
}
