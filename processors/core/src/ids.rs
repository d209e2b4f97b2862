//! The id contract: every id that reaches an event is an Avro `long`, so an id accepted
//! anywhere (the Try API, an admin endpoint, a command) must be positive and fit a signed
//! 64-bit integer. A larger one would wrap to a negative number on the wire and a projector
//! could never book it.

/// 64-bit FNV-1a: stable across Rust versions, platforms and processes, unlike
/// `DefaultHasher`, for hashes that are persisted (operation and event ids cut to their
/// column) or must agree between processes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The largest id an event can carry.
pub const MAX_ID: u64 = i64::MAX as u64;

/// `value` as an id, or why it is not one.
pub fn check_id(value: u64) -> Result<u64, String> {
    match value {
        0 => Err("must be a positive id".into()),
        v if v > MAX_ID => Err(format!("must be at most {MAX_ID} (an Avro long), got {v}")),
        v => Ok(v),
    }
}

/// An id from text (a path segment, a command-line argument).
pub fn parse_id(raw: &str) -> Result<u64, String> {
    let value: u64 = raw
        .trim()
        .parse()
        .map_err(|_| format!("must be a positive integer, got {raw:?}"))?;
    check_id(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a test vectors: hashes already persisted in ids stay the same.
    #[test]
    fn fnv1a64_is_the_published_fnv1a() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn ids_are_positive_longs() {
        assert!(check_id(0).is_err());
        assert_eq!(check_id(1), Ok(1));
        assert_eq!(check_id(MAX_ID), Ok(MAX_ID));
        assert!(check_id(MAX_ID + 1).is_err());
        assert!(parse_id("9223372036854775808").is_err());
        assert!(parse_id("-1").is_err());
        assert_eq!(parse_id("42"), Ok(42));
    }
}
