//! A minimal HTTP/1.1 keep-alive client for the measured call loop.
//!
//! One `TcpStream` (`TCP_NODELAY`), one request in flight. The request head is formatted
//! once; each call writes head + `Content-Length` + body with one `write_all` from a
//! reused buffer and reads the answer into a reused buffer. Headers are parsed with
//! `httparse`; the body is framed by `Content-Length` or `Transfer-Encoding: chunked`
//! (a response with neither is an error: reading to close is not supported). After
//! `Connection: close` (or an HTTP/1.0 answer) the next call reconnects, and so does a
//! call after any error.
//!
//! Nothing a peer sends can panic this: every malformed answer is an `Err`.

use anyhow::{anyhow, bail, Context, Result};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How many response headers `httparse` accepts.
const MAX_HEADERS: usize = 32;
/// The read buffer's starting size; it doubles as needed up to `MAX_RESPONSE`.
const READ_CHUNK: usize = 16 << 10;
const MAX_RESPONSE: usize = 64 << 20;

/// One keep-alive connection to one `POST` target.
pub struct Conn {
    addr: SocketAddr,
    /// `POST path HTTP/1.1\r\n` and the fixed headers, each ending in `\r\n`.
    head: Vec<u8>,
    stream: Option<TcpStream>,
    wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    /// How much of `rbuf` holds received bytes.
    filled: usize,
    /// A chunked body, decoded.
    chunked: Vec<u8>,
}

/// One answer, borrowed from the connection's buffers until the next call.
pub struct Answer<'a> {
    pub status: u16,
    /// `Content-Type: text/event-stream`.
    pub sse: bool,
    pub body: &'a [u8],
}

impl Conn {
    /// A connection for `POST path` with these extra headers (`name`, `value`) after
    /// `Host`. Not connected yet: see [`Conn::connect`]; `post` connects when needed.
    pub fn new(addr: SocketAddr, path: &str, host: &[u8], headers: &[(&str, &[u8])]) -> Conn {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"POST ");
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        head.extend_from_slice(host);
        head.extend_from_slice(b"\r\n");
        for (name, value) in headers {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
        Conn {
            addr,
            wbuf: Vec::with_capacity(head.len() + 512),
            head,
            stream: None,
            rbuf: vec![0; READ_CHUNK],
            filled: 0,
            chunked: Vec::new(),
        }
    }

    pub async fn connect(&mut self) -> Result<()> {
        let stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connect {}", self.addr))?;
        stream.set_nodelay(true)?;
        self.stream = Some(stream);
        Ok(())
    }

    /// Drops the connection (e.g. after a timeout left it mid-request).
    pub fn reset(&mut self) {
        self.stream = None;
    }

    /// One `POST` with `body`; the answer stays valid until the next call.
    pub async fn post(&mut self, body: &[u8]) -> Result<Answer<'_>> {
        let parsed = match self.exchange(body).await {
            Ok(p) => p,
            Err(e) => {
                self.stream = None;
                return Err(e);
            }
        };
        if parsed.close {
            self.stream = None;
        }
        let body = match parsed.body {
            Body::At(a, b) => &self.rbuf[a..b],
            Body::Decoded => &self.chunked[..],
        };
        Ok(Answer {
            status: parsed.status,
            sse: parsed.sse,
            body,
        })
    }

    async fn exchange(&mut self, body: &[u8]) -> Result<Parsed> {
        if self.stream.is_none() {
            self.connect().await?;
        }
        let Some(stream) = self.stream.as_mut() else {
            bail!("not connected");
        };
        self.wbuf.clear();
        self.wbuf.extend_from_slice(&self.head);
        self.wbuf.extend_from_slice(b"Content-Length: ");
        push_decimal(&mut self.wbuf, body.len() as u64);
        self.wbuf.extend_from_slice(b"\r\n\r\n");
        self.wbuf.extend_from_slice(body);
        stream.write_all(&self.wbuf).await.context("write request")?;

        self.filled = 0;
        loop {
            if self.filled == self.rbuf.len() {
                if self.rbuf.len() >= MAX_RESPONSE {
                    bail!("response larger than {MAX_RESPONSE} bytes");
                }
                self.rbuf.resize(self.rbuf.len() * 2, 0);
            }
            let n = stream
                .read(&mut self.rbuf[self.filled..])
                .await
                .context("read response")?;
            if n == 0 {
                if self.filled == 0 {
                    bail!("connection closed before the response");
                }
                bail!(
                    "connection closed mid-response after {} bytes: {}",
                    self.filled,
                    String::from_utf8_lossy(&self.rbuf[..self.filled.min(200)])
                );
            }
            self.filled += n;
            if let Some(p) = parse(&self.rbuf[..self.filled], &mut self.chunked)? {
                if p.end != self.filled {
                    bail!("{} unexpected bytes after the response", self.filled - p.end);
                }
                return Ok(p);
            }
        }
    }
}

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[derive(Debug, PartialEq, Eq)]
enum Body {
    /// `rbuf[a..b]`.
    At(usize, usize),
    /// In `chunked`.
    Decoded,
}

#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    status: u16,
    sse: bool,
    /// The server will close (or closed) the connection after this answer.
    close: bool,
    body: Body,
    /// Where the answer ends in the buffer.
    end: usize,
}

enum Framing {
    Length(usize),
    Chunked,
    Empty,
}

/// Parses one complete answer at the start of `buf`: `Ok(None)` if more bytes are needed.
/// A chunked body is decoded into `chunked`.
fn parse(buf: &[u8], chunked: &mut Vec<u8>) -> Result<Option<Parsed>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => bail!(
            "malformed response head ({e}): {}",
            String::from_utf8_lossy(&buf[..buf.len().min(200)])
        ),
    };
    let status = resp.code.context("response without a status")?;
    if (100..200).contains(&status) {
        bail!("unexpected interim response {status}");
    }
    let mut close = resp.version == Some(0);
    let mut sse = false;
    let mut length: Option<usize> = None;
    let mut is_chunked = false;
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .with_context(|| format!("bad Content-Length {:?}", String::from_utf8_lossy(h.value)))?;
            if length.is_some_and(|l| l != v) {
                bail!("conflicting Content-Length headers");
            }
            length = Some(v);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default();
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                bail!("unsupported Transfer-Encoding {:?}", String::from_utf8_lossy(h.value));
            }
            is_chunked = true;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close = false;
                }
            }
        } else if name.eq_ignore_ascii_case("content-type") {
            sse = h.value.len() >= 17 && h.value[..17].eq_ignore_ascii_case(b"text/event-stream");
        }
    }
    let framing = if status == 204 || status == 304 {
        Framing::Empty
    } else if is_chunked {
        Framing::Chunked
    } else if let Some(l) = length {
        Framing::Length(l)
    } else {
        bail!("HTTP {status} response without Content-Length or chunked encoding (reading to close is not supported)");
    };
    let (body, end) = match framing {
        Framing::Empty => (Body::At(head_len, head_len), head_len),
        Framing::Length(l) => {
            let end = head_len.checked_add(l).context("Content-Length overflows")?;
            if end > MAX_RESPONSE {
                bail!("Content-Length {l} larger than {MAX_RESPONSE} bytes");
            }
            if buf.len() < end {
                return Ok(None);
            }
            (Body::At(head_len, end), end)
        }
        Framing::Chunked => match dechunk(&buf[head_len..], chunked)? {
            Some(n) => (Body::Decoded, head_len + n),
            None => return Ok(None),
        },
    };
    Ok(Some(Parsed {
        status,
        sse,
        close,
        body,
        end,
    }))
}

/// Decodes a whole chunked body from the start of `buf` into `out`; the bytes it took,
/// or `None` if incomplete.
fn dechunk(buf: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>> {
    out.clear();
    let mut at = 0;
    loop {
        let Some(eol) = find_crlf(&buf[at..]) else {
            if buf.len() - at > 1024 {
                bail!("chunk size line too long");
            }
            return Ok(None);
        };
        let line = &buf[at..at + eol];
        let size_hex = line.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let size = std::str::from_utf8(size_hex)
            .ok()
            .filter(|s| !s.is_empty())
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or_else(|| anyhow!("bad chunk size {:?}", String::from_utf8_lossy(line)))?;
        at += eol + 2;
        if size == 0 {
            // Trailers, then an empty line.
            loop {
                let Some(eol) = find_crlf(&buf[at..]) else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return Ok(Some(at));
                }
            }
        }
        if out.len() + size > MAX_RESPONSE {
            bail!("chunked body larger than {MAX_RESPONSE} bytes");
        }
        let data_end = at + size;
        if buf.len() < data_end + 2 {
            return Ok(None);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            bail!("chunk without its CRLF");
        }
        out.extend_from_slice(&buf[at..data_end]);
        at = data_end + 2;
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    memchr::memmem::find(b, b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> (Result<Option<Parsed>>, Vec<u8>) {
        let mut out = Vec::new();
        let r = parse(s.as_bytes(), &mut out);
        (r, out)
    }

    #[test]
    fn content_length() {
        let s = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello";
        let (r, _) = p(s);
        let r = r.unwrap().unwrap();
        assert_eq!(r.status, 200);
        assert!(!r.sse && !r.close);
        assert_eq!(r.end, s.len());
        assert_eq!(r.body, Body::At(s.len() - 5, s.len()));
        // Every strict prefix is incomplete.
        for i in 0..s.len() {
            assert!(p(&s[..i]).0.unwrap().is_none(), "prefix {i}");
        }
    }

    #[test]
    fn chunked_sse_close() {
        let s = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\
                 Connection: close\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\n";
        let (r, out) = p(s);
        let r = r.unwrap().unwrap();
        assert!(r.sse && r.close);
        assert_eq!(r.body, Body::Decoded);
        assert_eq!(out, b"hello world");
        assert_eq!(r.end, s.len());
        for i in 0..s.len() {
            assert!(p(&s[..i]).0.unwrap().is_none(), "prefix {i}");
        }
    }

    #[test]
    fn errors() {
        for s in [
            "HTTP/1.1 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
            "HTTP/1.1 100 Continue\r\n\r\n",
            "garbage\r\n\r\n",
        ] {
            assert!(p(s).0.is_err(), "{s:?}");
        }
        let (r, _) = p("HTTP/1.0 204 No Content\r\n\r\n");
        let r = r.unwrap().unwrap();
        assert!(r.close);
        assert_eq!(r.body, Body::At(r.end, r.end));
    }

    #[test]
    fn decimal() {
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            let mut v = Vec::new();
            push_decimal(&mut v, n);
            assert_eq!(v, n.to_string().as_bytes());
        }
    }
}
