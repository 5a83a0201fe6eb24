//! The async runtime, and its busy poll (`gateway.busy_poll`).
//!
//! A proxy's call waits twice: for the server's answer, then for the client's next
//! request. When the runtime has nothing to run it sleeps in `epoll_wait`, and each of
//! those waits ends in a wake-up: the peer's write must wake a sleeping thread, and on a
//! small VM that is an interrupt to an idle virtual CPU. On an AMD EPYC VM a wake-up cost
//! 28–38 µs of the waker's `write`, and as much again passed before the woken thread ran
//! (`BENCHMARKS.md`, "Session 18"). A direct connection pays two of them a call; through
//! the gateway there are four.
//!
//! So before the runtime's thread sleeps, it first polls the I/O driver's epoll
//! descriptor for up to `busy_poll` (default 200 µs, as Seastar's idle poll), giving the
//! CPU to any other runnable thread between two polls (`sched_yield`). An answer that
//! comes within that time finds the thread awake: no wake-up for the peer to pay and none
//! for the gateway to wait for.
//!
//! It costs CPU only where it pays: each thread keeps a moving average of how long its
//! waits lasted, and spins only while that average is within the budget. An idle gateway,
//! one whose calls come seconds apart, or one waiting on slow servers never spins; a
//! gateway whose waits are short (fast servers, steady load) spins at most the budget a
//! wait. One thread spins at a time. Zero turns it off; it is Linux only.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the busy poll became when the runtime was built (logged once logging is up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusyPoll {
    /// Polling the I/O driver's epoll descriptor `fd` for up to `budget` before a sleep.
    On { fd: i32, budget: Duration },
    /// `gateway.busy_poll` is zero, or this is not Linux.
    Off,
    /// Building the runtime did not make exactly one new epoll descriptor, so there is
    /// nothing known to poll; the runtime sleeps at once, as with `busy_poll = "0s"`.
    NotFound(usize),
}

/// Builds the runtime: `workers` threads (1: tokio's current-thread scheduler), every
/// driver enabled, and the busy poll of `budget` (zero: none).
pub fn build(workers: usize, budget: Duration) -> io::Result<(tokio::runtime::Runtime, BusyPoll)> {
    let mut b = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    b.enable_all();
    if budget.is_zero() || !cfg!(target_os = "linux") {
        return Ok((b.build()?, BusyPoll::Off));
    }
    let shared = Arc::new(Shared {
        fd: AtomicI32::new(-1),
        budget,
        spinning: AtomicBool::new(false),
    });
    let park = Arc::clone(&shared);
    b.on_thread_park(move || park.before_sleep());
    b.on_thread_unpark(after_sleep);
    // The driver's epoll descriptor is the one that building the runtime opens. Nothing
    // else runs yet (main builds the runtime before any thread or task starts).
    let before = epoll_fds();
    let runtime = b.build()?;
    let mut new: Vec<(u64, i32)> = epoll_fds().into_iter().filter(|e| !before.contains(e)).collect();
    new.sort_unstable();
    // mio keeps a copy of its descriptor (`dup`): the same epoll instance under two numbers.
    new.dedup_by_key(|&mut (inode, _)| inode);
    let state = match new[..] {
        [(_, fd)] => {
            shared.fd.store(fd, Ordering::Release);
            BusyPoll::On { fd, budget }
        }
        _ => BusyPoll::NotFound(new.len()),
    };
    Ok((runtime, state))
}

/// Waits that were polled: `[0]` slept after the budget ran out, `[1]` saw their I/O
/// while polling.
static POLLS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The busy polls so far, for `/metrics`: (waits whose I/O came while polling, waits that
/// slept after the budget ran out).
pub fn polls() -> (u64, u64) {
    (POLLS[1].load(Ordering::Relaxed), POLLS[0].load(Ordering::Relaxed))
}

struct Shared {
    /// The I/O driver's epoll descriptor; -1 until found (or never).
    fd: AtomicI32,
    budget: Duration,
    /// One thread polls at a time: on a multi-thread runtime the others sleep at once.
    spinning: AtomicBool,
}

/// Per runtime thread: when its current wait began, and the moving average of its waits.
struct Waits {
    began: Option<Instant>,
    average_ns: u64,
}

thread_local! {
    static WAITS: std::cell::RefCell<Waits> = const {
        std::cell::RefCell::new(Waits { began: None, average_ns: 0 })
    };
}

impl Shared {
    /// `on_thread_park`: the runtime has nothing to run and is about to sleep.
    fn before_sleep(&self) {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return;
        }
        let now = Instant::now();
        let worth_it = WAITS.with(|w| {
            let mut w = w.borrow_mut();
            w.began = Some(now);
            spins(w.average_ns, self.budget)
        });
        if !worth_it || self.spinning.swap(true, Ordering::Acquire) {
            return;
        }
        let until = now + self.budget;
        let caught = loop {
            if readable(fd) {
                break true;
            }
            if Instant::now() >= until {
                break false;
            }
            std::thread::yield_now();
        };
        self.spinning.store(false, Ordering::Release);
        POLLS[usize::from(caught)].fetch_add(1, Ordering::Relaxed);
    }
}

/// `on_thread_unpark`: the wait is over (by the poll, or by a wake-up after the sleep).
fn after_sleep() {
    WAITS.with(|w| {
        let mut w = w.borrow_mut();
        if let Some(began) = w.began.take() {
            let lasted = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
            w.average_ns = average(w.average_ns, lasted);
        }
    });
}

/// Whether a thread whose waits averaged `average_ns` should poll before sleeping: only
/// if polling for the budget would, on average, have caught the wait's end.
fn spins(average_ns: u64, budget: Duration) -> bool {
    u128::from(average_ns) <= budget.as_nanos()
}

/// The moving average of waits, an eighth for the newest: one long wait (an idle second)
/// stops the polling at once, and some fifty short ones start it again.
fn average(average_ns: u64, lasted_ns: u64) -> u64 {
    (average_ns / 8).saturating_mul(7).saturating_add(lasted_ns / 8)
}

/// Whether the epoll descriptor has events ready: `poll(2)` with a zero timeout.
fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one valid, writable pollfd and the count says one; poll(2) reads and
    // writes only that. A closed descriptor is answered POLLNVAL, which ends the poll.
    #[allow(unsafe_code)]
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n != 0
}

/// This process's epoll descriptors from `/proc/self/fd`, each with its instance's inode.
fn epoll_fds() -> Vec<(u64, i32)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[eventpoll]"))
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((std::fs::metadata(e.path()).ok()?.ino(), fd))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_stops_polling_after_one_long_wait_and_starts_again_after_short_ones() {
        let budget = Duration::from_micros(200);
        let mut avg = 0;
        for _ in 0..20 {
            avg = average(avg, 80_000);
        }
        assert!(spins(avg, budget), "short waits: {avg} ns");
        avg = average(avg, 2_000_000_000);
        assert!(!spins(avg, budget), "after an idle 2 s: {avg} ns");
        let mut n = 0;
        while !spins(avg, budget) {
            avg = average(avg, 80_000);
            n += 1;
        }
        assert!((40..=80).contains(&n), "{n} short waits to poll again");
        assert!(!spins(average(0, u64::MAX), budget));
        assert!(!spins(u64::MAX, budget));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_runtime_polls_its_own_driver_and_still_serves() {
        // Other tests build runtimes on other threads meanwhile; a build that saw theirs
        // open or close a descriptor finds none of its own and is tried again.
        let (rt, fd) = (0..20)
            .find_map(|_| match build(1, Duration::from_micros(200)).expect("runtime") {
                (rt, BusyPoll::On { fd, .. }) => Some((rt, fd)),
                _ => None,
            })
            .expect("the driver's epoll descriptor");
        let (caught, _) = polls();
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).expect("fd");
        assert_eq!(link.as_os_str(), "anon_inode:[eventpoll]");
        // Round trips over loopback, each wait short enough to be polled.
        let echoed = rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            tokio::spawn(async move {
                let (mut s, _) = l.accept().await.expect("accept");
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).await.is_ok() {
                    s.write_all(&b).await.expect("write");
                }
            });
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut n = 0;
            for i in 0..200u8 {
                c.write_all(&[i]).await.expect("write");
                let mut b = [0u8; 1];
                c.read_exact(&mut b).await.expect("read");
                n += usize::from(b[0] == i);
            }
            n
        });
        assert_eq!(echoed, 200);
        // Each answer was on the socket before the runtime had anything else to do: the
        // poll saw it, and the thread never slept for it.
        assert!(polls().0 > caught, "{:?}", polls());
        assert_eq!(build(1, Duration::ZERO).expect("runtime").1, BusyPoll::Off);
    }
}
