//! KV pools: host round trips, page and run copies (consecutive pages
//! merged into runs, direct and staged paths agreeing), attention's rows
//! read in place or staged (agreeing), typed errors, and
//! (feature `cuda`) the GPU and pinned host pools: typed errors without a
//! driver, and with one round trips, run copies each way and bandwidth
//! figures (run by `scripts/gpu-check.sh` on a GPU machine).

use radixkv::SlotRun;
use radixkv_models::kvpool::{
    copy_pages, copy_runs, page_runs, with_kv_rows, HostKvPool, Kv, KvLayout, KvPool, KvPoolError,
};
use std::any::Any;

const LAYOUT: KvLayout = KvLayout {
    layers: 3,
    slots: 32,
    row: 8,
};

fn filled(layout: KvLayout, seed: f32) -> HostKvPool {
    let mut p = HostKvPool::new(layout);
    for layer in 0..layout.layers {
        for kv in [Kv::K, Kv::V] {
            let slots: Vec<u32> = (0..layout.slots as u32).collect();
            let rows: Vec<f32> = (0..layout.slots * layout.row)
                .map(|i| seed + (layer * 1000 + kv as usize * 100_000 + i) as f32)
                .collect();
            p.write_rows(layer, kv, &slots, &rows).unwrap();
        }
    }
    p
}

/// A pool the copy cannot recognise, to exercise the staged path.
struct Opaque(HostKvPool);

impl KvPool for Opaque {
    fn layout(&self) -> KvLayout {
        self.0.layout()
    }
    fn write_rows(&mut self, l: usize, kv: Kv, s: &[u32], r: &[f32]) -> Result<(), KvPoolError> {
        self.0.write_rows(l, kv, s, r)
    }
    fn read_rows(&self, l: usize, kv: Kv, s: &[u32]) -> Result<Vec<f32>, KvPoolError> {
        self.0.read_rows(l, kv, s)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// `with_kv_rows` gives the same rows, in the order of the slots, from a
/// host pool (in place) and from one it must stage; a bad layer or slot is
/// an error either way.
#[test]
fn attention_rows_are_the_same_in_place_and_staged() {
    let host = filled(LAYOUT, 0.25);
    let staged = Opaque(host.clone());
    let slots = [6, 0, 31, 6];
    for layer in 0..LAYOUT.layers {
        let read = |p: &dyn KvPool| with_kv_rows(p, layer, &slots, |k, v| (k.concat(), v.concat()));
        let (k, v) = read(&host).unwrap();
        assert_eq!(k, host.read_rows(layer, Kv::K, &slots).unwrap());
        assert_eq!(v, host.read_rows(layer, Kv::V, &slots).unwrap());
        assert_eq!(read(&staged).unwrap(), (k, v));
    }
    for p in [&host as &dyn KvPool, &staged] {
        let bad_layer = with_kv_rows(p, LAYOUT.layers, &[0], |_, _| ());
        assert!(matches!(bad_layer, Err(KvPoolError::OutOfRange(_))));
        let bad_slot = with_kv_rows(p, 0, &[LAYOUT.slots as u32], |_, _| ());
        assert!(matches!(bad_slot, Err(KvPoolError::OutOfRange(_))));
    }
}

fn assert_page_copied(src: &dyn KvPool, dst: &dyn KvPool, a: u32, b: u32, ps: u32) {
    for layer in 0..LAYOUT.layers {
        for kv in [Kv::K, Kv::V] {
            let from: Vec<u32> = (a * ps..a * ps + ps).collect();
            let to: Vec<u32> = (b * ps..b * ps + ps).collect();
            assert_eq!(
                src.read_rows(layer, kv, &from).unwrap(),
                dst.read_rows(layer, kv, &to).unwrap()
            );
        }
    }
}

#[test]
fn host_pages_copy_exactly_on_both_paths() {
    let src = filled(LAYOUT, 0.5);
    let mut fast = HostKvPool::new(LAYOUT);
    copy_pages(&src, &mut fast, &[(1, 6), (7, 0)], 4).unwrap();
    assert_page_copied(&src, &fast, 1, 6, 4);
    assert_page_copied(&src, &fast, 7, 0, 4);
    assert!(
        fast.read_rows(0, Kv::K, &[8])
            .unwrap()
            .iter()
            .all(|&x| x == 0.0),
        "other pages untouched"
    );
    let mut staged = Opaque(HostKvPool::new(LAYOUT));
    copy_pages(&src, &mut staged, &[(1, 6), (7, 0)], 4).unwrap();
    assert_eq!(
        staged.0.as_slice(),
        fast.as_slice(),
        "staged and direct copies agree"
    );
}

#[test]
fn bad_requests_are_typed_errors() {
    let mut p = HostKvPool::new(LAYOUT);
    assert!(matches!(
        p.write_rows(3, Kv::K, &[0], &[0.0; 8]),
        Err(KvPoolError::OutOfRange(_))
    ));
    assert!(matches!(
        p.write_rows(0, Kv::K, &[32], &[0.0; 8]),
        Err(KvPoolError::OutOfRange(_))
    ));
    assert!(matches!(
        p.write_rows(0, Kv::K, &[1, 2], &[0.0; 8]),
        Err(KvPoolError::Shape { .. })
    ));
    assert!(matches!(
        p.read_rows(0, Kv::V, &[99]),
        Err(KvPoolError::OutOfRange(_))
    ));
    let other = HostKvPool::new(KvLayout { row: 4, ..LAYOUT });
    assert_eq!(
        copy_pages(&other, &mut p, &[(0, 0)], 4),
        Err(KvPoolError::LayoutMismatch)
    );
    let src = HostKvPool::new(LAYOUT);
    assert!(matches!(
        copy_pages(&src, &mut p, &[(8, 0)], 4),
        Err(KvPoolError::OutOfRange(_))
    ));
}

#[test]
fn consecutive_page_pairs_merge_into_runs() {
    let run = |src, dst, len| SlotRun { src, dst, len };
    assert_eq!(
        page_runs(&[(1, 6), (2, 7), (3, 8), (9, 0)], 4).unwrap(),
        vec![run(4, 24, 12), run(36, 0, 4)]
    );
    // Consecutive on one side only, backwards, or repeated: no merge.
    assert_eq!(
        page_runs(&[(1, 6), (2, 9), (1, 8), (0, 7), (0, 7)], 2).unwrap(),
        vec![
            run(2, 12, 2),
            run(4, 18, 2),
            run(2, 16, 2),
            run(0, 14, 2),
            run(0, 14, 2)
        ]
    );
    assert_eq!(page_runs(&[], 16).unwrap(), vec![]);
    assert_eq!(page_runs(&[(3, 4)], 0).unwrap(), vec![]);
    // Slots past 2^32 cannot be named: a typed error, not a wrap.
    assert!(matches!(
        page_runs(&[(u32::MAX, 0)], 16),
        Err(KvPoolError::OutOfRange(_))
    ));
    assert!(matches!(
        page_runs(&[(0, 1 << 28)], 16),
        Err(KvPoolError::OutOfRange(_))
    ));
}

/// What `runs` must do: slot by slot, row by row, in order.
fn reference_copy(src: &dyn KvPool, dst: &mut dyn KvPool, runs: &[SlotRun]) {
    for r in runs {
        for j in 0..r.len {
            for layer in 0..src.layout().layers {
                for kv in [Kv::K, Kv::V] {
                    let row = src.read_rows(layer, kv, &[r.src + j]).unwrap();
                    dst.write_rows(layer, kv, &[r.dst + j], &row).unwrap();
                }
            }
        }
    }
}

/// Runs of several slots that start and end mid-page (page size 4), a
/// one-slot run, an empty one, and one overwriting part of an earlier one.
const RUNS: [SlotRun; 5] = [
    SlotRun {
        src: 3,
        dst: 17,
        len: 6,
    },
    SlotRun {
        src: 30,
        dst: 0,
        len: 1,
    },
    SlotRun {
        src: 9,
        dst: 32,
        len: 0,
    },
    SlotRun {
        src: 12,
        dst: 25,
        len: 7,
    },
    SlotRun {
        src: 0,
        dst: 20,
        len: 2,
    },
];

#[test]
fn runs_copy_exactly_on_the_direct_and_staged_paths() {
    let src = filled(LAYOUT, 0.5);
    let mut want = HostKvPool::new(LAYOUT);
    reference_copy(&src, &mut want, &RUNS);
    let mut direct = HostKvPool::new(LAYOUT);
    copy_runs(&src, &mut direct, &RUNS).unwrap();
    assert_eq!(direct.as_slice(), want.as_slice(), "host to host");
    // The staged path: an opaque destination, an opaque source, both.
    let mut staged = Opaque(HostKvPool::new(LAYOUT));
    copy_runs(&src, &mut staged, &RUNS).unwrap();
    assert_eq!(staged.0.as_slice(), want.as_slice(), "to an opaque pool");
    let opaque_src = Opaque(src.clone());
    let mut staged = HostKvPool::new(LAYOUT);
    copy_runs(&opaque_src, &mut staged, &RUNS).unwrap();
    assert_eq!(staged.as_slice(), want.as_slice(), "from an opaque pool");
    let mut staged = Opaque(HostKvPool::new(LAYOUT));
    copy_runs(&opaque_src, &mut staged, &RUNS).unwrap();
    assert_eq!(staged.0.as_slice(), want.as_slice(), "opaque to opaque");
    // Something was copied, and not everything.
    assert!(want.as_slice().iter().any(|&x| x != 0.0));
    assert!(want
        .read_rows(2, Kv::V, &[10])
        .unwrap()
        .iter()
        .all(|&x| x == 0.0));
    // Pages are runs: copy_pages agrees with the reference too.
    let pairs = [(1, 6), (2, 7), (7, 0), (3, 1)];
    let mut want = HostKvPool::new(LAYOUT);
    reference_copy(&src, &mut want, &page_runs(&pairs, 4).unwrap());
    let mut got = HostKvPool::new(LAYOUT);
    copy_pages(&src, &mut got, &pairs, 4).unwrap();
    assert_eq!(got.as_slice(), want.as_slice());
    assert_page_copied(&src, &got, 2, 7, 4);
}

#[test]
fn bad_runs_are_typed_errors_and_copy_nothing() {
    let src = filled(LAYOUT, 0.5);
    let run = |src, dst, len| SlotRun { src, dst, len };
    let good = run(0, 0, 4);
    for bad in [
        run(30, 0, 3),       // source past the end
        run(0, 30, 3),       // destination past the end
        run(32, 0, 1),       // starts at the end
        run(33, 0, 0),       // empty, but past the end
        run(u32::MAX, 0, 2), // src + len wraps a u32
        run(0, u32::MAX, 2), // dst + len wraps a u32
        run(1, 1, u32::MAX), // len wraps
        run(0, 0, 33),       // longer than the pool
    ] {
        for dst in [
            &mut HostKvPool::new(LAYOUT) as &mut dyn KvPool,
            &mut Opaque(HostKvPool::new(LAYOUT)),
        ] {
            assert!(
                matches!(
                    copy_runs(&src, dst, &[good, bad]),
                    Err(KvPoolError::OutOfRange(_))
                ),
                "{bad:?}"
            );
            let all: Vec<u32> = (0..32).collect();
            assert!(
                dst.read_rows(0, Kv::K, &all)
                    .unwrap()
                    .iter()
                    .all(|&x| x == 0.0),
                "{bad:?}: nothing copied, not even the good run before it"
            );
        }
    }
    // Empty runs at the very end are in range.
    let mut dst = HostKvPool::new(LAYOUT);
    copy_runs(&src, &mut dst, &[run(32, 32, 0)]).unwrap();
    for other in [
        KvLayout { row: 4, ..LAYOUT },
        KvLayout {
            layers: 2,
            ..LAYOUT
        },
    ] {
        assert_eq!(
            copy_runs(&HostKvPool::new(other), &mut dst, &[good]),
            Err(KvPoolError::LayoutMismatch)
        );
        assert_eq!(
            copy_runs(&src, &mut HostKvPool::new(other), &[]),
            Err(KvPoolError::LayoutMismatch)
        );
    }
    // Pools of different slot counts are fine, runs in range of each.
    let mut big = HostKvPool::new(KvLayout {
        slots: 64,
        ..LAYOUT
    });
    copy_runs(&src, &mut big, &[run(0, 32, 32)]).unwrap();
    assert_eq!(
        big.read_rows(1, Kv::V, &[63]).unwrap(),
        src.read_rows(1, Kv::V, &[31]).unwrap()
    );
    copy_runs(&big, &mut dst, &[run(40, 0, 24)]).unwrap();
    assert_eq!(
        dst.read_rows(2, Kv::K, &[0]).unwrap(),
        src.read_rows(2, Kv::K, &[8]).unwrap()
    );
    assert!(matches!(
        copy_runs(&big, &mut dst, &[run(40, 10, 24)]),
        Err(KvPoolError::OutOfRange(_))
    ));
    // Pages whose slots wrap a u32: typed errors from copy_pages too.
    assert!(matches!(
        copy_pages(&src, &mut dst, &[(u32::MAX, 0)], 4),
        Err(KvPoolError::OutOfRange(_))
    ));
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use cudarc::driver::CudaContext;
    use radixkv_models::kvpool::{CudaKvPool, PinnedKvPool};
    use std::time::Instant;

    /// A GPU pool; these checks need a driver, so without one they fail
    /// (they are ignored by default: `scripts/gpu-check.sh` runs them).
    fn pool(layout: KvLayout) -> CudaKvPool {
        gpu_pool(0, layout)
    }

    fn gpu_pool(ordinal: usize, layout: KvLayout) -> CudaKvPool {
        match CudaKvPool::new(ordinal, layout) {
            Ok(p) => p,
            Err(e) => panic!("this GPU check needs a working CUDA driver: {e}"),
        }
    }

    /// A pinned host pool (GPU 0's context), likewise.
    fn pinned(layout: KvLayout) -> PinnedKvPool {
        match PinnedKvPool::new(0, layout) {
            Ok(p) => p,
            Err(e) => panic!("this GPU check needs a working CUDA driver: {e}"),
        }
    }

    /// What runs everywhere: whether or not a driver is present, creating a
    /// pool is a typed result, never a panic; without a driver it is
    /// exactly `NoCudaDriver`.
    #[test]
    fn cuda_pool_without_a_driver_is_a_typed_error() {
        typed_without_a_driver(CudaKvPool::new(0, LAYOUT), "a pool");
    }

    /// A pool made on this machine: made only with a driver present, and
    /// without one exactly `NoCudaDriver` (`what` names the pool).
    fn typed_without_a_driver<P>(made: Result<P, KvPoolError>, what: &str) {
        let present = driver_present();
        match made {
            Ok(_) => assert!(present, "{what} without a driver"),
            Err(KvPoolError::NoCudaDriver) => assert!(!present, "a driver, yet NoCudaDriver"),
            Err(e) => assert!(
                present,
                "without a driver the error must be NoCudaDriver: {e}"
            ),
        }
    }

    /// The same for a pinned host pool (its memory comes from the driver).
    #[test]
    fn pinned_pool_without_a_driver_is_a_typed_error() {
        typed_without_a_driver(PinnedKvPool::new(0, LAYOUT), "a pinned pool");
        // Too large to address: a typed error, driver or not.
        let huge = KvLayout {
            layers: usize::MAX / 4,
            slots: 8,
            row: 8,
        };
        assert!(matches!(
            PinnedKvPool::new(0, huge),
            Err(KvPoolError::OutOfRange(_))
        ));
    }

    /// Whether a libcuda the dynamic loader could find is on this machine:
    /// in the loader's cache (`ldconfig -p`) or in a `LD_LIBRARY_PATH` folder.
    fn driver_present() -> bool {
        let cached = std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"));
        let on_path = std::env::var_os("LD_LIBRARY_PATH").is_some_and(|p| {
            std::env::split_paths(&p).any(|d| {
                std::fs::read_dir(d).is_ok_and(|mut es| {
                    es.any(|e| {
                        e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcuda.so"))
                    })
                })
            })
        });
        cached || on_path
    }

    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn cuda_pool_round_trip_and_page_copies() {
        let mut gpu = pool(LAYOUT);
        let src = filled(LAYOUT, 0.25);
        gpu.write_rows(2, Kv::V, &[3, 9], &[1.5; 16]).unwrap();
        assert_eq!(gpu.read_rows(2, Kv::V, &[9]).unwrap(), vec![1.5; 8]);
        copy_pages(&src, &mut gpu, &[(1, 2), (3, 5)], 4).unwrap();
        assert_page_copied(&src, &gpu, 1, 2, 4);
        let mut gpu2 = pool(LAYOUT);
        copy_pages(&gpu, &mut gpu2, &[(2, 7)], 4).unwrap();
        assert_page_copied(&gpu, &gpu2, 2, 7, 4);
        let mut back = HostKvPool::new(LAYOUT);
        copy_pages(&gpu2, &mut back, &[(7, 1)], 4).unwrap();
        assert_page_copied(&src, &back, 1, 1, 4);
    }

    /// A pinned pool round-trips rows, and run copies through every path
    /// (pageable and pinned host to GPU, GPU to GPU, GPU to pinned and
    /// pageable host, pinned to pinned), multi-page runs and runs that are
    /// not page-aligned, give exactly what the same copies give between
    /// host pools.
    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn pinned_pool_round_trip_and_run_copies_with_the_gpu() {
        let mut p = pinned(LAYOUT);
        assert!(p.as_slice().unwrap().iter().all(|&x| x == 0.0), "zeroed");
        p.write_rows(1, Kv::K, &[4, 31], &[2.5; 16]).unwrap();
        assert_eq!(p.read_rows(1, Kv::K, &[31]).unwrap(), vec![2.5; 8]);
        assert!(p
            .read_rows(1, Kv::V, &[31])
            .unwrap()
            .iter()
            .all(|&x| x == 0.0));
        assert!(matches!(
            p.read_rows(0, Kv::K, &[32]),
            Err(KvPoolError::OutOfRange(_))
        ));

        let src = filled(LAYOUT, 0.75);
        // Page size 4: pages 0..3 -> 4..7 and 6..8 -> 0..2 (two runs).
        let pairs = [(0, 4), (1, 5), (2, 6), (6, 0), (7, 1)];
        let pairs2 = [(4, 0), (5, 1), (6, 2), (7, 3), (0, 7)];
        assert_eq!(page_runs(&pairs, 4).unwrap().len(), 2);
        assert_eq!(page_runs(&pairs2, 4).unwrap().len(), 2);
        // The host pools' answer: src -pairs-> h1 -RUNS-> h2 -pairs2-> h3.
        let mut h1 = HostKvPool::new(LAYOUT);
        copy_pages(&src, &mut h1, &pairs, 4).unwrap();
        let mut h2 = HostKvPool::new(LAYOUT);
        copy_runs(&h1, &mut h2, &RUNS).unwrap();
        let mut h3 = HostKvPool::new(LAYOUT);
        copy_pages(&h2, &mut h3, &pairs2, 4).unwrap();
        assert!(h3.as_slice().iter().any(|&x| x != 0.0));

        // The same through pinned memory and two GPU pools.
        let mut p0 = pinned(LAYOUT);
        copy_runs(
            &src,
            &mut p0,
            &[SlotRun {
                src: 0,
                dst: 0,
                len: 32,
            }],
        )
        .unwrap();
        assert_eq!(p0.as_slice().unwrap(), src.as_slice(), "pageable -> pinned");
        let mut g1 = pool(LAYOUT);
        copy_pages(&p0, &mut g1, &pairs, 4).unwrap(); // pinned -> GPU
        let mut g2 = pool(LAYOUT);
        copy_runs(&g1, &mut g2, &RUNS).unwrap(); // GPU -> GPU
        let mut p3 = pinned(LAYOUT);
        copy_pages(&g2, &mut p3, &pairs2, 4).unwrap(); // GPU -> pinned
        assert_eq!(p3.as_slice().unwrap(), h3.as_slice(), "through the GPU");
        let mut h3_gpu = HostKvPool::new(LAYOUT);
        copy_pages(&g2, &mut h3_gpu, &pairs2, 4).unwrap(); // GPU -> pageable
        assert_eq!(h3_gpu.as_slice(), h3.as_slice(), "GPU -> pageable host");
        let mut p4 = pinned(LAYOUT);
        copy_runs(&p3, &mut p4, &RUNS).unwrap(); // pinned -> pinned
        let mut h4 = HostKvPool::new(LAYOUT);
        copy_runs(&h3, &mut h4, &RUNS).unwrap();
        assert_eq!(p4.as_slice().unwrap(), h4.as_slice(), "pinned -> pinned");
        // Pageable -> GPU with unaligned runs, read back whole.
        let mut g3 = pool(LAYOUT);
        copy_runs(&src, &mut g3, &RUNS).unwrap();
        let mut back = pinned(LAYOUT);
        copy_runs(
            &g3,
            &mut back,
            &[SlotRun {
                src: 0,
                dst: 0,
                len: 32,
            }],
        )
        .unwrap();
        let mut want = HostKvPool::new(LAYOUT);
        copy_runs(&src, &mut want, &RUNS).unwrap();
        assert_eq!(back.as_slice().unwrap(), want.as_slice(), "pageable -> GPU");

        // Bad runs are typed errors on the GPU paths too, and copy nothing.
        let bad = [
            SlotRun {
                src: 0,
                dst: 0,
                len: 4,
            },
            SlotRun {
                src: u32::MAX,
                dst: 0,
                len: 2,
            },
        ];
        let mut g4 = pool(LAYOUT);
        assert!(matches!(
            copy_runs(&p0, &mut g4, &bad),
            Err(KvPoolError::OutOfRange(_))
        ));
        assert!(matches!(
            copy_runs(&g1, &mut p4, &bad),
            Err(KvPoolError::OutOfRange(_))
        ));
        assert_eq!(p4.as_slice().unwrap(), h4.as_slice(), "unchanged");
        let other = pool(KvLayout { row: 4, ..LAYOUT });
        assert_eq!(
            copy_runs(&other, &mut g4, &[]),
            Err(KvPoolError::LayoutMismatch)
        );
        let mut empty = pinned(LAYOUT);
        copy_runs(
            &g4,
            &mut empty,
            &[SlotRun {
                src: 0,
                dst: 0,
                len: 32,
            }],
        )
        .unwrap();
        assert!(empty.as_slice().unwrap().iter().all(|&x| x == 0.0));
    }

    /// `b` holds `a`'s rows where `pairs` (pages of `ps`) sent them, and
    /// they are not all zero: every row of every run when `full`, else each
    /// run's first, middle and last row (reading a GPU pool is a copy per
    /// row), every layer, K and V.
    fn copied(a: &dyn KvPool, b: &dyn KvPool, pairs: &[(u32, u32)], ps: usize, full: bool) {
        for r in page_runs(pairs, ps).unwrap() {
            let js: Vec<u32> = if full {
                (0..r.len).collect()
            } else {
                vec![0, r.len / 2, r.len - 1]
            };
            let from: Vec<u32> = js.iter().map(|j| r.src + j).collect();
            let to: Vec<u32> = js.iter().map(|j| r.dst + j).collect();
            for layer in 0..a.layout().layers {
                for kv in [Kv::K, Kv::V] {
                    let want = a.read_rows(layer, kv, &from).unwrap();
                    assert!(want.iter().any(|&x| x != 0.0), "run {r:?}: data to check");
                    assert!(
                        want == b.read_rows(layer, kv, &to).unwrap(),
                        "run {r:?}, layer {layer}, {kv:?}"
                    );
                }
            }
        }
    }

    /// Copy bandwidth of the batched copies (one memcpy per run, layer and
    /// K/V) between pools of 2 GiB: pageable and pinned host to GPU, GPU
    /// to pinned host, GPU to GPU (two pools on one GPU), across two GPUs
    /// when there are two, and for contrast pinned host to GPU one page at
    /// a time. Each copy is checked, so a wrong copy fails the test.
    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn cuda_copy_bandwidth() {
        // 8 layers x 2 x 32,768 slots x 1,024 floats = 2 GiB per pool.
        let ps = 16usize;
        let layout = KvLayout {
            layers: 8,
            slots: 2048 * ps,
            row: 1024,
        };
        // Source pages 0..1024 (half the pool, 1 GiB) to destination pages
        // 1024..2048 in 16 runs of 64 pages, the runs in reverse order:
        // each run is one 4 MiB memcpy per layer and K/V (256 in all).
        let fwd: Vec<(u32, u32)> = (0..16u32)
            .flat_map(|r| (0..64u32).map(move |j| (r * 64 + j, 2048 - (r + 1) * 64 + j)))
            .collect();
        let back: Vec<(u32, u32)> = fwd.iter().map(|&(a, b)| (b, a)).collect();
        // For contrast: the same pages with each one a copy of its own.
        let one_by_one: Vec<(u32, u32)> = (0..1024u32).map(|p| (1024 + p, 1023 - p)).collect();
        let runs_of = |pairs: &[(u32, u32)]| page_runs(pairs, ps).unwrap();
        assert_eq!((runs_of(&fwd).len(), runs_of(&back).len()), (16, 16));
        assert_eq!(runs_of(&one_by_one).len(), 1024);
        let bytes = (fwd.len() * ps * layout.row * 4 * layout.layers * 2) as f64;
        let rate = |name: &str, pairs: &[(u32, u32)], f: &mut dyn FnMut()| {
            f(); // warm-up (and the copy the checks read)
            let reps = 3;
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            let gbs = bytes * reps as f64 / t.elapsed().as_secs_f64() / 1e9;
            let runs = runs_of(pairs);
            let copies = runs.len() * layout.layers * 2;
            println!(
                "copy bandwidth, {name}: {gbs:.1} GB/s ({:.0} MiB a copy in {copies} memcpys of {} KiB: {} pages of {ps} tokens, {} layers, K and V)",
                bytes / (1 << 20) as f64,
                runs[0].len as usize * layout.row * 4 / 1024,
                pairs.len(),
                layout.layers,
            );
        };

        let mut host = HostKvPool::new(layout);
        let half: Vec<u32> = (0..1024 * ps as u32).collect();
        for layer in 0..layout.layers {
            for kv in [Kv::K, Kv::V] {
                let k = (layer * 2 + kv as usize) * 7919;
                let rows: Vec<f32> = (0..half.len() * layout.row)
                    .map(|i| ((i * 31 + k) % 1_000_003) as f32)
                    .collect();
                host.write_rows(layer, kv, &half, &rows).unwrap();
            }
        }
        let mut a = pool(layout);
        let mut b = pool(layout);
        let mut pin = pinned(layout);

        rate("pageable host -> GPU", &fwd, &mut || {
            copy_pages(&host, &mut a, &fwd, ps).unwrap()
        });
        copied(&host, &a, &fwd, ps, false);
        rate("GPU -> GPU (two pools on one GPU)", &back, &mut || {
            copy_pages(&a, &mut b, &back, ps).unwrap()
        });
        copied(&a, &b, &back, ps, false);
        rate("GPU -> pinned host", &fwd, &mut || {
            copy_pages(&b, &mut pin, &fwd, ps).unwrap()
        });
        copied(&host, &pin, &fwd, ps, true);
        let mut c = pool(layout);
        rate("pinned host -> GPU", &back, &mut || {
            copy_pages(&pin, &mut c, &back, ps).unwrap()
        });
        copied(&pin, &c, &back, ps, false);

        let gpus = CudaContext::device_count().unwrap();
        if gpus >= 2 {
            let mut d = gpu_pool(1, layout);
            let p2p = a.enable_peer_access(&d).unwrap();
            let how = if p2p {
                "peer access on"
            } else {
                "no peer access: staged"
            };
            rate(&format!("GPU 0 -> GPU 1 ({how})"), &back, &mut || {
                copy_pages(&a, &mut d, &back, ps).unwrap()
            });
            copied(&a, &d, &back, ps, false);
            let mut e = pool(layout);
            rate(&format!("GPU 1 -> GPU 0 ({how})"), &fwd, &mut || {
                copy_pages(&d, &mut e, &fwd, ps).unwrap()
            });
            copied(&host, &e, &fwd, ps, false);
        } else {
            println!(
                "peer bandwidth (GPU to GPU across devices): unmeasured, this machine has one GPU"
            );
        }

        rate(
            "pinned host -> GPU, one page per memcpy (pages reversed: no run merges)",
            &one_by_one,
            &mut || copy_pages(&pin, &mut b, &one_by_one, ps).unwrap(),
        );
        copied(&pin, &b, &one_by_one, ps, false);
    }
}
