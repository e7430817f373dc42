//! Seeded, domain-separated random streams (internal).
//!
//! Every random draw of the crate comes from a ChaCha8 generator whose 256-bit key is built from the
//! user's `seed`, a domain tag naming the purpose (training stream, evaluation set, split, ...) and a
//! sub-identifier; the ChaCha stream number selects the batch. Different purposes therefore never share
//! random numbers even for the same user seed, and batch `i` of a stream depends only on
//! `(seed, domain, sub, i)`.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Purposes of random streams; the discriminant is mixed into the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Domain {
    /// SRAVEN seeded split permutation.
    SravenSplit = 0x7372_6176_656e_0001,
    /// SRAVEN training stream.
    SravenTrain = 0x7372_6176_656e_0002,
    /// SRAVEN evaluation / probe sets.
    SravenEval = 0x7372_6176_656e_0003,
    /// Fuzzy-logic task shuffle.
    LogicSplit = 0x6c6f_6769_6300_0001,
    /// Fuzzy-logic training batches.
    LogicTrain = 0x6c6f_6769_6300_0002,
    /// Fuzzy-logic evaluation batches.
    LogicEval = 0x6c6f_6769_6300_0003,
    /// Fuzzy-logic fixed query of a probe set.
    LogicFixedQuery = 0x6c6f_6769_6300_0004,
    /// Fuzzy-logic fixed context of a probe set.
    LogicFixedContext = 0x6c6f_6769_6300_0005,
    /// Induction corpus: bigram table.
    InductionTable = 0x696e_6475_6300_0001,
    /// Induction corpus: sequences.
    InductionSeq = 0x696e_6475_6300_0002,
    /// Repeated random tokens.
    RepeatedTokens = 0x696e_6475_6300_0003,
    /// Prompt files: held-out factor combinations.
    PromptHoldOut = 0x7072_6f6d_7074_0001,
    /// Prompt files: the `relations` generator.
    PromptRelations = 0x7072_6f6d_7074_0002,
    /// Prompt files: the `icl` generator.
    PromptIcl = 0x7072_6f6d_7074_0003,
}

/// A ChaCha8 generator keyed by `(seed, domain, sub)` and positioned at stream `stream`.
pub(crate) fn stream(seed: u64, domain: Domain, sub: u64, stream: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[0..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&(domain as u64).to_le_bytes());
    key[16..24].copy_from_slice(&sub.to_le_bytes());
    key[24..32].copy_from_slice(b"hyprlens");
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(stream);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    #[test]
    fn streams_are_separated() {
        let a = stream(1, Domain::SravenTrain, 0, 0).next_u64();
        let b = stream(1, Domain::SravenEval, 0, 0).next_u64();
        let c = stream(1, Domain::SravenTrain, 0, 1).next_u64();
        let d = stream(2, Domain::SravenTrain, 0, 0).next_u64();
        let e = stream(1, Domain::SravenTrain, 1, 0).next_u64();
        let again = stream(1, Domain::SravenTrain, 0, 0).next_u64();
        assert_eq!(a, again);
        for other in [b, c, d, e] {
            assert_ne!(a, other);
        }
    }
}
