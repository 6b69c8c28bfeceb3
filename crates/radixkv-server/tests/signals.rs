//! `shutdown_signals`: its two futures share handlers installed when it is
//! called, so a signal is counted whenever it comes, even before either
//! future is first polled, and the second future (the force stop) sees a
//! second signal that came before anything polled it. (Its own test
//! binary: the process signals itself.)

#![cfg(unix)]

use std::time::Duration;

fn signal_self() {
    let pid = std::process::id().to_string();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
}

/// One test (signals reach every handler of the process: tests in
/// parallel would count each other's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_signal_is_counted_whenever_it_comes() {
    let (first, second) = radixkv_server::shutdown_signals();
    // Neither future has been polled: the handlers are already in place
    // (without them, SIGTERM would end this process).
    signal_self();
    tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the first signal resolved the shutdown future");
    // The second signal comes before the force future is ever polled, as
    // it does when a second Ctrl-C follows the first before the drain
    // begins.
    signal_self();
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second signal resolved the force future");

    // One signal resolves the shutdown future only.
    let (first, second) = radixkv_server::shutdown_signals();
    signal_self();
    tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the shutdown future resolved");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), second)
            .await
            .is_err(),
        "the force future resolved on the first signal"
    );
}
