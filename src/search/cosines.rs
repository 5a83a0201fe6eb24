//! A search's cosines (the dot product of the request's vector with each tool's), shared
//! between the searching thread and the model's helper ([`super::helper`]) while the
//! search still has it: 1,000 tools are 1.5 MB of vectors, which one thread reads in
//! about 80 µs on the AMD EPYC VM of BENCHMARKS.md ("Session 22").
#![allow(unsafe_code)]

use super::helper::{Helper, Job, Panels};
use super::model::dots_into;
use std::ops::Range;

/// Tools a chunk: 64 vectors of 384 floats are 96 KiB.
const ROWS: usize = 64;

/// The dot product of `query` with each `query.len()`-wide row of `rows`, as
/// [`dots_into`]; with a `helper`, its thread takes every other chunk it can.
pub fn shared(rows: &[f32], query: &[f32], helper: Option<&Helper>) -> Vec<f32> {
    let n = rows.len().checked_div(query.len()).unwrap_or(0);
    let mut out = vec![0f32; n];
    let panels = n.div_ceil(ROWS);
    match helper.filter(|_| panels > 1) {
        Some(h) => {
            let job = Dots {
                rows,
                query,
                out: out.as_mut_ptr(),
                n,
            };
            // SAFETY: `job` borrows `rows` and `query` and points into `out`, which has
            // its `n` values, until `share` returns; two threads take disjoint chunks.
            unsafe { h.share(Job::new(&job, panels, 1)) };
        }
        None => dots_into(rows, query, &mut out),
    }
    out
}

/// The dots of [`shared`], [`ROWS`] rows a panel.
struct Dots<'a> {
    rows: &'a [f32],
    query: &'a [f32],
    out: *mut f32,
    n: usize,
}

impl Panels for Dots<'_> {
    unsafe fn run(&self, panels: Range<usize>) {
        let dim = self.query.len();
        let lo = (panels.start * ROWS).min(self.n);
        let hi = (panels.end * ROWS).min(self.n);
        // SAFETY: `out` has `n` values (`shared`), and the caller gives this thread these
        // panels alone.
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.add(lo), hi - lo) };
        dots_into(&self.rows[lo * dim..hi * dim], self.query, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_dots_equal_the_plain_ones() {
        let dim = 384;
        // 1,000 rows: not a multiple of a chunk.
        let rows: Vec<f32> = (0..1000 * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let query: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let plain: Vec<f32> = rows
            .chunks_exact(dim)
            .map(|r| super::super::model::dot(r, &query))
            .collect();
        assert_eq!(plain.len(), 1000);
        assert_eq!(shared(&rows, &query, None), plain);
        if let Some(session) = Helper::begin() {
            assert_eq!(shared(&rows, &query, Some(session.helper)), plain);
        }
        assert!(shared(&rows[..10], &[], None).is_empty());
    }
}
