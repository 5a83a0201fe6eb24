//! A client connection's reads, timed as a server behind a balancer needs them timed.
//!
//! hyper has one timer for this, `header_read_timeout`, and it starts as soon as hyper
//! waits for the next request: a keep-alive connection idle that long is closed. With the
//! 10 s a slow client's head deserves, a balancer that keeps upstream connections open
//! for 60 s (an AWS ALB; nginx's upstream `keepalive_timeout`) sends now and then on a
//! connection the gateway is closing, and that request fails with a 502. Go's and
//! Envoy's servers have two timers instead, and so does this:
//! - a new connection sends its first request's head within `header_timeout`;
//! - between two requests a connection may sit idle for `keep_alive` (only
//!   `header_timeout` while the connection slots run low, see [`Slots`]), and once the
//!   next request's first byte arrives its head must be in within `header_timeout`;
//! - while a request is served, from its head until its response's body has ended
//!   ([`Tracked`]), reads are not timed here: the body has `body_timeout`, the answer its
//!   server's timeout.
//!
//! A connection past its time fails its next read with `TimedOut`, and hyper closes it
//! without writing anything, as it does for its own header timeout.

use axum::body::Body;
use bytes::Bytes;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where a connection is: a count that the service makes odd when a request's head has
/// been read and even again when its response's body ends (requests on an HTTP/1.1
/// connection are served one after the other; 0: no request yet), and when the last
/// body ended.
pub struct Phase {
    count: AtomicU32,
    /// Nanoseconds from `origin` to the last body's end.
    ended: AtomicU64,
    origin: Instant,
}

impl Default for Phase {
    fn default() -> Phase {
        Phase {
            count: AtomicU32::new(0),
            ended: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }
}

impl Phase {
    /// A request's head was read: it is being served.
    pub fn serving(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    fn ended(&self) {
        let at = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.ended.store(at, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Release);
    }
    fn now(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }
    /// When the last body ended.
    fn ended_at(&self) -> Instant {
        self.origin + Duration::from_nanos(self.ended.load(Ordering::Relaxed))
    }
}

/// How full the gateway's connection slots are: while fewer than an eighth are free,
/// an idle connection gets `header_timeout`, not `keep_alive`, so idle connections cannot
/// hold the slots the way silent ones cannot.
#[derive(Clone)]
pub struct Slots {
    pub free: Arc<tokio::sync::Semaphore>,
    pub total: usize,
}

impl Slots {
    fn low(&self) -> bool {
        self.free.available_permits() < self.total / 8
    }
}

/// What the running deadline times.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Timing {
    /// A request being served: only a look again after `header`, in case its response
    /// ends while a read waits (nothing else would read again to see that).
    Serving,
    /// A connection idle between requests, since the phase began (its deadline not set
    /// until a read waits).
    Idle,
    /// A request's head, from its first byte (or the connection's start) at `from`.
    Head,
}

/// A connection's stream with the deadlines above.
pub struct Timed<S> {
    inner: S,
    phase: Arc<Phase>,
    header: Duration,
    keep_alive: Duration,
    slots: Slots,
    /// The phase the timing below belongs to.
    seen: u32,
    timing: Timing,
    /// When the idle wait or the head began.
    from: Instant,
    /// Set no later than the current timing's deadline: it may wake the connection early
    /// (then the deadline is looked at again), never late. So a connection serving one
    /// request after another seldom moves it.
    sleep: Pin<Box<Sleep>>,
}

impl<S> Timed<S> {
    pub fn new(inner: S, phase: Arc<Phase>, header: Duration, keep_alive: Duration, slots: Slots) -> Timed<S> {
        let now = Instant::now();
        Timed {
            inner,
            phase,
            header,
            keep_alive,
            slots,
            seen: 0,
            // A new connection: its first head is timed from now.
            timing: Timing::Head,
            from: now,
            sleep: Box::pin(tokio::time::sleep_until(now + header)),
        }
    }

    /// The current timing's deadline; while serving, when to look again (`header` on:
    /// the soonest the connection could be due once the response ends).
    fn deadline(&self) -> Instant {
        match self.timing {
            Timing::Idle if !self.slots.low() => self.from + self.keep_alive,
            Timing::Serving => Instant::now() + self.header,
            _ => self.from + self.header,
        }
    }

    /// Whether the timing's deadline has passed; if not, `sleep` will wake the connection
    /// by then.
    fn due(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.deadline();
        if self.sleep.is_elapsed() || self.sleep.deadline() > deadline {
            self.sleep.as_mut().reset(deadline);
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if self.timing != Timing::Serving && Instant::now() >= deadline {
                return true;
            }
            // Early (set for an earlier timing), or a look while serving: on to the
            // deadline.
            self.sleep
                .as_mut()
                .reset(deadline.max(Instant::now() + Duration::from_millis(1)));
        }
        false
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Timed<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let phase = this.phase.now();
        if phase % 2 == 1 {
            // Serving a request: not timed, but a read that waits looks again after
            // `header`, the soonest the connection could be due once the response ends.
            this.seen = phase;
            this.timing = Timing::Serving;
            let read = Pin::new(&mut this.inner).poll_read(cx, buf);
            if read.is_pending() {
                this.due(cx);
            }
            return read;
        }
        if phase != this.seen || this.timing == Timing::Serving {
            // A response has ended since: the connection is idle from its end.
            this.seen = phase;
            this.timing = Timing::Idle;
            this.from = this.phase.ended_at();
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.timing == Timing::Idle && buf.filled().len() > before {
                    // The next request's first bytes: its head is timed from now.
                    this.timing = Timing::Head;
                    this.from = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.due(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                match this.timing {
                    Timing::Idle => "the connection was idle past gateway.keep_alive_timeout",
                    _ => "the request head did not arrive within gateway.header_timeout",
                },
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Timed<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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
}

/// A response's body that ends its request's phase when it is dropped (hyper drops it
/// once it has written its end, or when the connection goes).
pub struct Tracked {
    body: Body,
    phase: Arc<Phase>,
}

impl Tracked {
    pub fn new(body: Body, phase: Arc<Phase>) -> Tracked {
        Tracked { body, phase }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.phase.ended();
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const HEADER: Duration = Duration::from_secs(1);
    const KEEP: Duration = Duration::from_secs(60);

    fn timed(free: usize) -> (DuplexStream, Timed<DuplexStream>, Arc<Phase>) {
        let (client, server) = tokio::io::duplex(64);
        let phase = Arc::new(Phase::default());
        let slots = Slots {
            free: Arc::new(tokio::sync::Semaphore::new(free)),
            total: 16,
        };
        (client, Timed::new(server, phase.clone(), HEADER, KEEP, slots), phase)
    }

    /// Reads until the stream fails; how long that took, and the error's kind.
    async fn fails(t: &mut Timed<DuplexStream>) -> (Duration, io::ErrorKind) {
        let t0 = Instant::now();
        let mut buf = [0u8; 16];
        loop {
            match t.read(&mut buf).await {
                Ok(_) => continue,
                Err(e) => return (t0.elapsed(), e.kind()),
            }
        }
    }

    /// One request read and served, its response's body ended.
    async fn one_request(client: &mut DuplexStream, t: &mut Timed<DuplexStream>, phase: &Arc<Phase>) {
        client.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(t.read(&mut buf).await.unwrap(), 3);
        phase.serving();
        drop(Tracked::new(Body::empty(), phase.clone()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_gets_header_timeout_and_an_idle_one_keep_alive() {
        let (_client, mut t, _) = timed(16);
        assert_eq!(fails(&mut t).await, (HEADER, io::ErrorKind::TimedOut));

        let (mut client, mut t, phase) = timed(16);
        one_request(&mut client, &mut t, &phase).await;
        assert_eq!(fails(&mut t).await, (KEEP, io::ErrorKind::TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_after_idling_gets_header_timeout_from_its_first_byte() {
        let (mut client, mut t, phase) = timed(16);
        one_request(&mut client, &mut t, &phase).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        client.write_all(b"GE").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(t.read(&mut buf).await.unwrap(), 2);
        assert_eq!(fails(&mut t).await, (HEADER, io::ErrorKind::TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn serving_is_not_timed_and_the_idle_wait_counts_from_the_end() {
        let (mut client, mut t, phase) = timed(16);
        client.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(t.read(&mut buf).await.unwrap(), 3);
        phase.serving();
        // A long answer: its body ends 100 s later, while a read is waiting.
        let body = Tracked::new(Body::empty(), phase.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100)).await;
            drop(body);
        });
        assert_eq!(
            fails(&mut t).await,
            (Duration::from_secs(100) + KEEP, io::ErrorKind::TimedOut)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_gets_header_timeout_while_the_slots_run_low() {
        // One of 16 slots free: under an eighth.
        let (mut client, mut t, phase) = timed(1);
        one_request(&mut client, &mut t, &phase).await;
        assert_eq!(fails(&mut t).await, (HEADER, io::ErrorKind::TimedOut));
    }
}
