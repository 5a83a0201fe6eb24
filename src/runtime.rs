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
//! wait. One thread spins at a time. Zero turns it off; so does a CPU quota ([`cpu_quota`])
//! when the config does not set it. It is Linux only.

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

/// Raises this process's soft limit on open files (`RLIMIT_NOFILE`) to `want`, or to
/// its hard limit if that is lower, never lowering it; returns the soft limit then in
/// force (`None` if it cannot be read, or off Linux). Children inherit it.
pub fn raise_open_files(want: u64) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) writes one rlimit into `lim`, which is valid and writable.
        #[allow(unsafe_code)]
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return None;
        }
        let target = want.min(lim.rlim_max);
        if target > lim.rlim_cur {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: setrlimit(2) reads one valid rlimit; only the soft limit changes.
            #[allow(unsafe_code)]
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                return Some(target);
            }
        }
        Some(lim.rlim_cur)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = want;
        None
    }
}

/// The CPU quota this process runs under, in CPUs, and the file that sets it: the
/// tightest `cpu.max` (cgroup v2) or `cpu.cfs_quota_us` (v1) of its cgroup and the ones
/// above it that this process can see; `None` without one (or off Linux).
pub fn cpu_quota() -> Option<(f64, std::path::PathBuf)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    quota_in(&cgroup, &mounts, |p| std::fs::read_to_string(p).ok())
}

/// [`cpu_quota`] from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`, with
/// `read` for the control files.
fn quota_in(
    cgroup: &str,
    mountinfo: &str,
    read: impl Fn(&std::path::Path) -> Option<String>,
) -> Option<(f64, std::path::PathBuf)> {
    use std::path::{Path, PathBuf};
    // Mount points: (fstype, root, mount point, super options).
    let mounts: Vec<(&str, &str, &str, &str)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some((*r.first()?, *f.get(3)?, *f.get(4)?, *r.get(2)?))
        })
        .collect();
    let mut best: Option<(f64, PathBuf)> = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let v2 = controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "cpu") {
            continue;
        }
        let Some((_, root, at, _)) = mounts.iter().find(|(fs, _, _, opts)| {
            if v2 {
                *fs == "cgroup2"
            } else {
                *fs == "cgroup" && opts.split(',').any(|o| o == "cpu")
            }
        }) else {
            continue;
        };
        // The cgroup's path as seen below the mount (a container mounts its own subtree).
        let rel = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
        let mut dir = Path::new(at).join(rel.trim_start_matches('/'));
        loop {
            let quota = if v2 {
                let f = dir.join("cpu.max");
                read(&f).and_then(|t| {
                    let mut w = t.split_whitespace();
                    let q: f64 = w.next()?.parse().ok()?;
                    let period: f64 = w.next().unwrap_or("100000").parse().ok()?;
                    (q > 0.0 && period > 0.0).then(|| (q / period, f))
                })
            } else {
                let f = dir.join("cpu.cfs_quota_us");
                read(&f).and_then(|t| {
                    let q: f64 = t.trim().parse().ok()?;
                    let period: f64 = read(&dir.join("cpu.cfs_period_us"))?.trim().parse().ok()?;
                    (q > 0.0 && period > 0.0).then(|| (q / period, f))
                })
            };
            if let Some((q, f)) = quota {
                if best.as_ref().is_none_or(|(b, _)| q < *b) {
                    best = Some((q, f));
                }
            }
            if dir.as_path() == Path::new(at) || !dir.pop() {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_quota_is_read_from_either_cgroup_version_and_the_tightest_wins() {
        use std::collections::HashMap;
        use std::path::Path;
        let files: HashMap<&str, &str> = [
            ("/sys/fs/cgroup/cpu/app/cpu.cfs_quota_us", "150000\n"),
            ("/sys/fs/cgroup/cpu/app/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/kubepods/cpu.max", "50000 100000\n"),
            ("/sys/fs/cgroup/cpu.max", "max 100000\n"),
        ]
        .into_iter()
        .collect();
        let read = |p: &Path| files.get(p.to_str().unwrap_or("")).map(|s| s.to_string());
        let v1_mounts = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                         32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        let v2_mounts = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        // v1: the cgroup's own quota, 1.5 CPUs; the root's -1 is none.
        let (q, f) = quota_in("2:cpuacct:/\n1:cpu:/app\n", v1_mounts, read).expect("v1 quota");
        assert_eq!((q, f.to_str()), (1.5, Some("/sys/fs/cgroup/cpu/app/cpu.cfs_quota_us")));
        // v2: none on the pod, half a CPU on its parent.
        let (q, f) = quota_in("0::/kubepods/pod1\n", v2_mounts, read).expect("v2 quota");
        assert_eq!((q, f.to_str()), (0.5, Some("/sys/fs/cgroup/kubepods/cpu.max")));
        // A container that mounts its own subtree at the mount point.
        let bound = "30 23 0:27 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let inside = |p: &Path| {
            read(Path::new(
                &p.to_str()?.replace("/sys/fs/cgroup", "/sys/fs/cgroup/kubepods"),
            ))
        };
        assert_eq!(
            quota_in("0::/kubepods/pod1\n", bound, inside).map(|(q, _)| q),
            Some(0.5)
        );
        // None: no quota anywhere, no cpu controller, nothing mounted, garbage.
        assert_eq!(quota_in("0::/\n", v2_mounts, read), None);
        assert_eq!(quota_in("1:cpu:/\n", v1_mounts, read), None);
        assert_eq!(quota_in("1:memory:/app\n", v1_mounts, read), None);
        assert_eq!(quota_in("1:cpu:/app\n", "", read), None);
        assert_eq!(quota_in("::::\n\n", "x - y\n", read), None);
    }

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
