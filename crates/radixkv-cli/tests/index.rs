//! `radixkv index` following `radixkv serve --kv-events` (two devices, a
//! host tier, pools small enough to evict), both as processes: after a
//! stream of completions, every prompt's answer from the index equals
//! what the serving engine says it holds (its own `/query`), per device
//! and on the host tier. Then the engine is killed and started again on
//! the same ports: the index follows the restart (the old blocks gone, the
//! new ones in) without being told.

#![cfg(unix)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(60);

/// `n` consecutive free ports.
fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 65_000 - n
            && (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok())
        {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// Kills the process when dropped (a failed test leaves none behind).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `radixkv ARGS` and reads the address it prints.
fn spawn(args: &[&str]) -> (Proc, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_radixkv"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start radixkv");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Proc(child), addr)
}

fn serve(events: u16, replay: u16) -> (Proc, SocketAddr) {
    spawn(&[
        "serve",
        "--port",
        "0",
        "--devices",
        "2",
        "--page-size",
        "16",
        "--pages-per-device",
        "48",
        "--host-pages",
        "64",
        "--speedup",
        "1000",
        "--kv-events",
        &format!("tcp://127.0.0.1:{events}"),
        "--kv-events-replay",
        &format!("tcp://127.0.0.1:{replay}"),
        "--kv-events-startup-hold-s",
        "0",
    ])
}

/// One request on its own connection: (status, JSON body).
fn call(addr: SocketAddr, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let json = reply
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A GET's body as text.
fn text(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
        .lines()
        .filter(|l| !l.starts_with('#') && !l.ends_with(" 0"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// 6 groups × 5 prompts: a shared 96-token system part, a 40-token
/// question (tokens below 256: the byte codec's vocabulary).
fn prompts(seed: u32) -> Vec<Vec<u32>> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x % 256
    };
    let mut out = Vec::new();
    for _ in 0..6 {
        let system: Vec<u32> = (0..96).map(|_| next()).collect();
        for _ in 0..5 {
            let mut p = system.clone();
            p.extend((0..40).map(|_| next()));
            out.push(p);
        }
    }
    out
}

fn complete(addr: SocketAddr, p: &[u32]) {
    let (s, v) = call(
        addr,
        "POST",
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": 4}),
    );
    assert_eq!(s, 200, "{v}");
}

/// What the engine holds of `p` ([`serve`]'s `/query`): (device 0, device
/// 1, host), in tokens.
fn held(engine: SocketAddr, p: &[u32]) -> (u64, u64, u64) {
    let (s, v) = call(engine, "POST", "/query", &json!({"token_ids": p}));
    assert_eq!(s, 200, "{v}");
    let r = &v["data"]["radixkv"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    (n(&r["L1"]["dp0"]), n(&r["L1"]["dp1"]), n(&r["L2"]))
}

/// What the index says worker 1 holds of `p`, in Dynamo's shape: (rank 0,
/// rank 1, device or host).
fn indexed(index: SocketAddr, p: &[u32]) -> (u64, u64, u64) {
    let (s, v) = call(
        index,
        "POST",
        "/query",
        &json!({"token_ids": p, "model_name": "default"}),
    );
    assert_eq!(s, 200, "{v}");
    let i = &v["instances"]["1"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    (n(&i["dp"]["0"]), n(&i["dp"]["1"]), n(&i["cpu"]))
}

/// Waits until every prompt's index answer equals the engine's; returns
/// how many prompts are held anywhere.
fn agrees(engine: SocketAddr, index: SocketAddr, ps: &[Vec<u32>], what: &str) -> usize {
    let t = Instant::now();
    loop {
        let mut diff = None;
        let mut held_any = 0;
        for p in ps {
            let (d0, d1, host) = held(engine, p);
            let want = (d0, d1, d0.max(d1).max(host));
            let got = indexed(index, p);
            held_any += usize::from(want.2 > 0);
            if got != want {
                diff = Some(format!("engine {want:?}, index {got:?}"));
            }
        }
        match diff {
            None => return held_any,
            Some(d) if t.elapsed() > PATIENCE => {
                let metrics = text(index, "/metrics");
                panic!("{what}: {d}; the index's metrics:\n{metrics}")
            }
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn the_index_follows_a_serving_engine_through_evictions_and_a_restart() {
    let (events, replay) = (free_ports(2), free_ports(2));
    let (engine, addr) = serve(events, replay);
    let workers = format!(
        "1:0=tcp://127.0.0.1:{events},1:1=tcp://127.0.0.1:{}",
        events + 1
    );
    let replays = format!(
        "1:0=tcp://127.0.0.1:{replay},1:1=tcp://127.0.0.1:{}",
        replay + 1
    );
    let (_index, index) = spawn(&[
        "index",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--block-size",
        "16",
        "--workers",
        &workers,
        "--replay-workers",
        &replays,
    ]);
    let t = Instant::now();
    while call(index, "GET", "/health", &Value::Null).0 != 200 {
        assert!(t.elapsed() < PATIENCE, "the index never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ps = prompts(1);
    for p in &ps {
        complete(addr, p);
    }
    let n = agrees(addr, index, &ps, "after the first run");
    assert!(n > 0, "nothing held");
    let (_, stats) = call(addr, "GET", "/stats", &Value::Null);
    eprintln!(
        "first run: {n} of {} prompts held; engine stats {stats}",
        ps.len()
    );

    // Killed, and started again on the same ports with other prompts.
    drop(engine);
    let (_engine, addr) = serve(events, replay);
    let qs = prompts(2);
    for p in &qs {
        complete(addr, p);
    }
    let all: Vec<Vec<u32>> = ps.iter().chain(&qs).cloned().collect();
    let m = agrees(addr, index, &all, "after the restart");
    assert!(m > 0, "nothing held after the restart");
}
