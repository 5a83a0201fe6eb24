//! Ranking by meaning beside the words: with `[gateway] search_model`, every tool of a
//! catalog gets the vector of its text ([`Model`]), and a search adds the cosine between the
//! request's vector and each tool's to its lexical score.
//!
//! A search's score is `lexical / best lexical + weight × cosine`, over the tools a word of
//! the request matches and those whose cosine is at least [`MIN_COSINE`], so a tool whose
//! words the request does not use can still be found. `weight` (2) was chosen on
//! the tuned requests only; BENCHMARKS.md ("Tool search") has what it gives on the others.
//!
//! Costs, and how they are kept off the request path:
//! - The model is read once per process and folder ([`Semantic::shared`]).
//! - A catalog's vectors are computed by the gateway's one model thread ([`Worker`]) after
//!   the catalog is built ([`super::Index::attach`]); until they are there, search is
//!   lexical, so a list_changed never waits for the model. Vectors are kept by the tool's text, so a new
//!   catalog computes only the tools whose text changed.
//! - A search computes one vector, the request's (about a millisecond of CPU on AMX, 15 in
//!   f32), and one dot product per tool, both on tokio's blocking pool, at most one search
//!   per CPU at once (see [`Semantic::permits`]), the dot products shared with the model's
//!   helper thread too ([`super::Index::cosines`]).

use super::model::Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

type TextMap<V> = HashMap<Box<str>, V, foldhash::fast::FixedState>;

/// What a search's lexical part counts against the cosine: `lexical / best + WEIGHT · cos`.
pub const WEIGHT: f32 = 2.0;

/// A tool no word of the request matches is a result only this near in meaning, so a
/// request for nothing the tools do finds nothing rather than the nearest noise.
pub const MIN_COSINE: f32 = 0.25;

/// The most tools of one catalog the model makes vectors for, in the catalog's order; the
/// rest are ranked by words only. A downstream that lists tens of thousands of long tools
/// would otherwise cost the model's thread many minutes of CPU (a tool of 74 tokens takes
/// about 8 ms on AMX, 45 ms in f32; more at 256) and their vectors its memory (1.5 KiB a
/// tool).
pub const MAX_MODEL_TOOLS: usize = 4096;

/// A loaded model and the vectors it has made, by text.
pub struct Semantic {
    pub model: Model,
    cache: Mutex<TextMap<Arc<[f32]>>>,
    /// Requests' vectors made at once: one per CPU, so a burst of searches queues here
    /// instead of filling the blocking pool with threads that share the same cores.
    pub permits: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Semantic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semantic")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// The models read so far, by folder (one, in practice): a reload naming the same folder
/// keeps the model and its vectors; an error is kept too, so it is reported once.
type Loaded = Vec<(PathBuf, Result<Arc<Semantic>, String>)>;
static LOADED: Mutex<Loaded> = Mutex::new(Vec::new());

impl Semantic {
    pub fn new(model: Model) -> Semantic {
        Semantic {
            model,
            cache: Mutex::new(TextMap::default()),
            permits: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }

    /// The model in `dir`, read on first use.
    pub fn shared(dir: &Path) -> Result<Arc<Semantic>, String> {
        let mut loaded = crate::sync::lock(&LOADED);
        if let Some((_, m)) = loaded.iter().find(|(p, _)| p == dir) {
            return m.clone();
        }
        let m = Model::load(dir).map(|m| Arc::new(Semantic::new(m)));
        loaded.push((dir.to_path_buf(), m.clone()));
        m
    }

    /// The vectors of `texts`, one after another (`texts.len() × dim`). The cache keeps
    /// these texts' vectors and drops the rest. The cache is held meanwhile, so two catalogs
    /// in a row do not compute the same new tools twice (the second finds them in it).
    pub fn vectors<'a>(&self, texts: impl IntoIterator<Item = &'a Box<str>>) -> Vec<f32> {
        let texts = texts.into_iter();
        let mut cache = crate::sync::lock(&self.cache);
        let mut old = std::mem::take(&mut *cache);
        let mut out = Vec::with_capacity(texts.size_hint().0 * self.model.dim());
        for t in texts {
            let v = match old.remove(t).or_else(|| cache.get(t).cloned()) {
                Some(v) => v,
                None => Arc::from(self.model.embed_document(t)),
            };
            out.extend_from_slice(&v);
            cache.insert(t.clone(), v);
        }
        out
    }
}

/// A catalog's vectors, attached to its index.
#[derive(Debug)]
pub struct Dense {
    pub semantic: Arc<Semantic>,
    /// Tool `i`'s vector is `vectors[i·dim..(i+1)·dim]`.
    pub vectors: Vec<f32>,
}

/// A job for the [`Worker`].
pub type Job = Box<dyn FnOnce() + Send>;

/// The one thread that computes a gateway's vectors, started when there is work: a
/// catalog built while it works replaces the one waiting (only the newest is worth its
/// vectors), so a server that announces list_changed in a loop never piles up threads.
#[derive(Default)]
pub struct Worker {
    pending: Mutex<Option<Job>>,
    running: AtomicBool,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("running", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Runs `job` on the worker's thread, after the job it is running, instead of any job
    /// still waiting.
    pub fn submit(self: &Arc<Self>, job: Job) {
        *crate::sync::lock(&self.pending) = Some(job);
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("search-model".into())
            .spawn(move || me.run());
        if let Err(e) = spawned {
            self.running.store(false, Ordering::Release);
            tracing::warn!("tool search: cannot start the model's thread: {e}");
        }
    }

    fn run(&self) {
        loop {
            let job = crate::sync::lock(&self.pending).take();
            match job {
                Some(job) => job(),
                None => {
                    self.running.store(false, Ordering::Release);
                    // A job submitted after the take above saw `running` and left it to
                    // this thread: take it, unless a new thread already has.
                    if crate::sync::lock(&self.pending).is_none() || self.running.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_runs_the_newest_job_and_one_thread_at_a_time() {
        let w = Arc::new(Worker::default());
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<u32>();
        let first = done_tx.clone();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        // The first job holds the thread until the gate opens; jobs 2..=50 wait, and each
        // replaces the one before it.
        w.submit(Box::new(move || {
            started_tx.send(()).ok();
            gate_rx.recv().ok();
            first.send(1).ok();
        }));
        started_rx.recv().expect("the first job started");
        for i in 2..=50 {
            let tx = done_tx.clone();
            w.submit(Box::new(move || {
                tx.send(i).ok();
            }));
        }
        gate_tx.send(()).expect("gate");
        let got: Vec<u32> = (0..2).map(|_| done_rx.recv().expect("a job ran")).collect();
        assert_eq!(got, [1, 50]);
        drop(done_tx);
        // No other job runs: the channel closes once the last sender (in job 50) is gone.
        assert!(done_rx.recv().is_err());
    }
}
