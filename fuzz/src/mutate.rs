//! A deterministic, seeded mutator: byte flips, inserts, deletes, copies, splices between
//! corpus entries and dictionary tokens, stacked a few at a time.

/// SplitMix64: small, fast, and the same sequence on every machine for a given seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator that starts from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is `0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// True once in `n` draws.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Bytes that often sit on a parser's edges.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xff 09.-+eE#:/\"\n\t";

/// The longest input the mutator produces.
pub const MAX_LEN: usize = 4_096;

/// Mutates `input` in place by one to four stacked mutations, drawing splice material from
/// `corpus` and tokens from `dictionary`.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[&[u8]]) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        mutate_once(rng, input, corpus, dictionary);
    }
    input.truncate(MAX_LEN);
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[&[u8]]) {
    let len = input.len();
    match rng.below(10) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = INTERESTING[rng.below(INTERESTING.len())];
        }
        2 if len > 0 => {
            let at = rng.below(len);
            input[at] = input[at].wrapping_add(rng.below(33) as u8).wrapping_sub(16);
        }
        3 => {
            let at = rng.below(len + 1);
            let count = 1 + rng.below(4);
            for _ in 0..count {
                input.insert(at, rng.next_u64() as u8);
            }
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let end = (at + 1 + rng.below(16)).min(len);
            input.drain(at..end);
        }
        5 if len > 0 => {
            // Copy a chunk of the input elsewhere in it.
            let from = rng.below(len);
            let end = (from + 1 + rng.below(32)).min(len);
            let chunk = input[from..end].to_vec();
            let at = rng.below(len + 1);
            input.splice(at..at, chunk);
        }
        6 if !corpus.is_empty() => {
            let other = &corpus[rng.below(corpus.len())];
            splice(rng, input, other);
        }
        7 | 8 if !dictionary.is_empty() => {
            let token = dictionary[rng.below(dictionary.len())];
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                input.splice(at..at, token.iter().copied());
            } else {
                let end = (at + token.len()).min(len);
                input.splice(at..end, token.iter().copied());
            }
        }
        9 if len > 0 => input.truncate(rng.below(len)),
        _ => input.push(rng.next_u64() as u8),
    }
}

/// Replaces a part of `input` with a part of `other`: the head of one and the tail of the
/// other, or a chunk of `other` dropped in.
fn splice(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    if other.is_empty() {
        return;
    }
    let from = rng.below(other.len());
    if rng.one_in(2) {
        input.truncate(rng.below(input.len() + 1));
        input.extend_from_slice(&other[from..]);
    } else {
        let end = (from + 1 + rng.below(64)).min(other.len());
        let at = rng.below(input.len() + 1);
        input.splice(at..at, other[from..end].iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_makes_the_same_mutations() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = b"openai#rpm".to_vec();
            for _ in 0..200 {
                mutate(&mut rng, &mut input, &[b"x-ratelimit".to_vec()], &[b"1e9"]);
            }
            input
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn mutations_never_grow_past_the_limit() {
        let mut rng = Rng::new(1);
        let mut input = vec![b'a'; MAX_LEN];
        let big = vec![b'b'; MAX_LEN];
        for _ in 0..1_000 {
            mutate(
                &mut rng,
                &mut input,
                std::slice::from_ref(&big),
                &[b"token"],
            );
            assert!(input.len() <= MAX_LEN);
        }
    }
}
