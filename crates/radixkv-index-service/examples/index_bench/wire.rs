//! The load generator's client: one blocking keep-alive connection per
//! client thread, each request written whole from bytes serialized
//! beforehand (one `write`), each answer read until its `Content-Length`
//! is in (usually one `read`), its head parsed by `httparse`.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};

/// A `POST` as it goes on the wire, serialized once.
pub fn post(port: u16, path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A `GET` as it goes on the wire.
pub fn get(port: u16, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n").into_bytes()
}

/// One keep-alive connection.
pub struct Connection {
    stream: TcpStream,
    /// Zeroed once, grown by doubling; `filled` bytes of it hold the
    /// answer read so far.
    buf: Vec<u8>,
    filled: usize,
}

impl Connection {
    /// Connects to `127.0.0.1:port`, Nagle off.
    pub fn open(port: u16) -> io::Result<Connection> {
        let stream = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buf: vec![0; 64 * 1024],
            filled: 0,
        })
    }

    /// Sends `request` and reads the whole answer: its status and body.
    pub fn round_trip(&mut self, request: &[u8]) -> io::Result<(u16, &[u8])> {
        self.stream.write_all(request)?;
        self.filled = 0;
        let (status, head, body_len) = loop {
            self.fill()?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.buf[..self.filled]) {
                Ok(httparse::Status::Complete(head)) => {
                    let status = response.code.unwrap_or(0);
                    let mut len = None;
                    for h in response.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            len = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            return Err(io::Error::other("a chunked answer (not read here)"));
                        }
                    }
                    let len =
                        len.ok_or_else(|| io::Error::other("an answer without Content-Length"))?;
                    break (status, head, len);
                }
                Ok(httparse::Status::Partial) => continue,
                Err(e) => return Err(io::Error::other(format!("an answer's head: {e}"))),
            }
        };
        while self.filled < head + body_len {
            self.fill()?;
        }
        if self.filled > head + body_len {
            return Err(io::Error::other("bytes past the answer (none were asked)"));
        }
        Ok((status, &self.buf[head..self.filled]))
    }

    /// Reads what the socket has into the buffer; the end of the stream
    /// is an error (an answer was due).
    fn fill(&mut self) -> io::Result<()> {
        if self.buf.len() - self.filled < 16 * 1024 {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        match self.stream.read(&mut self.buf[self.filled..])? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                self.filled += n;
                Ok(())
            }
        }
    }
}
