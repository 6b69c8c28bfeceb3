//! Fuzzing: byte strings decoded into op sequences over 1–3 devices, run on
//! the concurrent cache and the sequential model, compared after every op.
//!
//! cargo-fuzz needs a nightly toolchain, which this project's machines do not
//! have, so the mutator is proptest's over raw bytes. A short run is part of
//! the test suite; `RADIXKV_FUZZ_CASES=1000000` runs long. Every file in
//! `tests/fuzz_corpus/` is replayed each time: the shortest failing inputs
//! found (and a few seeds) stay there as regression tests, and proptest
//! records new failures in `tests/regressions/fuzz.txt`.

mod common;

use common::{decode, run_case};
use proptest::prelude::*;
use std::path::Path;

fn cases() -> u32 {
    std::env::var("RADIXKV_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("tests/regressions/fuzz.txt"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn fuzz_bytes_against_model(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let (devices, ps, policy, ops) = decode(&bytes);
        run_case(devices, ps, policy, &ops)?;
    }
}

#[test]
fn corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let (devices, ps, policy, ops) = decode(&bytes);
        if let Err(e) = run_case(devices, ps, policy, &ops) {
            panic!("{}: {e}", path.display());
        }
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
