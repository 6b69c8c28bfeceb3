//! The index by hand: stores, removals, re-stores, clears, media,
//! namespaces, several sources, and what it refuses.

use radixkv_index::decode::{BlockHash, Event, Medium, Stored};
use radixkv_index::index::ApplyError;
use radixkv_index::{KvIndex, Score, Source};

const A: Source = Source { worker: 1, rank: 0 };
const B: Source = Source { worker: 2, rank: 1 };

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], medium: Medium) -> Event {
    Event::Stored(Stored {
        hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
        parent: parent.map(BlockHash),
        tokens: tokens.to_vec(),
        block_size: 2,
        medium,
        lora_name: None,
        cache_salt: None,
    })
}

fn removed(hashes: &[u64], medium: Medium) -> Event {
    Event::Removed {
        hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
        medium,
    }
}

fn scores(ix: &KvIndex, tokens: &[u32]) -> Vec<(Source, Medium, usize)> {
    let mut v: Vec<_> = ix
        .scores(tokens, None)
        .into_iter()
        .map(
            |Score {
                 source,
                 medium,
                 tokens,
             }| (source, medium, tokens),
        )
        .collect();
    v.sort();
    v
}

fn apply(ix: &KvIndex, s: Source, events: &[Event]) {
    let (_, errors) = ix.apply(s, events);
    assert!(errors.is_empty(), "{errors:?}");
    ix.check().unwrap();
}

#[test]
fn stores_and_removals_move_each_sources_score() {
    let ix = KvIndex::new(2, 16).unwrap();
    apply(
        &ix,
        A,
        &[stored(&[10, 11], None, &[1, 2, 3, 4], Medium::Gpu)],
    );
    apply(&ix, A, &[stored(&[12], Some(11), &[5, 6], Medium::Gpu)]);
    apply(&ix, B, &[stored(&[20], None, &[1, 2], Medium::Gpu)]);
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4, 5, 6, 7]),
        [(A, Medium::Gpu, 6), (B, Medium::Gpu, 2)]
    );
    // A block in the middle leaves: what continues it is out of reach.
    apply(&ix, A, &[removed(&[11], Medium::Gpu)]);
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4, 5, 6]),
        [(A, Medium::Gpu, 2), (B, Medium::Gpu, 2)]
    );
    // It comes back: its child, which the worker kept, is reachable again.
    apply(&ix, A, &[stored(&[11], Some(10), &[3, 4], Medium::Gpu)]);
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4, 5, 6]),
        [(A, Medium::Gpu, 6), (B, Medium::Gpu, 2)]
    );
    // Removals leaf first leave nothing known.
    apply(&ix, A, &[removed(&[12, 11, 10], Medium::Gpu)]);
    assert_eq!(ix.known_blocks(A), 0);
    assert_eq!(scores(&ix, &[1, 2, 3, 4]), [(B, Medium::Gpu, 2)]);
}

#[test]
fn media_are_tiers_of_their_own() {
    let ix = KvIndex::new(2, 16).unwrap();
    apply(
        &ix,
        A,
        &[stored(&[10, 11], None, &[1, 2, 3, 4], Medium::Gpu)],
    );
    // Offloaded: the same blocks on the host.
    apply(
        &ix,
        A,
        &[stored(&[10, 11], None, &[1, 2, 3, 4], Medium::Cpu)],
    );
    apply(&ix, A, &[removed(&[11], Medium::Gpu)]);
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4]),
        [(A, Medium::Gpu, 2), (A, Medium::Cpu, 4)]
    );
    // A block stored on disk below a parent that is not on disk is out of
    // reach there until the parent comes.
    apply(&ix, A, &[stored(&[12], Some(11), &[5, 6], Medium::Disk)]);
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4, 5, 6]),
        [(A, Medium::Gpu, 2), (A, Medium::Cpu, 4)]
    );
    apply(
        &ix,
        A,
        &[stored(&[10, 11], None, &[1, 2, 3, 4], Medium::Disk)],
    );
    assert_eq!(
        scores(&ix, &[1, 2, 3, 4, 5, 6]),
        [
            (A, Medium::Gpu, 2),
            (A, Medium::Cpu, 4),
            (A, Medium::Disk, 6)
        ]
    );
}

#[test]
fn a_clear_empties_one_source_and_forget_frees_its_tiers() {
    let ix = KvIndex::new(2, 2).unwrap();
    apply(&ix, A, &[stored(&[10], None, &[1, 2], Medium::Gpu)]);
    apply(&ix, B, &[stored(&[20], None, &[1, 2], Medium::Gpu)]);
    apply(&ix, A, &[Event::Cleared]);
    assert_eq!(scores(&ix, &[1, 2]), [(B, Medium::Gpu, 2)]);
    // Both tiers are taken: a third (source, medium) has none.
    let (_, errors) = ix.apply(A, &[stored(&[11], None, &[1, 2], Medium::Cpu)]);
    assert!(
        matches!(errors[..], [(0, ApplyError::NoTier(2))]),
        "{errors:?}"
    );
    ix.forget(B);
    apply(&ix, A, &[stored(&[11], None, &[1, 2], Medium::Cpu)]);
    assert_eq!(scores(&ix, &[1, 2]), [(A, Medium::Cpu, 2)]);
}

#[test]
fn namespaces_keep_apart_and_children_follow_their_parent() {
    let ix = KvIndex::new(2, 16).unwrap();
    let mut salted = stored(&[10], None, &[1, 2], Medium::Gpu);
    if let Event::Stored(s) = &mut salted {
        s.cache_salt = Some("tenant".into());
    }
    apply(
        &ix,
        A,
        &[salted, stored(&[11], Some(10), &[3, 4], Medium::Gpu)],
    );
    assert!(ix.scores(&[1, 2, 3, 4], None).is_empty());
    let s = ix.scores(&[1, 2, 3, 4], Some("tenant"));
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].tokens, 4);
}

#[test]
fn what_cannot_be_applied_is_named_and_the_rest_is_applied() {
    let ix = KvIndex::new(2, 16).unwrap();
    let mut wide = stored(&[1], None, &[1, 2, 3], Medium::Gpu);
    if let Event::Stored(s) = &mut wide {
        s.block_size = 3;
    }
    let (done, errors) = ix.apply(
        A,
        &[
            wide,
            stored(&[2], Some(99), &[1, 2], Medium::Gpu),
            removed(&[77], Medium::Gpu),
            stored(&[3], None, &[5, 6], Medium::Gpu),
            stored(&[3], None, &[7, 8], Medium::Gpu),
        ],
    );
    let kinds: Vec<String> = errors.iter().map(|(i, e)| format!("{i}: {e}")).collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert!(matches!(
        errors[0],
        (0, ApplyError::BlockSize { got: 3, want: 2 })
    ));
    assert!(matches!(errors[1], (1, ApplyError::UnknownParent(99))));
    assert!(matches!(errors[2], (2, ApplyError::UnknownBlock(77))));
    assert!(matches!(errors[3], (4, ApplyError::Conflict(3))));
    assert_eq!((done.events, done.skipped), (1, 4));
    assert_eq!(scores(&ix, &[5, 6]), [(A, Medium::Gpu, 2)]);
    ix.check().unwrap();
}

#[test]
fn per_block_hashes_read_back_into_the_prompt_they_name() {
    use radixkv_index::local_hash::{block_hashes, seed};
    let ix = KvIndex::new(2, 16).unwrap();
    let salted = Event::Stored(Stored {
        hashes: vec![BlockHash(20), BlockHash(21)],
        parent: None,
        tokens: vec![1, 2, 3, 4],
        block_size: 2,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: Some("t".into()),
    });
    apply(
        &ix,
        A,
        &[salted, stored(&[22], Some(21), &[5, 6], Medium::Gpu)],
    );
    apply(
        &ix,
        B,
        &[stored(&[30, 31], None, &[1, 2, 3, 4], Medium::Gpu)],
    );
    let by_hash = |h: &[u64]| {
        let mut v: Vec<_> = ix
            .scores_by_hash(h)
            .into_iter()
            .map(|s| (s.source, s.tokens))
            .collect();
        v.sort();
        v
    };
    let prompt = [1, 2, 3, 4, 5, 6, 7];
    // Salted: A's three blocks (the third inherits the salt's seed).
    assert_eq!(
        by_hash(&block_hashes(&prompt, 2, seed(None, Some("t")))),
        vec![(A, 6)]
    );
    // Unsalted: B's two.
    assert_eq!(
        by_hash(&block_hashes(&prompt, 2, seed(None, None))),
        vec![(B, 4)]
    );
    // An unknown hash ends the prompt there.
    let mut h = block_hashes(&prompt, 2, seed(None, Some("t")));
    h[1] = 99;
    assert_eq!(by_hash(&h), vec![(A, 2)]);
    assert_eq!(ix.held_blocks(), 5);
    apply(&ix, B, &[Event::Cleared]);
    assert_eq!(by_hash(&block_hashes(&prompt, 2, seed(None, None))), vec![]);
    assert_eq!(ix.held_blocks(), 3);
    apply(&ix, A, &[removed(&[22], Medium::Gpu)]);
    assert_eq!(ix.held_blocks(), 2);
    assert_eq!(
        by_hash(&block_hashes(&prompt, 2, seed(None, Some("t")))),
        vec![(A, 4)]
    );
}

/// A removal of a long chain walks up to the root once, whichever end it
/// lists first: SGLang lists an evicted node's blocks from the top, and
/// asking of each block whether its parent is still held walked to the
/// root once per block (the chain's length squared).
#[test]
fn a_long_removal_walks_to_the_root_once_in_either_order() {
    const N: u64 = 2_000;
    for top_down in [true, false] {
        let ix = KvIndex::new(2, 4).unwrap();
        let root: Vec<u64> = (1..=N).collect();
        let tail: Vec<u64> = (N + 1..=2 * N).collect();
        let tokens = |hs: &[u64]| -> Vec<u32> { hs.iter().flat_map(|&h| [h as u32, 7]).collect() };
        ix.apply(A, &[stored(&root, None, &tokens(&root), Medium::Gpu)]);
        ix.apply(A, &[stored(&tail, Some(N), &tokens(&tail), Medium::Gpu)]);
        let all = tokens(&[root.clone(), tail.clone()].concat());
        assert_eq!(scores(&ix, &all), vec![(A, Medium::Gpu, all.len())]);
        let before = ix.path_steps(A);
        let mut order = tail.clone();
        if !top_down {
            order.reverse();
        }
        let (done, errors) = ix.apply(A, &[removed(&order, Medium::Gpu)]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(done.removed, N);
        let walked = ix.path_steps(A) - before;
        assert!(
            walked <= 2 * N + 1,
            "top_down {top_down}: {walked} blocks walked to remove {N} below {N}"
        );
        assert_eq!(
            scores(&ix, &all),
            vec![(A, Medium::Gpu, tokens(&root).len())]
        );
        assert_eq!(ix.known_blocks(A), N as usize);
        ix.check().unwrap();
    }
}

/// A chain taken from its end one block at a time (vLLM's eviction order:
/// a `BlockRemoved` per leaf) climbs from each block's place in the tree
/// and never builds a path from the root; another source holding half the
/// chain keeps its half, and a block whose place left the tree is found by
/// its path instead.
#[test]
fn removals_from_the_end_climb_from_places() {
    const N: u64 = 64;
    let ix = KvIndex::new(2, 4).unwrap();
    let chain: Vec<u64> = (1..=N).collect();
    let tokens = |hs: &[u64]| -> Vec<u32> { hs.iter().flat_map(|&h| [h as u32, 7]).collect() };
    let all = tokens(&chain);
    ix.apply(A, &[stored(&chain, None, &all, Medium::Gpu)]);
    let half = &chain[..N as usize / 2];
    ix.apply(B, &[stored(half, None, &tokens(half), Medium::Gpu)]);
    let before = ix.path_steps(A);
    for n in (1..=N).rev() {
        let (done, errors) = ix.apply(A, &[removed(&[n], Medium::Gpu)]);
        assert!(errors.is_empty() && done.removed == 1, "{errors:?}");
        let mut want = vec![(B, Medium::Gpu, 2 * half.len())];
        if n > 1 {
            want.insert(0, (A, Medium::Gpu, 2 * (n as usize - 1)));
        }
        assert_eq!(scores(&ix, &all), want, "after removing block {n}");
    }
    assert_eq!(ix.path_steps(A), before, "a removal walked from the root");
    ix.check().unwrap();

    // Block 102's place is the end of the store that brought it, which
    // the removal of block 105 takes out of the tree (no other source
    // holds it): block 102 is found by its path.
    let short: Vec<u64> = (101..=108).collect();
    let short_tokens = tokens(&short);
    ix.apply(A, &[stored(&short, None, &short_tokens, Medium::Gpu)]);
    ix.apply(A, &[removed(&[105], Medium::Gpu)]);
    let before = ix.path_steps(A);
    ix.apply(A, &[removed(&[102], Medium::Gpu)]);
    assert!(
        ix.path_steps(A) > before,
        "block 102's place was still in the tree"
    );
    assert_eq!(scores(&ix, &short_tokens), vec![(A, Medium::Gpu, 2)]);
    ix.check().unwrap();
}

/// A store below a known parent reads the parent's key from the tree,
/// climbing from the parent's place, not from the source's blocks one by
/// one; held on another medium only below a parent that medium holds.
#[test]
fn a_store_below_a_parent_reads_its_key_from_the_tree() {
    const N: u64 = 64;
    let ix = KvIndex::new(2, 4).unwrap();
    let chain: Vec<u64> = (1..=N).collect();
    let tokens = |hs: &[u64]| -> Vec<u32> { hs.iter().flat_map(|&h| [h as u32, 7]).collect() };
    ix.apply(A, &[stored(&chain, None, &tokens(&chain), Medium::Gpu)]);
    let before = ix.path_steps(A);
    let tail: Vec<u64> = (N + 1..=N + 4).collect();
    ix.apply(A, &[stored(&tail, Some(N), &tokens(&tail), Medium::Gpu)]);
    let below: Vec<u64> = (N + 5..=N + 6).collect();
    ix.apply(
        A,
        &[stored(&below, Some(N + 4), &tokens(&below), Medium::Cpu)],
    );
    assert_eq!(
        ix.path_steps(A),
        before,
        "a store walked the blocks to the root"
    );
    let all = tokens(&[chain.clone(), tail.clone(), below.clone()].concat());
    // The CPU holds only the last two blocks: nothing from the root.
    assert_eq!(
        scores(&ix, &all),
        vec![(A, Medium::Gpu, 2 * (N as usize + 4))]
    );
    ix.check().unwrap();
}
