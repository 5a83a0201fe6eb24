//! The attention of a short text, its heads shared between the searching thread and the
//! model's helper ([`super::helper`]): a request's attention is a few percent of its
//! vector's cost, but the helper would otherwise wait through it.
#![allow(unsafe_code)]

use super::helper::{Helper, Job, Panels};
use super::model::{dot, softmax, SHORT};
use std::ops::Range;

/// Each head's attention of `n ≤ SHORT` tokens (`[n, d, heads]`): `ctx` (`n × d`) gets
/// `softmax(scale · Q_h K_hᵀ + bias) · V_h` in head `h`'s columns, from `qkv` (`n` rows of
/// queries, keys and values, `3 · d` wide). With a `helper`, its thread takes half the
/// heads.
pub fn short(
    qkv: &[f32],
    ctx: &mut [f32],
    [n, d, heads]: [usize; 3],
    scale: f32,
    bias: &[f32],
    helper: Option<&Helper>,
) {
    assert!(
        n <= SHORT && heads > 0 && qkv.len() >= n * 3 * d && ctx.len() >= n * d,
        "attention of {n} tokens"
    );
    assert!(
        bias.is_empty() || bias.len() >= (2 * n).saturating_sub(1) * heads,
        "a short relative bias"
    );
    let job = Heads {
        qkv,
        ctx: ctx.as_mut_ptr(),
        n,
        d,
        heads,
        scale,
        bias,
    };
    match helper {
        // SAFETY: `job` borrows `qkv` and `ctx`, checked above to hold what `run` reads
        // and writes, until `share` returns; two threads take disjoint heads.
        Some(h) => unsafe { h.share(Job::new(&job, heads, 1)) },
        // SAFETY: as above, on this thread alone.
        None => unsafe { job.run(0..heads) },
    }
}

/// The attention of a short text (at most [`SHORT`] tokens), by head: each head reads its
/// columns of `qkv` (`n` rows of queries, keys and values, `3 · d` wide) and writes its
/// columns of `ctx` (`n × d`), so two threads can take disjoint heads.
struct Heads<'a> {
    qkv: &'a [f32],
    ctx: *mut f32,
    n: usize,
    d: usize,
    heads: usize,
    scale: f32,
    /// MPNet's bias by head and relative position, at `(j - i + n - 1) · heads + h`; empty
    /// for BERT.
    bias: &'a [f32],
}

impl Panels for Heads<'_> {
    unsafe fn run(&self, heads: Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F; the rest as the caller promises.
            return unsafe { self.run_avx512(heads) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA; the rest as the caller promises.
            return unsafe { self.run_avx2(heads) };
        }
        // SAFETY: as the caller promises.
        unsafe { self.heads(heads) }
    }
}

impl Heads<'_> {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_avx512(&self, heads: Range<usize>) {
        // SAFETY: as the caller promises.
        unsafe { self.heads(heads) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, heads: Range<usize>) {
        // SAFETY: as the caller promises.
        unsafe { self.heads(heads) }
    }

    /// # Safety
    /// `ctx` has `n × d` values, and no other thread writes these heads' columns.
    #[inline(always)]
    unsafe fn heads(&self, heads: Range<usize>) {
        let (n, d) = (self.n, self.d);
        let hd = d / self.heads;
        let mut scores = [0f32; SHORT];
        for h in heads {
            for i in 0..n {
                let q = &self.qkv[i * 3 * d + h * hd..][..hd];
                let row = &mut scores[..n];
                for (j, s) in row.iter_mut().enumerate() {
                    *s = self.scale * dot(q, &self.qkv[j * 3 * d + d + h * hd..][..hd]);
                }
                if !self.bias.is_empty() {
                    for (j, s) in row.iter_mut().enumerate() {
                        *s += self.bias[(j + n - 1 - i) * self.heads + h];
                    }
                }
                softmax(row);
                // SAFETY: as the caller promises: row `i`'s columns of head `h` are inside
                // `ctx` and this thread's.
                let c = unsafe { std::slice::from_raw_parts_mut(self.ctx.add(i * d + h * hd), hd) };
                c.fill(0.0);
                for (j, p) in row.iter().enumerate() {
                    for (c, v) in c.iter_mut().zip(&self.qkv[j * 3 * d + 2 * d + h * hd..][..hd]) {
                        *c += p * v;
                    }
                }
            }
        }
    }
}
