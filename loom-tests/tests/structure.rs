//! Loom models of the tree's structure: splits, attaches, adoptions and
//! unlinks racing each other and lock-free readers, below flat arrays and
//! wide nodes' tables, and the reclamation of what they replace.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{cache, key, model, model_with_branches, D0, D1};
use radixkv::RadixCache;
use std::sync::Arc;

/// insert below a node being evicted. Protecting step: the evictor
/// re-checks "no child resident on d" under the node's lock, and the
/// inserter attaches a child only under the parent's lock while the parent
/// is resident. Control: `leaf_check`.
#[test]
fn insert_below_a_leaf_being_evicted() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1]), D0, &[10], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[1, 2]), D0, &[20, 21], 0).unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        c.audit();
    });
}

/// split vs pin counts. Protecting step: pins live only on the
/// end node of a match, and a split keeps the old node object as the
/// suffix, so a split copies no count and cannot double- or un-count a pin
/// taken concurrently. Control: `split_moves_no_pin` (copy the count into
/// the new prefix, as SGLang copies `lock_ref`).
///
/// Why this control adds a step instead of removing one: the protection is
/// an omission by design (no pin state moves in a split), so there is no
/// check to take out; the only way to lose it is to do what the design
/// avoids. The copied count is wrong in every interleaving where the pin
/// was taken before the split, which the model reaches first.
#[test]
fn split_vs_pin_counts() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.match_and_pin(key(&[1, 2]), D0).unwrap());
        // Ends inside [1, 2]: splits it.
        c.match_prefix(key(&[1]), D0).unwrap();
        let m = t.join().unwrap();
        c.audit();
        let s = c.sizes(D0).unwrap();
        assert_eq!(
            (s.protected, s.total),
            (2, 2),
            "the lease protects exactly its path"
        );
        drop(m.lease);
        c.audit();
        assert_eq!(
            c.sizes(D0).unwrap().protected,
            0,
            "a released lease leaves no pin behind"
        );
    });
}

/// split vs reader. Protecting step: a reader checks that the
/// child's image names the node it came from as parent, and otherwise
/// climbs the child's parent links to the node now below it (`climb_to`),
/// without waiting for the splitter. Control: `reader_parent_check`.
#[test]
fn split_vs_reader() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1, 2, 3]), D0, &[10, 11, 12], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3])));
        c.match_prefix(key(&[1]), D0).unwrap();
        assert_eq!(t.join().unwrap(), vec![3], "the whole key stayed cached");
        c.audit();
    });
}

/// concurrent insert of the same new prefix. Protecting step:
/// attaching a leaf re-checks, under the parent's lock, that no child with
/// that first page appeared (adoption re-checks residency likewise); the
/// loser's values come back as duplicates. Control: `attach_recheck`.
#[test]
fn two_inserts_of_one_new_prefix() {
    model(|| {
        let c = cache(1);
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap());
        let b = c.insert(key(&[1, 2]), D0, &[20, 21], 0).unwrap();
        let a = t.join().unwrap();
        let now = c.match_and_pin(key(&[1, 2]), D0).unwrap();
        assert_eq!(now.len, 2);
        for j in 0..2 {
            let in_a = a.adopted.iter().any(|r| r.contains(&j));
            let in_b = b.adopted.iter().any(|r| r.contains(&j));
            assert!(in_a != in_b, "token {j}: exactly one insert must own it");
            let want = if in_a { 10 + j as u32 } else { 20 + j as u32 };
            assert_eq!(now.values[j], want, "token {j} holds the winner's value");
        }
        drop(now);
        c.audit();
    });
}

/// unlink vs insert. Protecting step: adoption refuses a node that
/// was unlinked (checked under its parent's and its own lock, the locks the
/// unlink holds). Control: `unlink_check`.
#[test]
fn unlink_vs_adopting_insert() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D1, &[90, 91], 0).unwrap();
        // A sibling keeps the namespace root alive when [1, 2] is unlinked,
        // so the model shows the node's own check, not the root's reclaim
        // (`namespace_root_reclaimed_vs_insert` in `namespaces.rs` covers that).
        c.insert(key(&[7]), D0, &[70], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap());
        // Evicting device 1's residency unlinks the node unless device 0
        // adopted it first.
        c.evict(D1, 2).unwrap();
        let r = t.join().unwrap();
        assert_eq!(r.prefix_len, 0);
        let m = c.match_and_pin(key(&[1, 2]), D0).unwrap();
        assert_eq!(m.values, vec![10, 11], "the insert must not be lost");
        drop(m);
        c.audit();
    });
}

/// epoch reclamation. Protecting step: replaced images are retired
/// with `defer_destroy`, so a reader's guard keeps them alive. Control:
/// `defer_destroy` (free at once); the model sees it through a registry of
/// live images (`radixkv::sync::probe`), not by reading freed memory. The
/// node is resident on two devices, so evicting it from one replaces its
/// image and it stays in the tree (a node that leaves the tree keeps its
/// last image, freed with the node).
#[test]
fn replaced_image_outlives_its_reader() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        c.insert(key(&[1, 2]), D1, &[90, 91], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2])));
        let ev = c.evict(D0, 2).unwrap();
        let seen = t.join().unwrap();
        assert!(seen == vec![2, 2] || seen == vec![0, 2]);
        assert_eq!(ev.values, vec![10, 11]);
        c.audit();
    });
}

/// split vs evict. Protecting step: a split takes the parent's and
/// the node's lock, as eviction does, and splits only the image it computed
/// from, of a node still linked. Control: `split_recheck`.
#[test]
fn split_vs_evict() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        // A sibling on the other device keeps the namespace root alive, so
        // the model shows the split's own re-check, not the root's reclaim.
        c.insert(key(&[7]), D1, &[70], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.match_prefix(key(&[1]), D0).unwrap();
        });
        let first = c.evict(D0, 1).unwrap();
        t.join().unwrap();
        c.audit();
        let rest = c.evict(D0, usize::MAX).unwrap();
        let mut all = first.values.clone();
        all.extend(&rest.values);
        all.sort_unstable();
        assert_eq!(all, vec![10, 11], "every value has exactly one owner");
        assert_eq!(c.node_count(), 1, "only the sibling is left");
        c.audit();
    });
}

/// Two devices evicting leaves under a shared parent. Protecting step: a
/// node's children array and per-device child counts change only under its
/// lock, which every eviction of a child takes. Control: `parent_lock`.
#[test]
fn two_tiers_evict_below_one_parent() {
    model(|| {
        let c = cache(2);
        c.insert(key(&[1, 2]), D0, &[10, 11], 0).unwrap();
        c.insert(key(&[1, 3]), D1, &[20, 21], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.evict(D0, 2).unwrap());
        let mut e1 = c.evict(D1, 2).unwrap().values;
        let mut e0 = t.join().unwrap().values;
        e0.sort_unstable();
        e1.sort_unstable();
        assert_eq!((e0, e1), (vec![10, 11], vec![20, 21]));
        assert_eq!(c.node_count(), 0, "no node may survive without residency");
        c.audit();
    });
}

/// At page size 2: the reader compares whole pages (the page-hash
/// lookup and the first-page check) while a match splits the node after
/// its first page. Protecting step: the reader's parent check and climb.
/// Control: `reader_parent_check`.
#[test]
fn split_vs_reader_at_page_size_two() {
    model(|| {
        let c = Arc::new(RadixCache::builder().page_size(2).build().unwrap());
        c.insert(key(&[1, 2, 3, 4, 5, 6]), D0, &[10, 11, 12, 13, 14, 15], 0)
            .unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3, 4, 5, 6])));
        c.match_prefix(key(&[1, 2, 9, 9]), D0).unwrap();
        assert_eq!(
            t.join().unwrap(),
            vec![6],
            "the whole key stayed cached (page size 2)"
        );
        c.audit();
    });
}

/// Under a wide node: the root has more children than a flat array
/// holds (4 under loom), so they are a table changed in place, and two
/// inserts of the same new first token race. Protecting step: the attach
/// re-check under the parent's lock, on the table. Control:
/// `attach_recheck`.
///
/// The same model checks table reclamation: the root's table is full
/// (eight children in eleven slots), so the insert that locks first
/// builds a bigger table and publishes it while the other may still be
/// probing the old one; the protecting step is retiring the old table
/// with the grace period. Control: `table_retire` frees it at once, and
/// the table probe reports the use after free.
#[test]
fn two_inserts_below_a_table_that_grows() {
    model_with_branches(200_000, || {
        let c = cache(1);
        for k in 100..108u32 {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.insert(key(&[7, 8]), D0, &[10, 11], 0).unwrap());
        let b = c.insert(key(&[7, 8]), D0, &[20, 21], 0).unwrap();
        let a = t.join().unwrap();
        for j in 0..2 {
            let in_a = a.adopted.iter().any(|r| r.contains(&j));
            let in_b = b.adopted.iter().any(|r| r.contains(&j));
            assert!(
                in_a != in_b,
                "token {j} under a wide node: exactly one insert must own it"
            );
        }
        assert_eq!(c.peek(key(&[105])), vec![1], "the other children stay");
        c.audit();
    });
}

/// the removal of a wide node's child racing a reader of a child
/// filed behind it: the root's children 2, 5, 7, 10 and 13 are a table of
/// eleven slots where 5 and 13 share a home slot, 13 filed four slots
/// after 5 (tokens chosen for it). The evictor removes 5 (the least
/// recently used) while a reader looks up 13, which stays cached
/// throughout. Protecting step: a removal leaves its slot filled (a
/// tombstone pointer, the tag kept), so a probe never ends there. Control:
/// `table_tomb` empties the slot, and the reader stops before 13.
#[test]
fn table_removal_vs_reader_behind_it() {
    model_with_branches(20_000, || {
        let c = cache(1);
        for k in [5u32, 2, 7, 10, 13] {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.evict(D0, 1).unwrap().tokens);
        let seen = c.peek(key(&[13]));
        assert_eq!(t.join().unwrap(), 1);
        assert_eq!(
            seen,
            vec![1],
            "a child filed behind a removed one must stay findable"
        );
        assert_eq!(
            c.peek(key(&[13])),
            vec![1],
            "a child filed behind a removed one must stay findable"
        );
        assert_eq!(c.peek(key(&[5])), vec![0], "the least recently used went");
        c.audit();
    });
}

/// `split_vs_reader` below a wide node: the root's children are a table
/// (five of them; four fit a flat array under loom), and a match splits
/// one of them while a reader walks it. The split puts the new prefix node
/// in the child's slot in place (same first page, same tag), so a reader
/// finds either the old child (and climbs to the prefix node) or the
/// prefix node. Protecting step: as `split_vs_reader`, the reader's climb. Control:
/// `reader_parent_check`.
#[test]
fn split_below_a_table_vs_reader() {
    model_with_branches(20_000, || {
        let c = cache(1);
        for k in [5u32, 6, 7, 8] {
            c.insert(key(&[k]), D0, &[k], 0).unwrap();
        }
        c.insert(key(&[1, 2, 3]), D0, &[10, 11, 12], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || c1.peek(key(&[1, 2, 3])));
        c.match_prefix(key(&[1]), D0).unwrap();
        assert_eq!(
            t.join().unwrap(),
            vec![3],
            "the whole key stayed cached (below a table)"
        );
        c.audit();
    });
}

/// tlru's branch depths: an insert that makes a branch deeper vs a match
/// that splits a node on it. `[0]` → `[1 2]` holds 3 tokens; the insert of
/// `[0 1 2 3]` attaches `[3]` and raises `[1 2]`, then climbs its parent
/// links raising `[0]`, while the match of `[0 1]` splits `[1 2]` into
/// `[1]` → `[2]`. Protecting steps: the split reads the child's depth again
/// once its image names the new prefix (a raise that climbed the old image
/// passed the prefix by), and raises the prefix's ancestors when that read
/// raised it (a raise that met the prefix raised stopped there). Controls:
/// `split_rereads_deepest`, `split_raises_ancestors`.
#[test]
fn split_vs_deepening_insert() {
    model_with_branches(4_000, || {
        let c = Arc::new(
            RadixCache::builder()
                .eviction_policy(radixkv::EvictionPolicy::Tlru)
                .build()
                .unwrap(),
        );
        c.insert(key(&[0]), D0, &[10], 0).unwrap();
        c.insert(key(&[0, 1, 2]), D0, &[10, 11, 12], 0).unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.match_prefix(key(&[0, 1]), D0).unwrap();
        });
        c.insert(key(&[0, 1, 2, 3]), D0, &[10, 11, 12, 13], 0)
            .unwrap();
        t.join().unwrap();
        if let Err(e) = c.check() {
            panic!("radixkv audit failed: {e}");
        }
    });
}
