//! A `/query` body's `token_ids` read by a reader of its own.
//!
//! A prompt's token ids are nearly all of a query's body (156 KB on a
//! long agentic prompt), and serde_json reads them one number at a time
//! through its general number parser. [`read`] finds the body's top-level
//! `token_ids` array, reads its unsigned integers eight bytes at a time
//! (a SWAR digit test and multiply per number, no branch per digit), and
//! leaves the object's other fields to serde_json. Anything the reader
//! does not take exactly as serde_json would (a number with a sign, a
//! fraction or an exponent, past `u32`, a key with an escape, a second
//! `token_ids`, anything that is not JSON) goes to serde_json whole, so
//! every answer and every error is serde_json's own.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Deserializer;

/// The key whose array [`read`] takes.
const KEY: &str = "token_ids";

/// Reads `body` as `T`, its top-level `token_ids` array read by this
/// module's reader and handed to `ids_of(&mut t)`, the rest by serde_json;
/// the whole body by serde_json where the reader does not apply. The
/// result is `serde_json::from_slice(body)`'s, value or error.
///
/// ```
/// use radixkv_index_service::token_ids;
///
/// #[derive(serde::Deserialize)]
/// struct Query {
///     token_ids: Vec<u32>,
///     model_name: String,
/// }
///
/// let body = br#"{"token_ids": [1, 20, 300], "model_name": "m"}"#;
/// let q: Query = token_ids::read(body, |q: &mut Query| &mut q.token_ids).unwrap();
/// assert_eq!((q.token_ids, q.model_name.as_str()), (vec![1, 20, 300], "m"));
///
/// // Not for this reader (a negative id): serde_json's own error.
/// let bad = token_ids::read(br#"{"token_ids": [-1], "model_name": "m"}"#, |q: &mut Query| {
///     &mut q.token_ids
/// });
/// assert!(bad.is_err());
/// ```
pub fn read<T: DeserializeOwned>(
    body: &[u8],
    ids_of: impl FnOnce(&mut T) -> &mut Vec<u32>,
) -> serde_json::Result<T> {
    if let Some(split) = split(body) {
        if let Ok(mut t) = serde_json::from_slice::<T>(&split.rest) {
            *ids_of(&mut t) = split.token_ids;
            return Ok(t);
        }
    }
    serde_json::from_slice(body)
}

/// A body split by [`split`].
#[derive(Debug, PartialEq, Eq)]
pub struct Split {
    /// The ids of its `token_ids` array.
    pub token_ids: Vec<u32>,
    /// The body with that array emptied (`[]`): the other fields, for
    /// serde_json.
    pub rest: Vec<u8>,
}

/// `body`, a JSON object, split into its top-level `token_ids` array's
/// ids and the rest; `None` where the reader does not apply (see the
/// module's page). A body split here may still be wrong for serde_json
/// (another field malformed or of the wrong type), which reading `rest`
/// finds.
pub fn split(body: &[u8]) -> Option<Split> {
    let mut p = skip_ws(body, 0);
    if body.get(p) != Some(&b'{') {
        return None;
    }
    p = skip_ws(body, p + 1);
    let mut array = None;
    if body.get(p) != Some(&b'}') {
        loop {
            // The key: a string, with no escape (a key such as
            // `token\u005fids` goes to serde_json).
            if body.get(p) != Some(&b'"') {
                return None;
            }
            let len = body.get(p + 1..)?.iter().position(|&b| b == b'"')?;
            let key = &body[p + 1..p + 1 + len];
            if key.contains(&b'\\') {
                return None;
            }
            p = skip_ws(body, p + len + 2);
            if body.get(p) != Some(&b':') {
                return None;
            }
            p = skip_ws(body, p + 1);
            if key == KEY.as_bytes() {
                if array.is_some() {
                    return None;
                }
                let mut ids = Vec::new();
                let len = parse_array(&body[p..], &mut ids)?;
                array = Some((p, p + len, ids));
                p += len;
            } else {
                // Any other value, skipped as serde_json reads it.
                let mut values = Deserializer::from_slice(&body[p..]).into_iter::<IgnoredAny>();
                values.next()?.ok()?;
                p += values.byte_offset();
            }
            p = skip_ws(body, p);
            match body.get(p) {
                Some(b',') => p = skip_ws(body, p + 1),
                Some(b'}') => break,
                _ => return None,
            }
        }
    }
    if skip_ws(body, p + 1) != body.len() {
        return None;
    }
    let (start, end, token_ids) = array?;
    let mut rest = Vec::with_capacity(body.len() - (end - start) + 2);
    rest.extend_from_slice(&body[..start]);
    rest.extend_from_slice(b"[]");
    rest.extend_from_slice(&body[end..]);
    Some(Split { token_ids, rest })
}

/// JSON's whitespace.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The first position at or after `p` that is not whitespace.
fn skip_ws(s: &[u8], mut p: usize) -> usize {
    while s.get(p).copied().is_some_and(is_ws) {
        p += 1;
    }
    p
}

/// Every byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;

/// The high bit of each byte of `w` set where that byte is not an ASCII
/// digit (its high nibble not 3, or its low nibble past 9); no carry
/// crosses a byte.
fn non_digits(w: u64) -> u64 {
    let high = (w & (0xF0 * ONES)) ^ (0x30 * ONES);
    let low = ((w & (0x0F * ONES)) + 0x06 * ONES) & (0x10 * ONES);
    let x = high | low;
    (((x & (0x7F * ONES)) + 0x7F * ONES) | x) & (0x80 * ONES)
}

/// The value of eight decimal digits, one per byte (values 0-9), the most
/// significant in the lowest byte: pairs, then fours, then the eight,
/// each step one multiply.
fn eight_digits(v: u64) -> u64 {
    let pairs = v.wrapping_mul(10).wrapping_add(v >> 8);
    let lanes = 0x0000_00FF_0000_00FF;
    ((pairs & lanes)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((pairs >> 16) & lanes).wrapping_mul(1 + (10_000 << 32))))
        >> 32
}

/// The eight bytes of `s` from `p`, spaces past its end.
fn word_at(s: &[u8], p: usize) -> u64 {
    match s.get(p..p + 8) {
        Some(w) => u64::from_le_bytes(w.try_into().unwrap_or([b' '; 8])),
        None => {
            let mut w = [b' '; 8];
            let tail = s.get(p..).unwrap_or_default();
            w[..tail.len()].copy_from_slice(tail);
            u64::from_le_bytes(w)
        }
    }
}

/// Appends the ids of the JSON array `s` begins with to `out` and returns
/// the array's length in bytes (through its `]`); `None`, with `out` in
/// any state, unless the array is unsigned integers of at most `u32::MAX`
/// in JSON's syntax (no leading zero), separated by commas, whitespace
/// around them.
pub fn parse_array(s: &[u8], out: &mut Vec<u32>) -> Option<usize> {
    if s.first() != Some(&b'[') {
        return None;
    }
    // At most one id per two bytes (a digit and its comma).
    out.reserve(s.len().min(1 << 20).div_ceil(2));
    let mut p = skip_ws(s, 1);
    if s.get(p) == Some(&b']') {
        return Some(p + 1);
    }
    loop {
        let word = word_at(s, p);
        let len = (non_digits(word).trailing_zeros() / 8) as usize;
        if len == 0 || (len > 1 && s[p] == b'0') {
            return None;
        }
        // Digit bytes are at least b'0', so a borrow only leaves the
        // non-digit bytes above them, which the shift drops.
        let digits = word.wrapping_sub(0x30 * ONES);
        let mut end = p + len;
        let value = if len < 8 {
            eight_digits(digits << (8 * (8 - len)))
        } else {
            // Up to two digits more (u32::MAX has ten).
            let mut v = eight_digits(digits);
            while let Some(d) = s.get(end).filter(|b| b.is_ascii_digit()) {
                if end - p == 10 {
                    return None;
                }
                v = v * 10 + u64::from(d - b'0');
                end += 1;
            }
            v
        };
        out.push(u32::try_from(value).ok()?);
        p = skip_ws(s, end);
        match s.get(p) {
            Some(b',') => p = skip_ws(s, p + 1),
            Some(b']') => return Some(p + 1),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids of `[inside]`, checking the length returned.
    fn ids(inside: &str) -> Option<Vec<u32>> {
        let array = format!("[{inside}] ,");
        let mut out = Vec::new();
        let len = parse_array(array.as_bytes(), &mut out)?;
        assert_eq!(len, array.len() - 2, "{array:?}");
        Some(out)
    }

    #[test]
    fn reads_what_json_allows() {
        assert_eq!(ids(""), Some(vec![]));
        assert_eq!(ids(" \n"), Some(vec![]));
        assert_eq!(ids("0"), Some(vec![0]));
        assert_eq!(ids(" 7 , 12,\t345 "), Some(vec![7, 12, 345]));
        assert_eq!(
            ids("12345678,123456789"),
            Some(vec![12_345_678, 123_456_789])
        );
        assert_eq!(ids("4294967295"), Some(vec![u32::MAX]));
        assert_eq!(ids("1000000000,9"), Some(vec![1_000_000_000, 9]));
    }

    #[test]
    fn refuses_what_json_or_u32_does_not() {
        for bad in [
            ",",
            "1,",
            ",1",
            "1,,2",
            "1 2",
            "01",
            "00",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "4294967296",
            "99999999999",
            "12345678901",
            "1,x",
            "\"1\"",
            "[1]",
            "1,]",
        ] {
            assert_eq!(ids(bad), None, "{bad:?}");
        }
        let mut out = Vec::new();
        for unclosed in ["", "[", "[1", "[1,", "[1 ", "1]"] {
            assert_eq!(
                parse_array(unclosed.as_bytes(), &mut out),
                None,
                "{unclosed:?}"
            );
        }
    }

    #[test]
    fn splits_the_array_from_the_rest() {
        let body = br#" { "model_name" : "m", "token_ids" : [ 3, 4 ] , "x": {"token_ids": [9]} } "#;
        let s = split(body).expect("a split");
        assert_eq!(s.token_ids, vec![3, 4]);
        assert_eq!(
            String::from_utf8(s.rest).unwrap(),
            r#" { "model_name" : "m", "token_ids" : [] , "x": {"token_ids": [9]} } "#
        );
    }

    #[test]
    fn leaves_to_serde_json_what_it_does_not_read() {
        for body in [
            r#"{"token_ids": [1], "token_ids": [2]}"#,
            r#"{"token\u005fids": [1]}"#,
            r#"{"token_ids": [1, "2"]}"#,
            r#"{"token_ids": null}"#,
            r#"{"token_ids": [1]} x"#,
            r#"{"token_ids": [1]"#,
            r#"{"model_name": "m"}"#,
            r#"[1, 2]"#,
            "",
        ] {
            assert_eq!(split(body.as_bytes()), None, "{body}");
        }
    }
}
