//! The values codec: [`Values`], the values of a node's tokens on one
//! device (the KV slot of each token), stored in the smallest of three
//! encodings. Images hold one per device (see `node`); the codec knows
//! nothing of the tree.

use std::alloc::Layout;
use std::ptr::NonNull;

/// The values of a node's tokens on one device, in one 16-byte handle.
///
/// The first word of the array says how the rest is stored; the smallest
/// of three encodings is chosen when the values are stored:
///
/// * verbatim: one `u32` per token;
/// * page bases (page size > 1, every page a contiguous run of slots, as a
///   paged allocator hands out): one `u32` per page;
/// * runs: `(first, length)` pairs of contiguous values, e.g. one pair for
///   a request whose slots were allocated together.
#[derive(Clone, Debug)]
pub(crate) struct Values(Words);

/// The encoded words: up to three inline (one run of a request's slots, or
/// one or two page bases: the common cases, with no allocation of their
/// own), more in an allocation of their own behind a thin pointer (slices
/// of a node's values at a split share nothing: they are re-encoded).
#[derive(Clone, Debug)]
enum Words {
    Inline { len: u8, words: [u32; 3] },
    Heap(HeapWords),
}

/// Four or more words in one allocation: their count, then the words.
/// A thin pointer (8 bytes, where an `Arc<[u32]>` is 16 and carries two
/// counts), which keeps a [`Values`] at 16 bytes and a node's one-device
/// [`DeviceValues`] at 24. A copy copies the words: values are copied only
/// when a new image is built (a residency added or removed, a split), which
/// allocates anyway.
struct HeapWords(NonNull<usize>);

// SAFETY: a `HeapWords` owns its allocation alone (no interior
// mutability, no sharing: `Clone` copies), like a `Box<[u32]>`.
unsafe impl Send for HeapWords {}
// SAFETY: as above; `&HeapWords` only reads.
unsafe impl Sync for HeapWords {}

/// The allocation of an `H` followed by `n` `u32`s, and the words' offset
/// in it: what `repr(C)` gives a struct whose tail is `[u32]` (the head at
/// 0, the tail at the head's size rounded up to `u32`'s alignment), which
/// is what [`Layout::extend`] computes. Heap words (a count, then the
/// words) and images (a head, then the key, `node::Image`) are laid out so.
pub(crate) fn head_and_words<H>(n: usize) -> (Layout, usize) {
    // `n` words exist in memory (they are copied from a slice), so their
    // bytes fit in an `isize`; only a head added to nearly `isize::MAX`
    // bytes could overflow, which no token sequence reaches (as `Vec`, a
    // capacity overflow, not an input error).
    let (layout, offset) = Layout::array::<u32>(n)
        .and_then(|w| Layout::new::<H>().extend(w))
        .expect("allocation size overflows isize");
    (layout.pad_to_align(), offset)
}

impl HeapWords {
    fn new(words: &[u32]) -> HeapWords {
        let (layout, offset) = head_and_words::<usize>(words.len());
        // SAFETY: `layout` is not empty (it holds the count).
        let p = unsafe { std::alloc::alloc(layout) };
        let Some(p) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: a fresh allocation of `layout`: the count at its start
        // (aligned for `usize`, the layout's alignment), `words.len()`
        // `u32`s at `offset`.
        unsafe {
            p.cast::<usize>().write(words.len());
            std::ptr::copy_nonoverlapping(
                words.as_ptr(),
                p.as_ptr().add(offset).cast::<u32>(),
                words.len(),
            );
        }
        HeapWords(p.cast())
    }

    fn as_slice(&self) -> &[u32] {
        // SAFETY: `new` wrote the count and that many words at the offset
        // `layout` gives; the allocation lives as long as `self`.
        unsafe {
            let n = self.0.as_ptr().read();
            let (_, offset) = head_and_words::<usize>(n);
            std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>().add(offset).cast::<u32>(), n)
        }
    }
}

impl Clone for HeapWords {
    fn clone(&self) -> HeapWords {
        HeapWords::new(self.as_slice())
    }
}

impl Drop for HeapWords {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with the layout of this count, freed
        // only here, once.
        unsafe {
            let (layout, _) = head_and_words::<usize>(self.0.as_ptr().read());
            std::alloc::dealloc(self.0.as_ptr().cast(), layout);
        }
    }
}

impl std::fmt::Debug for HeapWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Words {
    fn of(words: &[u32]) -> Words {
        match *words {
            [a] => Words::Inline {
                len: 1,
                words: [a, 0, 0],
            },
            [a, b] => Words::Inline {
                len: 2,
                words: [a, b, 0],
            },
            [a, b, c] => Words::Inline {
                len: 3,
                words: [a, b, c],
            },
            _ => Words::Heap(HeapWords::new(words)),
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Words::Inline { len, words } => &words[..usize::from(*len)],
            Words::Heap(w) => w.as_slice(),
        }
    }
}

/// Whether `v` is `first, first + 1, …` (the caller checked that the last
/// of them fits in a `u32`). Branch-free within each chunk of 64, so the
/// compiler vectorises it (a request's values are checked on every
/// insert); a chunk that differs ends the check.
fn is_one_run(v: &[u32], first: u32) -> bool {
    v.chunks(64).zip((0u32..).step_by(64)).all(|(chunk, at)| {
        let base = first.wrapping_add(at);
        // `x - j == base` exactly when `x == base + j`: no sum overflows
        // (the caller's check), so wrapping arithmetic is exact here.
        chunk
            .iter()
            .zip(0u32..)
            .fold(0, |acc, (&x, j)| acc | (x.wrapping_sub(j) ^ base))
            == 0
    })
}

const VERBATIM: u32 = 0;
const PAGE_BASES: u32 = 1;
const RUNS: u32 = 2;

impl Values {
    /// Values for `v` (whole pages of `ps` tokens).
    pub(crate) fn new(v: &[u32], ps: usize) -> Values {
        // The common case (a request's slots allocated together): one run,
        // found in one pass without building the run list.
        if let Some((&first, _)) = v.split_first() {
            // Chosen below too whenever one run is smaller than the page
            // bases and the verbatim form: more than 2 tokens and pages.
            let smaller = v.len() > 2 && (ps <= 1 || v.len() / ps > 2);
            let one_run =
                smaller && first.checked_add(v.len() as u32 - 1).is_some() && is_one_run(v, first);
            if one_run {
                return Values(Words::of(&[RUNS, first, v.len() as u32]));
            }
        }
        Values::general(v, ps)
    }

    /// The encoding chosen by building every candidate (what [`new`]'s
    /// one-run shortcut must agree with).
    ///
    /// [`new`]: Values::new
    fn general(v: &[u32], ps: usize) -> Values {
        let mut runs: Vec<u32> = Vec::new();
        for &x in v {
            match runs.len() {
                n if n >= 2 && runs[n - 2].checked_add(runs[n - 1]) == Some(x) => runs[n - 1] += 1,
                _ => runs.extend([x, 1]),
            }
        }
        let pages_ok = ps > 1
            && v.chunks(ps).all(|c| {
                c.iter()
                    .enumerate()
                    .all(|(j, &x)| c[0].checked_add(j as u32) == Some(x))
            });
        let pages = if pages_ok { v.len() / ps } else { usize::MAX };
        let data: Vec<u32> = if runs.len() < v.len().min(pages) {
            std::iter::once(RUNS).chain(runs).collect()
        } else if pages < v.len() {
            std::iter::once(PAGE_BASES)
                .chain(v.chunks(ps).map(|c| c[0]))
                .collect()
        } else {
            std::iter::once(VERBATIM).chain(v.iter().copied()).collect()
        };
        Values(Words::of(&data))
    }

    fn kind(&self) -> u32 {
        self.0.as_slice()[0]
    }

    fn body(&self) -> &[u32] {
        &self.0.as_slice()[1..]
    }

    /// How many tokens these values cover.
    pub(crate) fn tokens(&self, ps: usize) -> usize {
        match self.kind() {
            PAGE_BASES => self.body().len() * ps,
            RUNS => self.body().chunks(2).map(|r| r[1] as usize).sum(),
            _ => self.body().len(),
        }
    }

    /// The values of tokens `from..to` (multiples of `ps`).
    pub(crate) fn slice(&self, from: usize, to: usize, ps: usize) -> Values {
        let body = self.body();
        let data: Vec<u32> = match self.kind() {
            PAGE_BASES => std::iter::once(PAGE_BASES)
                .chain(body[from / ps..to / ps].iter().copied())
                .collect(),
            RUNS => {
                let mut out = vec![RUNS];
                let mut at = 0;
                for r in body.chunks(2) {
                    let (first, len) = (r[0] as usize, r[1] as usize);
                    let (lo, hi) = (from.max(at), to.min(at + len));
                    if lo < hi {
                        out.extend([(first + lo - at) as u32, (hi - lo) as u32]);
                    }
                    at += len;
                }
                out
            }
            _ => std::iter::once(VERBATIM)
                .chain(body[from..to].iter().copied())
                .collect(),
        };
        Values(Words::of(&data))
    }

    /// Appends one value per token to `out`.
    pub(crate) fn append_to(&self, out: &mut Vec<u32>, ps: usize) {
        let body = self.body();
        match self.kind() {
            // Inclusive ends: a page or run may end at `u32::MAX` itself,
            // where `first + len` would overflow (`new` only stores pages
            // and runs that fit, so `len - 1` more never does).
            PAGE_BASES if ps > 0 => {
                out.reserve(body.len() * ps);
                for &b in body {
                    out.extend(b..=b + (ps as u32 - 1));
                }
            }
            RUNS => {
                for r in body.chunks_exact(2) {
                    if r[1] > 0 {
                        out.extend(r[0]..=r[0] + (r[1] - 1));
                    }
                }
            }
            PAGE_BASES => {}
            _ => out.extend_from_slice(body),
        }
    }
}

/// The values of a node's tokens on each device where it is resident, and
/// only there, in device order. A node is usually resident on one device
/// (kept inline, in the image itself: no allocation of its own; 24 bytes,
/// the device number in the padding beside the tag) or a few (sorted
/// `(device, values)` pairs, 24 bytes each) of many: no slot for every
/// device, and a reader that wants the resident devices (routing) walks
/// just those.
#[derive(Clone, Debug, Default)]
pub(crate) enum DeviceValues {
    /// Resident nowhere.
    #[default]
    Nowhere,
    /// Resident on one device: device, values. Two fields, not a pair: the
    /// tag then shares the pair's padding (a pair is one 24-byte field,
    /// and the enum would be 32).
    One(u32, Values),
    /// Resident on two or more devices (sorted by device).
    Several(Box<[(u32, Values)]>),
}

// One word less than the pair layout would take (see `One`).
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<DeviceValues>() == 24);

impl DeviceValues {
    /// Resident nowhere.
    pub(crate) fn none() -> DeviceValues {
        DeviceValues::Nowhere
    }

    /// Resident on `d` only.
    pub(crate) fn one(d: usize, v: Values) -> DeviceValues {
        DeviceValues::One(d as u32, v)
    }

    fn from_pairs(mut pairs: Vec<(u32, Values)>) -> DeviceValues {
        match pairs.len() {
            0 => DeviceValues::Nowhere,
            1 => {
                let (d, v) = pairs.pop().expect("one pair");
                DeviceValues::One(d, v)
            }
            _ => DeviceValues::Several(pairs.into_boxed_slice()),
        }
    }

    /// The devices with values, in order, with them.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &Values)> {
        let (one, several) = match self {
            DeviceValues::Nowhere => (None, &[][..]),
            DeviceValues::One(d, v) => (Some((*d, v)), &[][..]),
            DeviceValues::Several(p) => (None, &p[..]),
        };
        one.into_iter()
            .chain(several.iter().map(|(d, v)| (*d, v)))
            .map(|(d, v)| (d as usize, v))
    }

    /// The values on `d`, if resident there.
    pub(crate) fn get(&self, d: usize) -> Option<&Values> {
        self.iter().find(|(e, _)| *e == d).map(|(_, v)| v)
    }

    /// Whether there are values on `d`.
    pub(crate) fn is_present(&self, d: usize) -> bool {
        self.iter().any(|(e, _)| e == d)
    }

    /// A copy with `v` on `d` (added or replacing).
    pub(crate) fn with(&self, d: usize, v: Values) -> DeviceValues {
        let mut out: Vec<(u32, Values)> = Vec::with_capacity(self.iter().count() + 1);
        out.extend(
            self.iter()
                .filter(|(e, _)| *e != d)
                .map(|(e, v)| (e as u32, v.clone())),
        );
        let at = out.partition_point(|(e, _)| (*e as usize) < d);
        out.insert(at, (d as u32, v));
        DeviceValues::from_pairs(out)
    }

    /// A copy without `d`.
    pub(crate) fn without(&self, d: usize) -> DeviceValues {
        DeviceValues::from_pairs(
            self.iter()
                .filter(|(e, _)| *e != d)
                .map(|(e, v)| (e as u32, v.clone()))
                .collect(),
        )
    }

    /// The same devices with `f` of their values.
    pub(crate) fn map(&self, f: impl Fn(&Values) -> Values) -> DeviceValues {
        DeviceValues::from_pairs(self.iter().map(|(e, v)| (e as u32, f(v))).collect())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn values_pick_the_smallest_encoding_and_expand_exactly() {
        let expand = |v: &Values, ps| {
            let mut out = Vec::new();
            v.append_to(&mut out, ps);
            out
        };
        // Two scattered pages: page bases.
        let pages = [32, 33, 34, 35, 8, 9, 10, 11];
        let v = Values::new(&pages, 4);
        assert_eq!((v.kind(), v.body().len()), (PAGE_BASES, 2));
        assert_eq!(expand(&v.slice(4, 8, 4), 4), [8, 9, 10, 11]);
        // One contiguous run (any page size): one pair.
        let run: Vec<u32> = (100..300).collect();
        let v = Values::new(&run, 1);
        assert_eq!((v.kind(), v.body()), (RUNS, &[100, 200][..]));
        assert_eq!(v.tokens(1), 200);
        assert_eq!(
            expand(&v.slice(50, 60, 1), 1),
            (150..160).collect::<Vec<_>>()
        );
        let two = [5, 6, 7, 1, 2, 3, 4, 9];
        let v = Values::new(&two, 1);
        assert_eq!(v.kind(), RUNS);
        assert_eq!(expand(&v.slice(2, 7, 1), 1), [7, 1, 2, 3, 4]);
        assert_eq!(expand(&v, 1), two);
        // Scattered: verbatim.
        let scattered = [1, 7, 3, 4];
        let v = Values::new(&scattered, 2);
        assert_eq!(v.kind(), VERBATIM);
        assert_eq!(v.tokens(2), 4);
        assert_eq!(expand(&v, 2), scattered);
        // u32::MAX cannot start a run of two.
        assert_eq!(Values::new(&[u32::MAX, 0], 2).kind(), VERBATIM);
    }

    /// Every encoding at the top of the value space and with scattered
    /// values, at page sizes 1, 2 and 16: expanding gives back exactly the
    /// values stored, as many as `tokens()` says, and so does every
    /// page-aligned slice.
    #[test]
    fn values_round_trip_at_u32_max_and_scattered() {
        let expand = |v: &Values, ps| {
            let mut out = Vec::new();
            v.append_to(&mut out, ps);
            out
        };
        for ps in [1usize, 2, 16] {
            let n = 4 * ps;
            let top = u32::MAX - (n as u32 - 1);
            let cases: Vec<Vec<u32>> = vec![
                // One run ending at u32::MAX (runs).
                (top..=u32::MAX).collect(),
                // Pages whose last one ends at u32::MAX, bases scattered.
                (0..n as u32)
                    .map(|j| {
                        let page = j / ps as u32;
                        let base = if page == 3 {
                            u32::MAX - (ps as u32 - 1)
                        } else {
                            1000 * (3 - page)
                        };
                        base + j % ps as u32
                    })
                    .collect(),
                // Two runs, the second ending at u32::MAX.
                (0..n as u32)
                    .map(|j| {
                        if (j as usize) < n / 2 {
                            7 + j
                        } else {
                            u32::MAX - (n as u32 - 1 - j)
                        }
                    })
                    .collect(),
                // Scattered (verbatim), including both extremes.
                (0..n as u32)
                    .map(|j| match j % 3 {
                        0 => u32::MAX - j,
                        1 => j,
                        _ => j.wrapping_mul(0x9E37_79B1),
                    })
                    .collect(),
                // The single top value, alone in its pages.
                vec![u32::MAX; n],
            ];
            for v in cases {
                let enc = Values::new(&v, ps);
                assert_eq!(enc.tokens(ps), n, "ps {ps} {v:?}");
                assert_eq!(expand(&enc, ps), v, "ps {ps} kind {}", enc.kind());
                // A copy (deep, for words kept on the heap) is the same.
                assert_eq!(expand(&enc.clone(), ps), v, "ps {ps} copy");
                for from in (0..=n).step_by(ps) {
                    for to in (from..=n).step_by(ps) {
                        let s = enc.slice(from, to, ps);
                        assert_eq!(s.tokens(ps), to - from, "ps {ps} {from}..{to}");
                        assert_eq!(expand(&s, ps), v[from..to], "ps {ps} {from}..{to}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_one_run_shortcut_picks_the_general_encoding() {
        for ps in [1usize, 2, 4, 16] {
            for pages in 1..=8usize {
                let n = pages * ps;
                for first in [
                    0u32,
                    5,
                    1 << 20,
                    u32::MAX - n as u32 + 1,
                    u32::MAX - n as u32,
                ] {
                    let v: Vec<u32> = (0..n as u32).map(|j| first.wrapping_add(j)).collect();
                    assert_eq!(
                        Values::new(&v, ps).0.as_slice(),
                        Values::general(&v, ps).0.as_slice(),
                        "ps {ps}, {n} values from {first}"
                    );
                }
            }
        }
    }

    /// A run broken at any place (first chunk of 64, a later one, the
    /// last value) is not one run: the shortcut agrees with the general
    /// encoding there too.
    #[test]
    fn a_run_broken_anywhere_is_not_one_run() {
        for n in [16usize, 64, 65, 200, 1_200] {
            for at in [1, 2, 31, 63, 64, 65, 127, 128, n / 2, n - 1] {
                if at >= n {
                    continue;
                }
                let mut v: Vec<u32> = (1_000..1_000 + n as u32).collect();
                v[at] += 7;
                assert!(!is_one_run(&v, 1_000), "{n} values broken at {at}");
                assert_eq!(
                    Values::new(&v, 16).0.as_slice(),
                    Values::general(&v, 16).0.as_slice(),
                    "{n} values broken at {at}"
                );
            }
            let v: Vec<u32> = (1_000..1_000 + n as u32).collect();
            assert!(is_one_run(&v, 1_000));
        }
    }

    #[test]
    fn device_values_stay_sorted_and_sparse() {
        let v = |x: u32| Values::new(&[x, x + 1, x + 2], 1);
        let first = |dv: &DeviceValues, d: usize| {
            let mut out = Vec::new();
            if let Some(x) = dv.get(d) {
                x.append_to(&mut out, 1);
            }
            out.first().copied()
        };
        let a = DeviceValues::none()
            .with(3, v(30))
            .with(1, v(10))
            .with(7, v(70));
        assert_eq!(a.iter().map(|(d, _)| d).collect::<Vec<_>>(), [1, 3, 7]);
        assert_eq!(first(&a, 3), Some(30));
        assert!(a.is_present(7) && !a.is_present(0));
        let b = a.with(3, v(33)).without(1);
        assert_eq!(b.iter().map(|(d, _)| d).collect::<Vec<_>>(), [3, 7]);
        assert_eq!(first(&b, 3), Some(33));
        assert_eq!(
            first(&a, 3),
            Some(30),
            "copies leave the original as it was"
        );
        let c = b.map(|x| x.slice(1, 3, 1));
        assert_eq!(first(&c, 7), Some(71));
        assert_eq!(DeviceValues::one(5, v(1)).iter().count(), 1);
    }
}
