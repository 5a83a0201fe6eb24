//! The attention of a short text, its heads shared between the searching thread and the
//! model's helper ([`super::helper`]): a request's attention is a few percent of its
//! vector's cost, but the helper would otherwise wait through it.
#![allow(unsafe_code)]

use super::helper::{Helper, Job, Panels};
use super::model::{softmax, SHORT};
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
    // Each head's keys, transposed (`hd` rows of `n` rounded up to 8, the rest 0), so a
    // row of scores is a few vector FMAs per key column rather than `n` dot products,
    // each ending in a sum across lanes.
    let wide = n.next_multiple_of(8);
    let mut keys = vec![0f32; d * wide];
    let job = Heads {
        qkv,
        ctx: ctx.as_mut_ptr(),
        keys: keys.as_mut_ptr(),
        wide,
        n,
        d,
        heads,
        scale,
        bias,
    };
    match helper {
        // SAFETY: `job` borrows `qkv`, `ctx` and `keys`, checked or made above to hold what `run` reads
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
    /// Room for each head's keys transposed: head `h`'s `hd` rows of `wide` from
    /// `h · hd · wide`, `d · wide` in all, zeros.
    keys: *mut f32,
    /// `n` rounded up to a multiple of 8.
    wide: usize,
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
    /// `ctx` has `n × d` values and `keys` `d · wide` zeros, and no other thread writes
    /// these heads' columns or rows.
    #[inline(always)]
    unsafe fn heads(&self, heads: Range<usize>) {
        let (n, d, wide) = (self.n, self.d, self.wide);
        let hd = d / self.heads;
        let mut scores = [0f32; SHORT];
        for h in heads {
            // SAFETY: as the caller promises: head `h`'s `hd · wide` keys are inside `keys`
            // and this thread's.
            let kt = unsafe { std::slice::from_raw_parts_mut(self.keys.add(h * hd * wide), hd * wide) };
            for j in 0..n {
                let k = &self.qkv[j * 3 * d + d + h * hd..][..hd];
                for (c, k) in k.iter().enumerate() {
                    kt[c * wide + j] = *k;
                }
            }
            for i in 0..n {
                let q = &self.qkv[i * 3 * d + h * hd..][..hd];
                match wide / 8 {
                    1 => scores_of::<1>(q, kt, self.scale, &mut scores),
                    2 => scores_of::<2>(q, kt, self.scale, &mut scores),
                    3 => scores_of::<3>(q, kt, self.scale, &mut scores),
                    _ => scores_of::<4>(q, kt, self.scale, &mut scores),
                }
                let row = &mut scores[..n];
                if !self.bias.is_empty() {
                    for (j, s) in row.iter_mut().enumerate() {
                        *s += self.bias[(j + n - 1 - i) * self.heads + h];
                    }
                }
                softmax(row);
                // SAFETY: as the caller promises: row `i`'s columns of head `h` are inside
                // `ctx` and this thread's.
                let c = unsafe { std::slice::from_raw_parts_mut(self.ctx.add(i * d + h * hd), hd) };
                let values = &self.qkv[2 * d + h * hd..];
                let mut at = 0;
                // 32 columns at a time in registers, then what is left of them.
                while at + 32 <= hd {
                    let mut acc = [0f32; 32];
                    for (j, p) in row.iter().enumerate() {
                        for (a, v) in acc.iter_mut().zip(&values[j * 3 * d + at..][..32]) {
                            *a = p.mul_add(*v, *a);
                        }
                    }
                    c[at..at + 32].copy_from_slice(&acc);
                    at += 32;
                }
                if at < hd {
                    let c = &mut c[at..];
                    c.fill(0.0);
                    for (j, p) in row.iter().enumerate() {
                        for (c, v) in c.iter_mut().zip(&values[j * 3 * d + at..][..hd - at]) {
                            *c = p.mul_add(*v, *c);
                        }
                    }
                }
            }
        }
    }
}

/// `scale · q · Kᵀ` into the first `8 · W` of `out`, from `kt`, the keys transposed
/// (`q.len()` rows of `8 · W`): `W` vectors of sums, kept in registers.
#[inline(always)]
fn scores_of<const W: usize>(q: &[f32], kt: &[f32], scale: f32, out: &mut [f32; SHORT]) {
    let mut acc = [[0f32; 8]; W];
    for (q, kc) in q.iter().zip(kt.chunks_exact(8 * W)) {
        let q = scale * q;
        for (acc, k) in acc.iter_mut().zip(kc.chunks_exact(8)) {
            for (a, k) in acc.iter_mut().zip(k) {
                *a = q.mul_add(*k, *a);
            }
        }
    }
    for (o, acc) in out.chunks_exact_mut(8).zip(&acc) {
        o.copy_from_slice(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention as written: each score a dot product, each output a sum of values.
    fn plain(qkv: &[f32], [n, d, heads]: [usize; 3], scale: f32, bias: &[f32]) -> Vec<f32> {
        let hd = d / heads;
        let mut ctx = vec![0f32; n * d];
        for h in 0..heads {
            for i in 0..n {
                let mut row: Vec<f32> = (0..n)
                    .map(|j| {
                        let s: f32 = (0..hd)
                            .map(|c| qkv[i * 3 * d + h * hd + c] * qkv[j * 3 * d + d + h * hd + c])
                            .sum();
                        scale * s + bias.get((j + n - 1 - i) * heads + h).copied().unwrap_or(0.0)
                    })
                    .collect();
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row
                    .iter_mut()
                    .map(|s| {
                        *s = (*s - max).exp();
                        *s
                    })
                    .sum();
                for j in 0..n {
                    for c in 0..hd {
                        ctx[i * d + h * hd + c] += row[j] / sum * qkv[j * 3 * d + 2 * d + h * hd + c];
                    }
                }
            }
        }
        ctx
    }

    #[test]
    fn the_heads_equal_the_attention_as_written() {
        // Heads of 32 (MiniLM), 64 (MPNet) and 40 columns (32 and a rest), 1 to SHORT
        // tokens, with and without a relative bias, on one thread.
        for (d, heads) in [(384, 12), (768, 12), (80, 2)] {
            for n in [1, 7, 8, 10, 17, SHORT] {
                for biased in [false, true] {
                    let qkv: Vec<f32> = (0..n * 3 * d)
                        .map(|i| ((i * 7919 % 1013) as f32 / 506.0) - 1.0)
                        .collect();
                    let bias: Vec<f32> = if biased {
                        (0..(2 * n - 1) * heads).map(|i| (i % 5) as f32 * 0.1).collect()
                    } else {
                        Vec::new()
                    };
                    let scale = 1.0 / ((d / heads) as f32).sqrt();
                    let mut ctx = vec![0f32; n * d];
                    short(&qkv, &mut ctx, [n, d, heads], scale, &bias, None);
                    let want = plain(&qkv, [n, d, heads], scale, &bias);
                    for (k, (a, b)) in ctx.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() < 1e-4,
                            "d {d}, n {n}, bias {biased}, at {k}: {a} against {b}"
                        );
                    }
                }
            }
        }
    }
}
