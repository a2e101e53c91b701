//! Deterministic pseudo-randomness from a seed: object uids, `generateName` suffixes and fault decisions.
//! The same seed and the same sequence of requests give the same cluster, which keeps tests repeatable.

/// SplitMix64: small, fast, and good enough for identifiers and coin flips.
#[derive(Clone, Debug)]
pub(crate) struct Random(u64);

impl Random {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A version-4 UUID.
    pub(crate) fn uid(&mut self) -> String {
        let high = self.next_u64();
        let low = self.next_u64();
        let high = (high & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
        let low = (low & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xFFFF,
            high & 0xFFFF,
            low >> 48,
            low & 0xFFFF_FFFF_FFFF
        )
    }

    /// The five-character suffix `generateName` appends, from the API server's alphabet.
    pub(crate) fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next_u64() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

/// The SplitMix64 finaliser: a well-mixed hash of one u64.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_identities() {
        let (mut a, mut b) = (Random::new(7), Random::new(7));
        let uid = a.uid();
        assert_eq!(uid, b.uid());
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4", "version 4");
        assert_ne!(a.uid(), uid);
        let suffix = a.name_suffix();
        assert_eq!(suffix.len(), 5);
        assert!(suffix.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }
}
