//! `mcp-gateway-search-bench` (and `mcp-gateway-bench --mode search`, which runs it; issue
//! #17): the gateway's own tool search, run in process, with the gateway's allocator, on the
//! fixture in `tests/fixtures/search` (the tools the servers' own npm and PyPI releases list,
//! built by `scripts/search-fixture`; the labeled requests, some held out; SOURCES.md there).
//!
//! - **Recall** on the real catalog: a request counts at k when one of its tools is among
//!   the first k results; reported for the tuned, the held-out, the fresh and the fresh2
//!   requests apart (`--no-fresh` leaves both fresh sets out, `--tuned-only` all but the tuned).
//! - **Search latency** on a catalog of at least 1,000 tools: the real ones plus second
//!   instances of whole servers under other names (`github-2`…, as a team with staging and
//!   production instances has). Every request of the fixture, `--search-rounds` times,
//!   limit 8, one at a time; once with every tool visible and once with a client's
//!   allowlist hiding about half of them.
//! - **Rebuild**: what a list_changed costs search, the index of that catalog built again
//!   from the catalog's list (`Catalog::search_index` on a new catalog), `--search-rebuilds`
//!   times: after one server's list changed (the next server each time; the others'
//!   analysis is reused), and after every server's did (a build from nothing). The
//!   catalog's own merge is timed beside it.

use anyhow::{Context, Result};
use mcp_gateway::searching::{recall, Fixture, Recall, Semantic, Server};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What `mcp-gateway-search-bench` is told (`--mode search` passes its own flags on).
#[derive(clap::Args, Debug, Clone)]
pub struct Opts {
    /// The fixture (`servers/*.json`, `queries.json`, `heldout.json`); by default the
    /// repository's, wherever the bench is run from.
    #[arg(long, env = "MCP_GATEWAY_SEARCH_FIXTURE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/search"))]
    pub search_fixture: PathBuf,
    /// How many times every request is searched for the latency figures.
    #[arg(long, default_value_t = 50)]
    pub search_rounds: usize,
    /// How many times the 1,000-tool index is built again.
    #[arg(long, default_value_t = 50)]
    pub search_rebuilds: usize,
    /// Print the tuned requests none of whose tools came in the first five (never the
    /// held-out ones: they stay unseen).
    #[arg(long)]
    pub search_misses: bool,
    /// Leave the held-out and the fresh requests out of everything printed (while tuning).
    #[arg(long)]
    pub tuned_only: bool,
    /// Leave the fresh requests (`fresh.json`, `fresh2.json`) out of everything printed: they are measured
    /// once, at the end of a round, never while tuning.
    #[arg(long)]
    pub no_fresh: bool,
    /// A sentence-embedding model's folder (`[gateway] search_model`): recall, latency and
    /// rebuild are measured again with it, as rows of their own.
    #[arg(long, env = "MCP_GATEWAY_SEARCH_MODEL")]
    pub search_model: Option<PathBuf>,
}

/// One line of the targets table.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub target: String,
    pub goal: String,
    pub measured: String,
    pub pass: bool,
}

fn target_row(out: &mut Vec<Row>, target: &str, goal: &str, measured: String, pass: bool) {
    eprintln!(
        "  TARGET {target}: {measured} (target {goal}): {}",
        if pass { "PASS" } else { "FAIL" }
    );
    out.push(Row {
        target: target.to_owned(),
        goal: goal.to_owned(),
        measured,
        pass,
    });
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn run(args: &Opts) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let f = Fixture::load(&args.search_fixture)
        .map_err(anyhow::Error::msg)
        .context("loading the search fixture")?;
    run_with(args, &f, None, &mut rows)?;
    if let Some(dir) = &args.search_model {
        let t0 = Instant::now();
        let semantic = Semantic::shared(dir).map_err(anyhow::Error::msg)?;
        eprintln!(
            "  with the model {} (read in {:.2} s):",
            dir.display(),
            t0.elapsed().as_secs_f64()
        );
        run_with(args, &f, Some(&semantic), &mut rows)?;
    }
    Ok(rows)
}

fn run_with(args: &Opts, f: &Fixture, semantic: Option<&Arc<Semantic>>, targets: &mut Vec<Row>) -> Result<()> {
    let label = if semantic.is_some() { ", model" } else { "" };
    let real = Fixture::catalog(&f.servers);
    let index = real.search_index();
    if let Some(s) = semantic {
        let (t0, c0) = (Instant::now(), thread_cpu_ns());
        index.attach(s);
        eprintln!(
            "  vectors of {} tools: {:.2} s ({:.2} s of CPU)",
            index.len(),
            t0.elapsed().as_secs_f64(),
            (thread_cpu_ns() - c0) as f64 / 1e9
        );
    }
    eprintln!(
        "  fixture: {} tools of {} servers; {} requests tuned on, {} held out, {} fresh, {} fresh2",
        index.len(),
        f.servers.len(),
        f.queries.len(),
        f.heldout.len(),
        f.fresh.len(),
        f.fresh2.len()
    );
    let tuned = recall(index, &f.queries);
    let held = recall(index, &f.heldout);
    let fresh = recall(index, &f.fresh);
    let fresh2 = recall(index, &f.fresh2);
    let all: Vec<_> = f.queries.iter().chain(&f.heldout).cloned().collect();
    let both = recall(index, &all);
    let with_fresh = !args.tuned_only && !args.no_fresh && !f.fresh.is_empty();
    let with_fresh2 = !args.tuned_only && !args.no_fresh && !f.fresh2.is_empty();
    let sets: Vec<(&str, &Recall)> = if args.tuned_only {
        vec![("tuned", &tuned)]
    } else {
        let mut sets = vec![("tuned", &tuned), ("held out", &held)];
        if with_fresh {
            sets.push(("fresh", &fresh));
        }
        if with_fresh2 {
            sets.push(("fresh2", &fresh2));
        }
        sets.push(("tuned + held out", &both));
        sets
    };
    for (set, r) in &sets {
        eprintln!(
            "  recall ({set}, {} requests): @1 {:.3}, @5 {:.3}; labels found in the first 5: {:.3}",
            r.queries, r.at1, r.at5, r.labels_at5
        );
    }
    if args.search_misses {
        for (q, want, got) in &tuned.misses {
            eprintln!("    miss: {q:?}: want {want:?}, got {got:?}");
        }
    }
    let row = |targets: &mut Vec<Row>, what: &str, goal: f64, r: &Recall, at1: bool| {
        let v = if at1 { r.at1 } else { r.at5 };
        target_row(
            targets,
            &format!("search {what}{label}, {} requests", r.queries),
            &format!("≥ {goal:.2}"),
            format!("{v:.3}"),
            v >= goal,
        );
    };
    row(targets, "recall@5 (tuned)", 0.90, &tuned, false);
    if !args.tuned_only {
        row(targets, "recall@5 (held out)", 0.90, &held, false);
    }
    if with_fresh {
        row(targets, "recall@5 (fresh)", 0.90, &fresh, false);
    }
    if with_fresh2 {
        row(targets, "recall@5 (fresh2)", 0.90, &fresh2, false);
    }
    row(targets, "recall@1 (tuned)", 0.70, &tuned, true);
    if !args.tuned_only {
        row(targets, "recall@1 (held out)", 0.70, &held, true);
    }
    if with_fresh {
        row(targets, "recall@1 (fresh)", 0.70, &fresh, true);
    }
    if with_fresh2 {
        row(targets, "recall@1 (fresh2)", 0.70, &fresh2, true);
    }

    let padded = f.padded(1000);
    let big = Fixture::catalog(&padded);
    let n = big.search_index().len();
    if let Some(s) = semantic {
        let (t0, c0) = (Instant::now(), thread_cpu_ns());
        big.search_index().attach(s);
        eprintln!(
            "  vectors of {n} tools (the {} above from the cache): {:.2} s ({:.2} s of CPU)",
            index.len(),
            t0.elapsed().as_secs_f64(),
            (thread_cpu_ns() - c0) as f64 / 1e9
        );
    }
    let queries: Vec<&str> = all.iter().map(|q| q.query.as_str()).collect();
    let mut lat = Vec::new();
    let mut cpu = Vec::new();
    let mut hidden_lat = Vec::new();
    let mut found = 0usize;
    // About half hidden, as an allowlist over public names would: the second instances
    // and every server whose name starts in the second half of the alphabet.
    let visible = |name: &str| !name.contains("-2__") && name.as_bytes().first().is_some_and(|b| *b < b'n');
    for _ in 0..args.search_rounds {
        for q in &queries {
            let (t0, c0) = (Instant::now(), thread_cpu_ns());
            let hits = big.search_index().search(q, 8, |_| true);
            lat.push(t0.elapsed().as_nanos() as u64);
            cpu.push(thread_cpu_ns().saturating_sub(c0));
            found += hits.len();
            let t0 = Instant::now();
            let hits = big.search_index().search(q, 8, visible);
            hidden_lat.push(t0.elapsed().as_nanos() as u64);
            found += hits.len();
        }
    }
    std::hint::black_box(found);
    lat.sort_unstable();
    cpu.sort_unstable();
    hidden_lat.sort_unstable();
    let us = |v: &[u64], p: f64| percentile(v, p) as f64 / 1000.0;
    eprintln!(
        "  search on {n} tools: {} searches, p50 {:.1} us ({:.1} us of CPU), p99 {:.1} us; with half hidden p50 {:.1} us, p99 {:.1} us",
        lat.len(),
        us(&lat, 50.0),
        us(&cpu, 50.0),
        us(&lat, 99.0),
        us(&hidden_lat, 50.0),
        us(&hidden_lat, 99.0)
    );
    // What a hostile query costs at the size `gateway__search_tools` takes: made-up words
    // (each tried as a prefix and a compound), the catalog's own words (each with its
    // postings), one long word. The worst of 5 runs each.
    let limit = mcp_gateway::searching::MAX_QUERY;
    let fill = |words: &mut dyn Iterator<Item = String>| {
        let mut q = String::with_capacity(limit);
        for w in words {
            if q.len() + w.len() + 1 > limit {
                break;
            }
            q.push_str(&w);
            q.push(' ');
        }
        q
    };
    let made_up = fill(&mut (0u32..).map(|i| format!("zq{i:x}wv")));
    let own = fill(
        &mut queries
            .iter()
            .cycle()
            .flat_map(|q| q.split_whitespace().map(str::to_owned))
            .take(10_000),
    );
    let one = "x".repeat(limit);
    let worst = |q: &str| {
        (0..5)
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(big.search_index().search(q, 8, |_| true));
                t0.elapsed().as_secs_f64() * 1e6
            })
            .fold(0f64, f64::max)
    };
    eprintln!(
        "  a query of {limit} bytes, the most a search takes (worst of 5): made-up words {:.0} us, the requests' own words {:.0} us, one word {:.0} us",
        worst(&made_up),
        worst(&own),
        worst(&one)
    );
    target_row(
        targets,
        &format!("search p50{label}, {n} tools"),
        "≤ 1 ms",
        format!("p50 {:.1} us (p99 {:.1} us)", us(&lat, 50.0), us(&lat, 99.0)),
        us(&lat, 50.0) <= 1000.0 && n >= 1000,
    );

    // A list_changed: one server's list changes (its first tool's description edited), the
    // next time another's, and the edits stay, as a live catalog's do. Then every server's at once,
    // each round, which is a build from nothing (a reload of every server). The two series
    // run apart: the model keeps only the vectors of the last build's texts, so a build
    // from nothing between two one-server rounds would cost the next one every vector.
    let edit = |servers: &mut [Server], round: usize, which: Option<usize>| {
        for (i, s) in servers.iter_mut().enumerate() {
            if which.is_none_or(|w| w == i) {
                if let Some(serde_json::Value::String(d)) = s.tools.first_mut().and_then(|t| t.get_mut("description")) {
                    d.push_str(&format!(" (round {round})"));
                }
            }
        }
    };
    let mut one = Timings::default();
    let mut all = Timings::default();
    let mut live = padded.clone();
    for (timings, which) in [(&mut one, Some(())), (&mut all, None)] {
        for round in 0..args.search_rebuilds {
            let servers = match which {
                Some(()) => {
                    // Servers spread evenly over the fixture, however many rounds: the
                    // first few servers' first tools are long ones, so taking servers in
                    // order made a short run's figure theirs alone.
                    let which = round * padded.len() / args.search_rebuilds.max(1) % padded.len().max(1);
                    edit(&mut live, round, Some(which));
                    live.clone()
                }
                None => {
                    let mut servers = padded.clone();
                    edit(&mut servers, round, None);
                    servers
                }
            };
            let t0 = Instant::now();
            let catalog = Fixture::catalog(&servers);
            let t1 = Instant::now();
            let c1 = thread_cpu_ns();
            let built = catalog.search_index().len();
            if let Some(s) = semantic {
                // Every text but the changed ones is in the model's cache.
                catalog.search_index().attach(s);
            }
            timings.cpu.push(thread_cpu_ns().saturating_sub(c1));
            timings.wall.push(t1.elapsed().as_nanos() as u64);
            timings.merge.push((t1 - t0).as_nanos() as u64);
            std::hint::black_box(built);
        }
    }
    let ms = |v: &[u64], p: f64| percentile(v, p) as f64 / 1e6;
    for t in [&mut one, &mut all] {
        t.cpu.sort_unstable();
        t.wall.sort_unstable();
        t.merge.sort_unstable();
    }
    for (what, t) in [("one server's list", &one), ("every server's list", &all)] {
        eprintln!(
            "  rebuild of {n} tools after {what} changed, {} times: index p50 {:.2} ms of CPU ({:.2} ms wall), max {:.2} ms wall; the catalog's merge before it p50 {:.2} ms",
            t.wall.len(),
            ms(&t.cpu, 50.0),
            ms(&t.wall, 50.0),
            ms(&t.wall, 100.0),
            ms(&t.merge, 50.0)
        );
    }
    // Judged on the thread's CPU time: on a shared 2-core box the wall clock also counts
    // the time other processes had the core. A list_changed comes from one server.
    target_row(
        targets,
        &format!("search index rebuild{label}, {n} tools, one server changed"),
        "≤ 20 ms",
        format!(
            "p50 {:.2} ms of CPU, {:.2} ms wall (max {:.2} ms wall); every server changed: p50 {:.2} ms of CPU",
            ms(&one.cpu, 50.0),
            ms(&one.wall, 50.0),
            ms(&one.wall, 100.0),
            ms(&all.cpu, 50.0)
        ),
        ms(&one.cpu, 50.0) <= 20.0,
    );
    Ok(())
}

/// A rebuild's times, in ns: the index's CPU and wall clock, the catalog's merge.
#[derive(Default)]
struct Timings {
    cpu: Vec<u64>,
    wall: Vec<u64>,
    merge: Vec<u64>,
}

/// CPU time of this thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
