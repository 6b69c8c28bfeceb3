//! Loom model of the namespace table: a root reclaimed while an insert
//! into its namespace races it.
//!
//! Each model names the protecting step it relies on; `negative.sh`
//! builds each without it and requires the model to fail with its own
//! message.
#![cfg(loom)]

use loom::thread;
use loom_tests::{cache, key, model, D0};
use std::sync::Arc;

/// A namespace root reclaimed while an insert into that namespace races it:
/// the eviction of the namespace's last node marks its root obsolete under
/// the root's lock and removes it from the table; an insert that found the
/// root before must not hang its node below it (it would be unreachable).
/// Protecting step: attaching re-checks, under the parent's lock, that the
/// parent (here the root) is not obsolete; the insert then walks again and
/// gets a fresh root. Control: `root_obsolete_check`.
#[test]
fn namespace_root_reclaimed_vs_insert() {
    model(|| {
        let c = cache(1);
        c.insert(key(&[1]).with_namespace("t"), D0, &[10], 0)
            .unwrap();
        let c1 = Arc::clone(&c);
        let t = thread::spawn(move || {
            c1.insert(key(&[2]).with_namespace("t"), D0, &[20], 0)
                .unwrap();
        });
        c.evict(D0, 1).unwrap();
        t.join().unwrap();
        assert_eq!(
            c.peek(key(&[2]).with_namespace("t")),
            vec![1],
            "the insert into a reclaimed namespace must not be lost"
        );
        c.audit();
    });
}
