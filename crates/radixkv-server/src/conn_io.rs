//! The socket of one connection as hyper sees it ([`ConnIo`]). It does two
//! things besides passing bytes through:
//!
//! * it tells the connection's task how long a write has waited on the
//!   client ([`WriteProgress`]): a client that stops reading a response
//!   fills its socket's buffers, writes stop completing, and past the send
//!   timeout the connection is closed (as nginx's `send_timeout`), which
//!   cancels its request and releases its admission permit;
//! * it answers hyper's own refusals of a request head with an
//!   OpenAI-shaped JSON body. hyper answers a request line or header it
//!   cannot parse (400), a target too long (414) or a head too large (431)
//!   itself, before any handler runs, with an empty body and no hook. Every
//!   response radixkv's handlers write carries a JSON body, so a 400, 414
//!   or 431 head that says `content-length: 0` and has nothing after it is
//!   hyper's: that head is replaced by the same status with the JSON error
//!   body every other error of the API has (its `date` kept).

use super::error::ApiError;
use crate::state::AppState;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Since when a write has waited on the client, shared between a
/// connection's socket and its task.
#[derive(Debug)]
pub(crate) struct WriteProgress {
    start: Instant,
    /// Milliseconds since `start`, plus one, at which a write (or flush)
    /// first found the socket full; 0 while writes complete.
    blocked_since: AtomicU64,
}

impl WriteProgress {
    pub(crate) fn new() -> Arc<WriteProgress> {
        Arc::new(WriteProgress {
            start: Instant::now(),
            blocked_since: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// A write found the socket full (the first such moment is kept).
    fn blocked(&self) {
        // Relaxed: one timestamp, written by this connection's socket and
        // read by its own task's periodic check; a stale read only delays
        // the close by one tick.
        let _ = self.blocked_since.compare_exchange(
            0,
            self.now(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A write completed.
    fn progressed(&self) {
        // Relaxed: as in `blocked`.
        self.blocked_since.store(0, Ordering::Relaxed);
    }

    /// How long the pending write has waited (zero when none waits).
    pub(crate) fn blocked_for(&self) -> Duration {
        // Relaxed: as in `blocked`.
        match self.blocked_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now().saturating_sub(since)),
        }
    }
}

/// A connection's TCP stream, watched (see the module docs).
pub(crate) struct ConnIo {
    inner: TcpStream,
    progress: Arc<WriteProgress>,
    state: Arc<AppState>,
    /// The answer that replaces a head of hyper's, and how much of it is
    /// written.
    answer: Option<(Vec<u8>, usize)>,
}

impl ConnIo {
    pub(crate) fn new(
        inner: TcpStream,
        progress: Arc<WriteProgress>,
        state: Arc<AppState>,
    ) -> ConnIo {
        ConnIo {
            inner,
            progress,
            state,
            answer: None,
        }
    }

    /// `r`, with its effect on the write progress recorded.
    fn track<T>(&self, r: Poll<io::Result<T>>, wrote: impl Fn(&T) -> bool) -> Poll<io::Result<T>> {
        match &r {
            Poll::Pending => self.progress.blocked(),
            Poll::Ready(Ok(v)) if wrote(v) => self.progress.progressed(),
            Poll::Ready(_) => {}
        }
        r
    }

    /// Writes what is left of a replacing answer; `Ready` once none is.
    fn drain_answer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, at)) = &mut self.answer {
            if *at >= bytes.len() {
                self.answer = None;
                break;
            }
            let r = Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]);
            let n = match r {
                Poll::Pending => {
                    self.progress.blocked();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
            };
            self.progress.progressed();
            *at += n;
        }
        Poll::Ready(Ok(()))
    }

    /// If `buf` is one of hyper's own empty refusals, takes it on (the
    /// answer replacing it is queued and counted) and returns its length.
    fn replace(&mut self, buf: &[u8]) -> Option<usize> {
        let (answer, code) = answer_for(buf)?;
        self.state.stats.response(code);
        self.answer = Some((answer, 0));
        Some(buf.len())
    }
}

/// The answer replacing `head` when it is one of hyper's own refusals (a
/// whole 400, 414 or 431 head with `content-length: 0` and nothing after
/// it), with its status code.
pub(crate) fn answer_for(head: &[u8]) -> Option<(Vec<u8>, u16)> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != head.len() || !head.starts_with(b"HTTP/1.1 ") {
        return None;
    }
    let code: u16 = std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()?;
    let error = match code {
        400 => ApiError::BadRequest(
            "the request is not valid HTTP/1.1: its request line or a header could not be parsed"
                .into(),
        ),
        414 => ApiError::UriTooLong,
        431 => ApiError::HeadersTooLarge,
        _ => return None,
    };
    let text = std::str::from_utf8(head).ok()?;
    let lower = text.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let date = lower
        .find("\r\ndate: ")
        .and_then(|at| {
            let line = &text[at + 2..];
            line.find("\r\n").map(|n| &line[..n + 2])
        })
        .unwrap_or("");
    let body = serde_json::to_vec(&error.body()).ok()?;
    let status = error.status();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{date}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some((out, code))
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain_answer(cx))?;
        if let Some(n) = this.replace(buf) {
            // Written as far as the socket takes it now; the rest by the
            // flush hyper makes next.
            if let Poll::Ready(Err(e)) = this.drain_answer(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(n));
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.track(r, |&n| n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain_answer(cx))?;
        if let Some(first) = bufs.first() {
            if let Some(n) = this.replace(first) {
                if let Poll::Ready(Err(e)) = this.drain_answer(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(n));
            }
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.track(r, |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain_answer(cx))?;
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.track(r, |_| true)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.drain_answer(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_own_refusals_get_a_json_body_and_nothing_else_is_touched() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Fri, 04 Dec 2026 22:35:42 GMT\r\n\r\n";
        let (out, code) = answer_for(head).unwrap();
        assert_eq!(code, 431);
        let text = String::from_utf8(out).unwrap();
        let (h, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            h.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{h}"
        );
        assert!(h.contains("\r\ndate: Fri, 04 Dec 2026 22:35:42 GMT"), "{h}");
        assert!(
            h.contains(&format!("content-length: {}", body.len())),
            "{h}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], 431);
        let bad = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(answer_for(bad).unwrap().1, 400);
        let uri = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(answer_for(uri).unwrap().1, 414);
        // Not hyper's own: a body, another status, a head cut short, bytes
        // after the head.
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"0\r\n\r\n",
        ] {
            assert!(
                answer_for(other).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn write_progress_measures_how_long_a_write_has_waited() {
        let p = WriteProgress::new();
        assert_eq!(p.blocked_for(), Duration::ZERO);
        p.blocked();
        std::thread::sleep(Duration::from_millis(20));
        p.blocked(); // the first moment is kept
        assert!(p.blocked_for() >= Duration::from_millis(20));
        p.progressed();
        assert_eq!(p.blocked_for(), Duration::ZERO);
    }
}
