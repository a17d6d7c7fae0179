//! Deterministic data patterns and checksums, shared by the worker and the tests that drive it.
//!
//! The pattern of a range is a sequence of little-endian 64-bit words, word `i` being
//! `splitmix64(seed ^ i)`; byte `offset` of the range is byte `offset % 8` of word
//! `offset / 8`. Offsets count from the start of the filled range, so a range filled with a
//! seed verifies against the same seed and the same start address.

/// One step of splitmix64 (Steele, Lea, Flood): a fast, well-mixed 64-bit hash.
pub const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `index` (bytes `8 * index .. 8 * index + 8`) of the pattern for `seed`.
pub const fn pattern_word(seed: u64, index: u64) -> u64 {
    splitmix64(seed ^ index)
}

/// Byte `offset` of the pattern for `seed`.
pub const fn pattern_byte(seed: u64, offset: u64) -> u8 {
    pattern_word(seed, offset / 8).to_le_bytes()[(offset % 8) as usize]
}

/// Writes the pattern for `seed` into `buf`, whose first byte is pattern byte `start`.
pub fn fill_pattern(seed: u64, start: u64, buf: &mut [u8]) {
    let mut offset = start;
    let mut rest = buf;
    // Leading bytes up to a word boundary.
    while !offset.is_multiple_of(8) && !rest.is_empty() {
        rest[0] = pattern_byte(seed, offset);
        rest = &mut rest[1..];
        offset += 1;
    }
    let mut chunks = rest.chunks_exact_mut(8);
    for chunk in &mut chunks {
        chunk.copy_from_slice(&pattern_word(seed, offset / 8).to_le_bytes());
        offset += 8;
    }
    for b in chunks.into_remainder() {
        *b = pattern_byte(seed, offset);
        offset += 1;
    }
}

/// `len` bytes of the pattern for `seed`, starting at pattern byte 0.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(seed, 0, &mut v);
    v
}

/// The first offset (relative to `start`) where `buf` differs from the pattern, with the
/// expected and found bytes.
pub fn first_mismatch(seed: u64, start: u64, buf: &[u8]) -> Option<(u64, u8, u8)> {
    let mut expected = [0u8; 4096];
    for (i, chunk) in buf.chunks(expected.len()).enumerate() {
        let at = (i * expected.len()) as u64;
        let want = &mut expected[..chunk.len()];
        fill_pattern(seed, start + at, want);
        if chunk != want {
            let j = chunk
                .iter()
                .zip(want.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some((at + j as u64, want[j], chunk[j]));
        }
    }
    None
}

/// Incremental 64-bit FNV-1a.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub const fn new() -> Fnv1a {
        Fnv1a(Self::OFFSET)
    }

    pub fn update(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(Self::PRIME);
        }
        self.0 = h;
    }

    pub const fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a::new()
    }
}

/// 64-bit FNV-1a of `bytes` (what the worker's `Checksum` command returns).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::new();
    h.update(bytes);
    h.finish()
}

/// The checksum of `len` bytes of the pattern for `seed`, without materialising them all.
pub fn pattern_checksum(seed: u64, len: u64) -> u64 {
    let mut h = Fnv1a::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        fill_pattern(seed, at, &mut buf[..n]);
        h.update(&buf[..n]);
        at += n as u64;
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_matches_bytes_at_any_start() {
        for start in 0..17u64 {
            let mut buf = vec![0u8; 37];
            fill_pattern(7, start, &mut buf);
            for (i, b) in buf.iter().enumerate() {
                assert_eq!(*b, pattern_byte(7, start + i as u64), "start {start} i {i}");
            }
        }
    }

    #[test]
    fn mismatch_reports_first_difference() {
        let mut buf = pattern(3, 10_000);
        assert_eq!(first_mismatch(3, 0, &buf), None);
        buf[5000] ^= 0xff;
        buf[6000] ^= 0xff;
        let (off, want, found) = first_mismatch(3, 0, &buf).expect("mismatch");
        assert_eq!(off, 5000);
        assert_eq!(want, pattern_byte(3, 5000));
        assert_eq!(found, pattern_byte(3, 5000) ^ 0xff);
        assert_ne!(pattern(3, 64), pattern(4, 64));
    }

    #[test]
    fn checksums_agree() {
        assert_eq!(checksum(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(checksum(b"a"), 0xaf63_dc4c_8601_ec8c);
        let n = 200_000;
        assert_eq!(pattern_checksum(9, n), checksum(&pattern(9, n as usize)));
    }
}
