//! A second thread for the weight products of one text (a search's request, whose vector
//! the search waits for), on AMX ([`super::amx`]) or in int8 on AVX-512 VNNI or AVX2
//! ([`super::vnni`]).
//!
//! Each product is posted as a [`Job`] of panels in chunks: the poster and the helper each
//! take the next chunk until none is left, so a helper that is asleep, not scheduled or
//! slower (a VM's second vCPU may share its core with another guest) costs nothing but the
//! check, and the two finish together. Reading the weights and multiplying them is what a product
//! costs, and two cores do it at nearly twice the rate of one (BENCHMARKS.md, "Session 14"
//! and "Session 16").
//!
//! One helper thread per process ([`Helper::begin`]), started on first use and asleep
//! between texts; one text at a time has it, and any other is made on its own thread.
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// A product that can be run a range of its panels (groups of outputs) at a time.
pub trait Panels {
    /// Runs `panels` of the product on this thread.
    ///
    /// # Safety
    /// The product's buffers are alive, and no other thread runs these panels meanwhile.
    unsafe fn run(&self, panels: Range<usize>);
}

/// One product posted to the helper: `run(data, panels)` runs those panels of it on the
/// calling thread, `chunk` panels at a time.
#[derive(Clone, Copy)]
pub struct Job {
    run: unsafe fn(*const (), Range<usize>),
    data: *const (),
    panels: usize,
    chunk: usize,
}

// SAFETY: a job's data is a product whose buffers its poster keeps, unmoved and untouched,
// until the helper has said it is done with it (`Helper::share`), and the poster and the
// helper take disjoint panels, so their stores never overlap.
unsafe impl Send for Job {}

impl Job {
    /// A job of the `panels` panels of `data`, taken `chunk` at a time (at least 1).
    pub fn new<T: Panels>(data: &T, panels: usize, chunk: usize) -> Job {
        Job {
            run: run_panels::<T>,
            data: (data as *const T).cast(),
            panels,
            chunk: chunk.max(1),
        }
    }

    /// Runs chunks of the job, the next not yet taken each time (`next` counts what is
    /// taken), until none is left.
    ///
    /// # Safety
    /// As [`Panels::run`]: the job's data is alive, and every other thread that runs it takes
    /// its chunks from the same `next`.
    unsafe fn take_chunks(&self, next: &AtomicUsize) {
        loop {
            let start = next.fetch_add(self.chunk, Ordering::Relaxed);
            if start >= self.panels {
                return;
            }
            // SAFETY: as the caller promises; `fetch_add` gave this thread these panels
            // alone.
            unsafe { (self.run)(self.data, start..(start + self.chunk).min(self.panels)) };
        }
    }
}

/// [`Panels::run`] of the `T` at `data`.
///
/// # Safety
/// `data` points to a live `T`, and [`Panels::run`]'s promise holds.
unsafe fn run_panels<T: Panels>(data: *const (), panels: Range<usize>) {
    // SAFETY: as the caller promises.
    unsafe { (*data.cast::<T>()).run(panels) }
}

/// The process's helper ([`Helper::begin`]).
pub struct Helper {
    state: AtomicU8,
    job: Mutex<Option<Job>>,
    /// The first panel of the posted job that neither thread has taken.
    next: AtomicUsize,
    /// Held by the text that has the helper.
    busy: Mutex<()>,
    /// Whether a text has the helper: it spins while so, and sleeps on `bell` when not.
    active: AtomicBool,
    sleep: Mutex<()>,
    bell: Condvar,
}

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const TAKEN: u8 = 2;
const DONE: u8 = 3;

/// A text's hold on the helper; dropping it lets the helper sleep.
pub struct Session {
    pub helper: &'static Helper,
    _busy: MutexGuard<'static, ()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.helper.active.store(false, Ordering::Release);
    }
}

impl Helper {
    /// The helper, for one text, if it is free (and could be started: this CPU runs the
    /// products on AMX or VNNI, and the process has a second CPU).
    pub fn begin() -> Option<Session> {
        static HELPER: OnceLock<Option<&'static Helper>> = OnceLock::new();
        let helper = (*HELPER.get_or_init(|| {
            if !(super::amx::available() || super::vnni::available())
                || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2
            {
                return None;
            }
            let helper: &'static Helper = Box::leak(Box::new(Helper {
                state: AtomicU8::new(IDLE),
                job: Mutex::new(None),
                next: AtomicUsize::new(0),
                busy: Mutex::new(()),
                active: AtomicBool::new(false),
                sleep: Mutex::new(()),
                bell: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("search-model".into())
                .spawn(move || helper.serve())
                .ok()
                .map(|_| helper)
        }))?;
        let busy = match helper.busy.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        {
            let _sleep = crate::sync::lock(&helper.sleep);
            helper.active.store(true, Ordering::Release);
            helper.bell.notify_one();
        }
        Some(Session { helper, _busy: busy })
    }

    /// Runs `job`, some of its chunks on the helper thread if the helper takes it in time.
    ///
    /// # Safety
    /// `job.run` may run any panels of the job on any thread, two disjoint ranges at once,
    /// until this returns.
    pub unsafe fn share(&self, job: Job) {
        *crate::sync::lock(&self.job) = Some(job);
        self.next.store(0, Ordering::Relaxed);
        self.state.store(POSTED, Ordering::Release);
        // SAFETY: as the caller promises; each chunk goes to the thread whose `fetch_add`
        // got it.
        unsafe { job.take_chunks(&self.next) };
        if self
            .state
            .compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // The helper took the job: wait until it is done with its last chunk.
            let mut spins = 0u32;
            while self.state.load(Ordering::Acquire) != DONE {
                spins = pause(spins);
            }
        }
        *crate::sync::lock(&self.job) = None;
        self.state.store(IDLE, Ordering::Release);
    }

    /// The helper thread: asleep until a text has it, then taking chunks of each
    /// product posted, until the text lets go.
    fn serve(&self) {
        loop {
            {
                let mut sleep = crate::sync::lock(&self.sleep);
                while !self.active.load(Ordering::Acquire) {
                    sleep = self.bell.wait(sleep).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            }
            let mut spins = 0u32;
            while self.active.load(Ordering::Acquire) {
                let taken = self.state.load(Ordering::Acquire) == POSTED
                    && self
                        .state
                        .compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok();
                if !taken {
                    spins = pause(spins);
                    continue;
                }
                spins = 0;
                let job = *crate::sync::lock(&self.job);
                if let Some(job) = job {
                    // SAFETY: the poster waits for DONE before it moves or reads the
                    // job's buffers, and takes its chunks from the same `next` (`share`).
                    unsafe { job.take_chunks(&self.next) };
                }
                self.state.store(DONE, Ordering::Release);
            }
        }
    }
}

/// Waits a moment: spinning at first (the next product follows within microseconds), then
/// giving the core away.
fn pause(spins: u32) -> u32 {
    if spins < 4096 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    spins.saturating_add(1)
}
