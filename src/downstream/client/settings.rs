//! How many streams an HTTP/2 server lets the gateway have open at once on a connection.
//!
//! Over HTTP/2, hyper multiplexes every call on one connection, and a call beyond the
//! server's `SETTINGS_MAX_CONCURRENT_STREAMS` waits inside hyper, first come, first
//! served, where the fair turns of `downstream/fair.rs` cannot reach it. hyper's pooled
//! client does not tell what the server advertised, so each HTTP/2 connection's reads
//! pass through [`Sniffed`] until the first frame has gone by: RFC 9113 §3.4 makes that
//! frame the server's SETTINGS, and its `SETTINGS_MAX_CONCURRENT_STREAMS` is kept in a
//! [`StreamLimit`] that rides on every response of the connection (hyper's connection
//! `extra`). The bytes are handed to hyper unchanged; after the first frame the reads go
//! straight through.
//!
//! Only the first SETTINGS frame is read: a server that changes its limit later on the
//! same connection (rare) is not followed, and its calls past the new limit wait in
//! hyper's queue, as they all did before.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

/// A frame's header: length (24 bits), type, flags, stream id (32 bits).
const HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// The longest frame a server may send before it has our SETTINGS (SETTINGS_MAX_FRAME_SIZE's
/// initial value): a longer "first frame" is not HTTP/2, and is not read.
const MAX_FRAME: usize = 16_384;
/// Not read (yet).
const UNREAD: u64 = u64::MAX;
/// The server's SETTINGS named no limit: HTTP/2's default, unlimited.
const UNLIMITED: u64 = 1 << 32;

/// The `SETTINGS_MAX_CONCURRENT_STREAMS` of one connection's server, once its first
/// SETTINGS frame is read.
#[derive(Clone)]
pub struct StreamLimit(Arc<AtomicU64>);

impl StreamLimit {
    fn new() -> StreamLimit {
        StreamLimit(Arc::new(AtomicU64::new(UNREAD)))
    }

    /// The limit: `None` until it is read (or if it could not be), `usize::MAX` when the
    /// server named none.
    pub fn get(&self) -> Option<usize> {
        match self.0.load(Ordering::Acquire) {
            UNREAD => None,
            UNLIMITED => Some(usize::MAX),
            n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    fn set(&self, limit: Option<u32>) {
        self.0.store(limit.map_or(UNLIMITED, u64::from), Ordering::Release);
    }
}

/// A connection's stream, whose first HTTP/2 frame is read on its way to hyper.
pub struct Sniffed<T> {
    inner: T,
    /// Set on an HTTP/2 connection (ALPN `h2`).
    limit: Option<StreamLimit>,
    /// The first frame's bytes so far, until it is whole.
    first: Option<Vec<u8>>,
}

impl<T: Connection> Sniffed<T> {
    pub fn new(inner: T) -> Sniffed<T> {
        let h2 = inner.connected().is_negotiated_h2();
        Sniffed {
            inner,
            limit: h2.then(StreamLimit::new),
            first: h2.then(Vec::new),
        }
    }
}

/// Bytes still to read of the first frame, whose bytes so far are `frame`.
fn wanted(frame: &[u8]) -> usize {
    match frame.get(..HEADER) {
        None => HEADER - frame.len(),
        Some(h) => HEADER + frame_len(h) - frame.len(),
    }
}

fn frame_len(header: &[u8]) -> usize {
    match header {
        [a, b, c, ..] => usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c),
        _ => 0,
    }
}

/// What a whole first frame says: `Some(limit)` for a server's SETTINGS (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`, the last if named twice; `None` if not named), else
/// nothing.
fn read_settings(frame: &[u8]) -> Option<Option<u32>> {
    let (header, payload) = frame.split_at_checked(HEADER)?;
    let is_settings = header.get(3) == Some(&SETTINGS) && header.get(5..HEADER) == Some(&[0, 0, 0, 0]);
    // An ACK (flag 0x1) carries nothing, and a SETTINGS payload is whole six-byte entries.
    if !is_settings || header.get(4).is_some_and(|f| f & 0x1 != 0) || payload.len() % 6 != 0 {
        return None;
    }
    Some(
        payload
            .chunks_exact(6)
            .rev()
            .find(|e| u16::from_be_bytes([e[0], e[1]]) == MAX_CONCURRENT_STREAMS)
            .map(|e| u32::from_be_bytes([e[2], e[3], e[4], e[5]])),
    )
}

impl<T: Read + Unpin> Read for Sniffed<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, mut buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let (Some(frame), Some(limit)) = (this.first.as_mut(), this.limit.as_ref()) else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        // No more than the rest of the first frame, so that no byte after it is looked at.
        let mut chunk = [0u8; 512];
        let want = wanted(frame).min(buf.remaining()).min(chunk.len());
        if want == 0 {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let mut read = hyper::rt::ReadBuf::new(&mut chunk[..want]);
        ready!(Pin::new(&mut this.inner).poll_read(cx, read.unfilled()))?;
        let got = read.filled();
        buf.put_slice(got);
        frame.extend_from_slice(got);
        let too_long = frame.get(..HEADER).is_some_and(|h| frame_len(h) > MAX_FRAME);
        if got.is_empty() || too_long {
            this.first = None;
        } else if wanted(frame) == 0 {
            if let Some(named) = read_settings(frame) {
                limit.set(named);
            }
            this.first = None;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> Write for Sniffed<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for Sniffed<T> {
    fn connected(&self) -> Connected {
        let connected = self.inner.connected();
        match &self.limit {
            Some(limit) => connected.extra(limit.clone()),
            None => connected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    /// A stream that yields `bytes` a few at a time.
    struct Trickle(Vec<u8>, usize);

    impl Read for Trickle {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, mut buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let n = this.1.min(buf.remaining()).min(this.0.len());
            buf.put_slice(&this.0[..n]);
            this.0.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    /// Reads `wire` through a sniffer in reads of at most `step` bytes; returns what hyper
    /// would have read and the limit read.
    fn sniff(wire: &[u8], step: usize) -> (Vec<u8>, Option<usize>) {
        let limit = StreamLimit::new();
        let mut s = Sniffed {
            inner: Trickle(wire.to_vec(), step),
            limit: Some(limit.clone()),
            first: Some(Vec::new()),
        };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        loop {
            let mut space = [0u8; 4096];
            let mut buf = hyper::rt::ReadBuf::new(&mut space);
            match Pin::new(&mut s).poll_read(&mut cx, buf.unfilled()) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                Poll::Ready(Ok(())) => out.extend_from_slice(buf.filled()),
                other => panic!("{other:?}"),
            }
        }
        (out, limit.get())
    }

    #[test]
    fn the_first_settings_frame_gives_the_stream_limit_and_every_byte_passes() {
        let settings = frame(SETTINGS, 0, &[0, 4, 0, 1, 0, 0, 0, 3, 0, 0, 0, 2]);
        let mut wire = settings.clone();
        // A later SETTINGS frame is hyper's business alone.
        wire.extend(frame(SETTINGS, 0, &[0, 3, 0, 0, 0, 9]));
        wire.extend(frame(0x8, 0, &[0, 1, 0, 0]));
        for step in [1, 5, 9, 10, 4096] {
            let (out, limit) = sniff(&wire, step);
            assert_eq!(out, wire, "step {step}");
            assert_eq!(limit, Some(2), "step {step}");
        }
    }

    #[test]
    fn a_settings_frame_without_a_limit_is_unlimited_and_anything_else_unknown() {
        assert_eq!(sniff(&frame(SETTINGS, 0, &[]), 3).1, Some(usize::MAX));
        assert_eq!(sniff(&frame(SETTINGS, 0, &[0, 4, 0, 1, 0, 0]), 3).1, Some(usize::MAX));
        let twice = [0, 3, 0, 0, 0, 5, 0, 3, 0, 0, 0, 2];
        assert_eq!(sniff(&frame(SETTINGS, 0, &twice), 3).1, Some(2), "the last one named");
        // Not SETTINGS, an ACK, a stream's frame, a broken payload, a frame too long, EOF.
        assert_eq!(sniff(&frame(0x8, 0, &[0, 0, 0, 1]), 3).1, None);
        assert_eq!(sniff(&frame(SETTINGS, 1, &[]), 3).1, None);
        let mut on_stream = frame(SETTINGS, 0, &[0, 3, 0, 0, 0, 2]);
        on_stream[8] = 1;
        assert_eq!(sniff(&on_stream, 3).1, None);
        assert_eq!(sniff(&frame(SETTINGS, 0, &[0, 3, 0, 0, 0]), 3).1, None);
        let long = frame(SETTINGS, 0, &vec![0; MAX_FRAME + 6]);
        let (out, limit) = sniff(&long, 4096);
        assert_eq!((out.len(), limit), (long.len(), None));
        assert_eq!(sniff(&[0, 0], 1).1, None);
    }
}
