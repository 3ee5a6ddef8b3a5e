//! How the PostgreSQL backend stores a mark (and an intent's fence) in a `bigint` column.

/// u64 → bigint with the top bit flipped: order-preserving, so SQL compares marks correctly.
pub(super) fn encode_mark(mark: u64) -> i64 {
    i64::from_ne_bytes((mark ^ (1 << 63)).to_ne_bytes())
}

pub(super) fn decode_mark(stored: i64) -> u64 {
    u64::from_ne_bytes(stored.to_ne_bytes()) ^ (1 << 63)
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn mark_encoding_preserves_order() {
        let marks = [
            0,
            1,
            9,
            1 << 53,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for pair in marks.windows(2) {
            assert!(encode_mark(pair[0]) < encode_mark(pair[1]), "{pair:?}");
        }
        for mark in marks {
            assert_eq!(decode_mark(encode_mark(mark)), mark);
        }
    }
}
