//! KV pools: host round trips and page copies, typed errors, and (feature
//! `cuda`) the GPU pool: a typed error without a driver, and with one a
//! round trip, page copies each way and a bandwidth figure (run by
//! `scripts/gpu-check.sh` on a GPU machine).

use radixkv_engine::kvpool::{copy_pages, HostKvPool, Kv, KvLayout, KvPool, KvPoolError};
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

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use radixkv_engine::kvpool::CudaKvPool;
    use std::time::Instant;

    /// A GPU pool; these checks need a driver, so without one they fail
    /// (they are ignored by default: `scripts/gpu-check.sh` runs them).
    fn pool(layout: KvLayout) -> CudaKvPool {
        match CudaKvPool::new(0, layout) {
            Ok(p) => p,
            Err(e) => panic!("this GPU check needs a working CUDA driver: {e}"),
        }
    }

    /// What runs everywhere: whether or not a driver is present, creating a
    /// pool is a typed result, never a panic; without a driver it is
    /// exactly `NoCudaDriver`.
    #[test]
    fn cuda_pool_without_a_driver_is_a_typed_error() {
        let present = driver_present();
        match CudaKvPool::new(0, LAYOUT) {
            Ok(_) => assert!(present, "a pool without a driver"),
            Err(KvPoolError::NoCudaDriver) => assert!(!present, "a driver, yet NoCudaDriver"),
            Err(e) => assert!(
                present,
                "without a driver the error must be NoCudaDriver: {e}"
            ),
        }
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

    #[test]
    #[ignore = "needs a CUDA driver: scripts/gpu-check.sh runs it"]
    fn cuda_page_copy_bandwidth() {
        // 8 layers x 2 x 32,768 slots x 1,024 floats = 2 GiB per pool.
        let layout = KvLayout {
            layers: 8,
            slots: 2048 * 16,
            row: 1024,
        };
        let mut a = pool(layout);
        let mut b = pool(layout);
        let mut host = HostKvPool::new(layout);
        let pairs: Vec<(u32, u32)> = (0..1024).map(|p| (p, 2047 - p)).collect();
        let bytes = (pairs.len() * 16 * layout.row * 4 * layout.layers * 2) as f64;
        let rate = |name: &str, f: &mut dyn FnMut()| {
            f(); // warm-up
            let t = Instant::now();
            f();
            let gbs = bytes / t.elapsed().as_secs_f64() / 1e9;
            println!(
                "page copy {name}: {gbs:.1} GB/s ({} pages of 16 tokens x {} layers, K and V)",
                pairs.len(),
                layout.layers
            );
        };
        rate("host -> GPU", &mut || {
            copy_pages(&host, &mut a, &pairs, 16).unwrap()
        });
        rate("GPU -> GPU (two pools)", &mut || {
            copy_pages(&a, &mut b, &pairs, 16).unwrap()
        });
        rate("GPU -> host", &mut || {
            copy_pages(&b, &mut host, &pairs, 16).unwrap()
        });
    }
}
