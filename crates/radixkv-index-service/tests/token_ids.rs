//! `token_ids::read` against serde_json reading the same bodies: the same
//! value or the same error, on bodies well formed and not, and the reader
//! of its own taking every well-formed one.

use proptest::prelude::*;
use radixkv_index_service::token_ids;
use serde::Deserialize;

/// A `/query` body's shape.
#[derive(Debug, Deserialize, PartialEq)]
struct Query {
    token_ids: Vec<u32>,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default = "group")]
    routing_group: String,
    #[serde(default)]
    lora_name: Option<String>,
}

fn group() -> String {
    "default".into()
}

/// One array element's text: ids of every length up to u32's, and (when
/// `wrong`) what JSON or u32 refuses or the reader leaves to serde_json.
fn element(wrong: bool) -> BoxedStrategy<String> {
    let ids = prop_oneof![
        (0u32..10).prop_map(|v| v.to_string()),
        (10u32..100_000).prop_map(|v| v.to_string()),
        (100_000u32..100_000_000).prop_map(|v| v.to_string()),
        any::<u32>().prop_map(|v| v.to_string()),
        Just(u32::MAX.to_string()),
    ];
    if !wrong {
        return ids.boxed();
    }
    prop_oneof![
        4 => ids,
        1 => prop_oneof![
            (u64::from(u32::MAX) + 1..u64::MAX).prop_map(|v| v.to_string()),
            Just("-1".to_string()),
            Just("-0".to_string()),
            Just("01".to_string()),
            Just("1.0".to_string()),
            Just("2e3".to_string()),
            Just("\"7\"".to_string()),
            Just("null".to_string()),
            Just("[1]".to_string()),
            Just("\"]\"".to_string()),
            Just("99999999999999999999999".to_string()),
        ],
    ]
    .boxed()
}

fn ws() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => Just(""), 2 => Just(" "), 1 => Just("\n  "), 1 => Just("\t")]
}

/// Separators between an array's elements, and what may open or close
/// its inside; when `wrong`, also what JSON refuses there.
fn separators(wrong: bool) -> (BoxedStrategy<&'static str>, BoxedStrategy<&'static str>) {
    if !wrong {
        return (Just(",").boxed(), Just("").boxed());
    }
    (
        prop_oneof![8 => Just(","), 1 => Just(",,"), 1 => Just(" "), 1 => Just("")].boxed(),
        prop_oneof![8 => Just(""), 1 => Just(","), 1 => Just(" , ")].boxed(),
    )
}

/// A body: its fields in some order with whitespace between tokens, and
/// (when `wrong`) what may follow the object.
fn body(wrong: bool) -> impl Strategy<Value = String> {
    let (sep, edge) = separators(wrong);
    let array = (
        prop::collection::vec((element(wrong), ws(), ws(), sep), 0..40),
        edge.clone(),
        edge,
    )
        .prop_map(|(items, open, close)| {
            let mut inner = String::from(open);
            for (k, (e, a, b, sep)) in items.iter().enumerate() {
                if k > 0 {
                    inner.push_str(sep);
                }
                inner.push_str(&format!("{a}{e}{b}"));
            }
            format!("[{inner}{close}]")
        });
    let others = prop::collection::vec(
        prop_oneof![
            Just(r#""model_name": "m""#.to_string()),
            Just(r#""routing_group":"g""#.to_string()),
            Just(r#""lora_name" :null"#.to_string()),
            Just(r#""extra": {"token_ids": [1, -2], "x": [[]]}"#.to_string()),
            Just(r#""n": -1.5e3"#.to_string()),
        ],
        0..4,
    );
    let twice = if wrong { 0..3usize } else { 1..2usize };
    let after = if wrong {
        prop_oneof![6 => Just(""), 1 => Just(" x"), 1 => Just("}"), 1 => Just(","), 1 => Just("{}")]
            .boxed()
    } else {
        Just("").boxed()
    };
    (
        prop::collection::vec(array, twice),
        others,
        any::<prop::sample::Index>(),
        ws(),
        after,
    )
        .prop_map(|(arrays, mut fields, at, w, after)| {
            for a in arrays {
                let k = at.index(fields.len() + 1);
                fields.insert(k, format!("{w}\"token_ids\"{w}:{w}{a}"));
            }
            format!("{w}{{{}}}{w}{after}", fields.join(","))
        })
}

/// `body` with a byte replaced, inserted or the tail cut (from 1 in 4
/// cases on).
fn damaged() -> impl Strategy<Value = Vec<u8>> {
    let junk = prop::sample::select(b"[]{},:\"-.e09x\\ ".to_vec());
    (body(true), 0..4u8, any::<prop::sample::Index>(), junk).prop_map(|(b, how, at, j)| {
        let mut b = b.into_bytes();
        let k = at.index(b.len().max(1)).min(b.len());
        match how {
            0 if k < b.len() => b[k] = j,
            1 => b.insert(k, j),
            2 => b.truncate(k),
            _ => {}
        }
        b
    })
}

fn same_as_serde(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ours = token_ids::read(bytes, |q: &mut Query| &mut q.token_ids);
    let serde = serde_json::from_slice::<Query>(bytes);
    match (ours, serde) {
        (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
        (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
        (a, b) => prop_assert!(
            false,
            "{:?}: ours {a:?}, serde_json {b:?}",
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn well_formed_bodies_are_read_by_the_reader(b in body(false)) {
        let split = token_ids::split(b.as_bytes());
        prop_assert!(split.is_some(), "{b}");
        same_as_serde(b.as_bytes())?;
    }

    #[test]
    fn any_body_reads_as_serde_json_reads_it(b in body(true)) {
        same_as_serde(b.as_bytes())?;
    }

    #[test]
    fn damaged_bodies_read_as_serde_json_reads_them(b in damaged()) {
        same_as_serde(&b)?;
    }
}
