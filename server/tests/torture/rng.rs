//! A small seeded random stream (SplitMix64): the same seed gives the same
//! draws on every machine, so a trial's workload and crash are replayable
//! from the printed seed and trial number.

pub(crate) struct Rng(u64);

impl Rng {
    /// The stream of trial `trial` of a run seeded `seed`.
    pub(crate) fn for_trial(seed: u64, trial: u64) -> Self {
        let mut rng = Self(seed ^ trial.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.next();
        rng
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A draw in `low..=high`.
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}
