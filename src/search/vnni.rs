//! The model's weight products in int8 on AVX-512 VNNI, for CPUs without AMX: `out = x · Wᵀ`
//! with `W` quantized once at load (a scale per output), `x` quantized per row on each
//! product, sums in i32 (`vpdpbusd`: 64 multiply-adds an instruction, against 16 for an f32
//! FMA).
//!
//! Why: a cloud VM may hide AMX while showing AVX-512 VNNI (this project's 2-core VMs do,
//! some days: a Xeon of the same family with `amx_*` masked). There, the f32 products took a
//! 10-token request 12.5 ms with `matrixmultiply`, which also packs every weight on every
//! call; int8 weights are 10.6 MB instead of 42 MB, read once per product in the order
//! the kernel wants them. A search's request shares each product with the process's helper
//! thread ([`super::helper`]), as on AMX. BENCHMARKS.md ("Session 16") has the figures and
//! what int8 does to the vectors (cosine to f32 0.998–0.999) and to recall (the same).
//!
//! A weight row (one output) is `scale · q` with `q` in −127..=127; an input row is
//! `s · (u − z)` with `u` in 0..=255, `s` and `z` set by the row's least and greatest values
//! (`vpdpbusd` takes unsigned × signed bytes; a row after GELU is mostly on one side of 0,
//! so this keeps twice the steps of a scale symmetric about 0); `z · Σq` is taken off
//! each output's sum.
#![allow(unsafe_code)]

use super::helper::{Helper, Job, Panels};
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Outputs of one vector of sums.
const LANES: usize = 16;
/// Inputs summed per lane per instruction.
const K_STEP: usize = 4;
/// Rows of `x` and vectors of outputs in one block of sums (16 accumulators).
const BLOCK_ROWS: usize = 4;
const BLOCK_PANELS: usize = 4;

/// Whether this CPU runs the int8 products: AVX-512 F, BW and VNNI.
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> bool {
    false
}

/// Whether a product of `inp` inputs and `out` outputs is whole steps and vectors.
pub fn fits(inp: usize, out: usize) -> bool {
    inp > 0 && out > 0 && inp.is_multiple_of(K_STEP) && out.is_multiple_of(LANES)
}

/// `W` (`out` rows of `inp`, as stored) in int8, in the order the product reads it: by
/// vector of 16 outputs, then by 4 inputs, each 64 bytes (output-major, 4 inputs each).
pub struct Packed {
    q: Vec<i8>,
    /// Per output: the weight row's scale, and `Σq` (what an input's zero point adds, times it).
    scale: Vec<f32>,
    sums: Vec<i32>,
    inp: usize,
    out: usize,
}

/// Where [`Packed::apply`] keeps an input's bytes, row scales and zero points between
/// products.
#[derive(Default)]
pub struct Scratch {
    bytes: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<i32>,
}

impl Packed {
    /// Quantizes and packs `w` (`out` × `inp`, row-major); `fits(inp, out)` must hold.
    pub fn new(w: &[f32], out: usize, inp: usize) -> Packed {
        assert!(fits(inp, out) && w.len() == out * inp, "not whole vectors: {out}×{inp}");
        let steps = inp / K_STEP;
        let mut q = vec![0i8; out * inp];
        let mut scale = vec![0f32; out];
        let mut sums = vec![0i32; out];
        for (o, row) in w.chunks_exact(inp).enumerate() {
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = if max > 0.0 { max / 127.0 } else { 1.0 };
            scale[o] = s;
            let (panel, lane) = (o / LANES, o % LANES);
            let mut sum = 0i32;
            for (k, v) in row.iter().enumerate() {
                let v = (v / s).round().clamp(-127.0, 127.0) as i8;
                sum += i32::from(v);
                q[((panel * steps + k / K_STEP) * LANES + lane) * K_STEP + k % K_STEP] = v;
            }
            sums[o] = sum;
        }
        Packed {
            q,
            scale,
            sums,
            inp,
            out,
        }
    }

    /// `out = x · Wᵀ` for `n` rows of `x` (`inp` wide, row-major); `out` gets `n × self.out`
    /// values, row-major. [`available`] must hold. With a `helper`, its thread may take the
    /// second half of the output vectors.
    pub fn apply(&self, x: &[f32], n: usize, out: &mut Vec<f32>, scratch: &mut Scratch, helper: Option<&Helper>) {
        assert!(x.len() >= n * self.inp && available(), "int8 product of {n} rows");
        quantize(&x[..n * self.inp], self.inp, scratch);
        out.resize(n * self.out, 0.0);
        let job = Product {
            packed: self,
            x: scratch.bytes.as_ptr(),
            scales: scratch.scales.as_ptr(),
            zeros: scratch.zeros.as_ptr(),
            n,
            out: out.as_mut_ptr(),
        };
        let panels = self.out / LANES;
        match helper {
            // SAFETY: `job` is made of the checked buffers above, which stay borrowed until
            // `share` returns.
            Some(h) => unsafe { h.share(Job::new(&job, panels)) },
            // SAFETY: as above.
            None => unsafe { job.run(0..panels) },
        }
    }
}

/// One product, as [`Packed::apply`] checked it: `x` has `n` rows of `packed.inp` bytes,
/// `scales` and `zeros` `n` values, `out` room for `n × packed.out` values.
struct Product<'a> {
    packed: &'a Packed,
    x: *const u8,
    scales: *const f32,
    zeros: *const i32,
    n: usize,
    out: *mut f32,
}

impl Panels for Product<'_> {
    /// Runs the output vectors `panels` of the product on this thread (the buffers are as
    /// `Packed::apply` made them, and [`available`] said yes).
    unsafe fn run(&self, panels: Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the caller promises.
        unsafe {
            self.products(panels);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = panels;
    }
}

impl Product<'_> {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn products(&self, panels: Range<usize>) {
        // Panels outside, rows inside: each panel's weights (at most 96 KiB) are read
        // from memory once and stay in cache for every row.
        let mut p = panels.start;
        while p < panels.end {
            let np = (panels.end - p).min(BLOCK_PANELS);
            let mut m = 0;
            while m < self.n {
                let rows = (self.n - m).min(BLOCK_ROWS);
                // SAFETY: as `run` promises; `rows` rows from `m` and `np` panels from `p`
                // are inside the product.
                unsafe {
                    match (rows, np) {
                        (4, 4) => self.block::<4, 4>(m, p),
                        (3, 4) => self.block::<3, 4>(m, p),
                        (2, 4) => self.block::<2, 4>(m, p),
                        (1, 4) => self.block::<1, 4>(m, p),
                        _ => {
                            for j in p..p + np {
                                for r in m..m + rows {
                                    self.block::<1, 1>(r, j);
                                }
                            }
                        }
                    }
                }
                m += rows;
            }
            p += np;
        }
    }

    /// The sums of rows `m..m + R` and output vectors `p..p + P`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn block<const R: usize, const P: usize>(&self, m: usize, p: usize) {
        let w8 = self.packed;
        let (inp, steps) = (w8.inp, w8.inp / K_STEP);
        let (w, x) = (w8.q.as_ptr(), self.x);
        // SAFETY: as `products` promises: the panels `p..p + P` hold `steps` vectors of 64
        // bytes each, the rows `m..m + R` `inp` bytes each, and their outputs are in `out`.
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            for s in 0..steps {
                let mut wv = [_mm512_setzero_si512(); P];
                for (j, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(w.add(((p + j) * steps + s) * 64).cast());
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_epi32(x.add((m + r) * inp + s * K_STEP).cast::<i32>().read_unaligned());
                    for (acc, v) in acc.iter_mut().zip(&wv) {
                        *acc = _mm512_dpbusd_epi32(*acc, a, *v);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let s = _mm512_set1_ps(*self.scales.add(m + r));
                let z = _mm512_set1_epi32(*self.zeros.add(m + r));
                for (j, acc) in acc.iter().enumerate() {
                    let o = (p + j) * LANES;
                    let q = _mm512_loadu_si512(w8.sums.as_ptr().add(o).cast());
                    let sums = _mm512_sub_epi32(*acc, _mm512_mullo_epi32(q, z));
                    let v = _mm512_mul_ps(
                        _mm512_cvtepi32_ps(sums),
                        _mm512_mul_ps(_mm512_loadu_ps(w8.scale.as_ptr().add(o)), s),
                    );
                    _mm512_storeu_ps(self.out.add((m + r) * w8.out + o), v);
                }
            }
        }
    }
}

/// Each `inp`-wide row of `x` as `s · (u − z)`: the bytes `u`, the scales `s` and the zero
/// points `z`.
fn quantize(x: &[f32], inp: usize, scratch: &mut Scratch) {
    scratch.bytes.clear();
    scratch.scales.clear();
    scratch.zeros.clear();
    scratch.bytes.resize(x.len(), 0);
    for (row, bytes) in x.chunks_exact(inp).zip(scratch.bytes.chunks_exact_mut(inp)) {
        #[cfg(target_arch = "x86_64")]
        if inp.is_multiple_of(16) && available() {
            // SAFETY: the CPU has AVX-512 F and BW (`available`), and the row's length is
            // whole vectors of 16.
            let (s, z) = unsafe { quantize_row_avx512(row, bytes) };
            scratch.scales.push(s);
            scratch.zeros.push(z);
            continue;
        }
        let (lo, hi) = row.iter().fold((0f32, 0f32), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let (s, inv, z) = steps(lo, hi);
        for (b, v) in bytes.iter_mut().zip(row) {
            // Non-negative once clamped: adding ½ and truncating rounds to nearest.
            *b = ((v * inv + z).clamp(0.0, 255.0) + 0.5) as u8;
        }
        scratch.scales.push(s);
        scratch.zeros.push(z as i32);
    }
}

/// A row between `lo` and `hi` (`lo ≤ 0 ≤ hi`) in 255 steps: the step `s`, `1 / s`, and
/// the zero point `z` (a whole number in 0..=255).
fn steps(lo: f32, hi: f32) -> (f32, f32, f32) {
    let s = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
    let inv = 1.0 / s;
    (s, inv, (-lo * inv).round().clamp(0.0, 255.0))
}

/// [`quantize`] of one row, 16 values at a time; returns its scale and zero point.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_row_avx512(row: &[f32], bytes: &mut [u8]) -> (f32, i32) {
    // SAFETY: as the caller promises: `row` and `bytes` are `row.len()` long, a multiple
    // of 16, so every load and store below is inside them.
    unsafe {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for c in row.chunks_exact(16) {
            let v = _mm512_loadu_ps(c.as_ptr());
            lo = _mm512_min_ps(lo, v);
            hi = _mm512_max_ps(hi, v);
        }
        let (s, inv, z) = steps(_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
        let (vinv, vz, top) = (_mm512_set1_ps(inv), _mm512_set1_ps(z), _mm512_set1_ps(255.0));
        let half = _mm512_set1_ps(0.5);
        for (c, b) in row.chunks_exact(16).zip(bytes.chunks_exact_mut(16)) {
            let v = _mm512_fmadd_ps(_mm512_loadu_ps(c.as_ptr()), vinv, vz);
            let v = _mm512_add_ps(_mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), top), half);
            _mm_storeu_si128(b.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
        }
        (s, z as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_is_near_the_f32_product() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: the int8 products are not checked");
            return;
        }
        let (out, inp) = (48, 36);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let packed = Packed::new(&w, out, inp);
        for n in [1, 3, 4, 5, 9] {
            let x: Vec<f32> = (0..n * inp)
                .map(|i| ((i * 104_729 % 997) as f32 / 400.0) - 1.2)
                .collect();
            let (mut got, mut scratch) = (Vec::new(), Scratch::default());
            packed.apply(&x, n, &mut got, &mut scratch, None);
            assert_eq!(got.len(), n * out);
            let session = Helper::begin();
            let mut two = Vec::new();
            packed.apply(&x, n, &mut two, &mut scratch, session.as_ref().map(|s| s.helper));
            assert_eq!(got, two, "two threads give the same product");
            for r in 0..n {
                for o in 0..out {
                    let want: f32 = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum();
                    let bound = 0.02 * (0..inp).map(|k| (x[r * inp + k] * w[o * inp + k]).abs()).sum::<f32>() + 1e-3;
                    assert!(
                        (got[r * out + o] - want).abs() <= bound,
                        "n {n}, row {r}, out {o}: {} against {want}",
                        got[r * out + o]
                    );
                }
            }
        }
    }

    #[test]
    fn a_zero_row_is_zero() {
        if !available() {
            return;
        }
        let packed = Packed::new(&[0.0; 16 * 4], 16, 4);
        let (mut got, mut scratch) = (Vec::new(), Scratch::default());
        packed.apply(&[0.0; 8], 2, &mut got, &mut scratch, None);
        assert_eq!(got, vec![0.0; 32]);
    }
}
