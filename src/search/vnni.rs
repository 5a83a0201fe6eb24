//! The model's weight products in int8 on AVX-512 VNNI, for CPUs without AMX: `out = x · Wᵀ`
//! with `W` quantized once at load (a scale per output), `x` quantized per row on each
//! product, sums in i32 (`vpdpbusd`: 64 multiply-adds an instruction, against 16 for an f32
//! FMA). On a CPU with AVX2 and no AVX-512 (AMD EPYC before Zen 4, most laptops) the same
//! packed weights run through `vpmaddubsw` (32 multiply-adds of bytes an instruction, their
//! pairs summed in 16 bits) and `vpmaddwd` by ones (the pairs summed in 32 bits):
//! [`Kernel::Avx2`]. A pair of products must fit in 16 bits, so there a weight takes
//! −64..=64, not −127..=127 (`2 · 255 · 64 < 2¹⁵`): inputs keep their 255 steps, since a
//! row's outliers (BERT has a few features far from the rest) leave its other values few.
//!
//! Why: a cloud VM may hide AMX while showing AVX-512 VNNI (this project's 2-core VMs do,
//! some days: a Xeon of the same family with `amx_*` masked). There, the f32 products took a
//! 10-token request 12.5 ms with `matrixmultiply`, which also packs every weight on every
//! call; int8 weights are 10.6 MB instead of 42 MB, read once per product in the order
//! the kernel wants them. A search's request shares each product with the process's helper
//! thread ([`super::helper`]), as on AMX. BENCHMARKS.md ("Session 16", and "Session 21" for
//! AVX2) has the figures and what int8 does to the vectors (cosine to f32 0.998–0.999 on
//! VNNI, 0.995–0.998 on AVX2) and to recall (the same, one request less at most).
//!
//! A weight row (one output) is `scale · q` with `q` in −127..=127 (−64..=64 on AVX2); an
//! input row is `s · (u − z)` with `u` in 0..=255, `s` and `z` set by the row's least and
//! greatest values (`vpdpbusd` takes unsigned × signed bytes; a row after GELU is mostly on
//! one side of 0, so this keeps twice the steps of a scale symmetric about 0); `z · Σq` is
//! taken off each output's sum.
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
/// Rows of `x` in one block of sums on AVX2 (2 accumulators a row, of 16).
const AVX2_ROWS: usize = 4;

/// Which instructions run the int8 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 F, BW and VNNI: `vpdpbusd` on bytes.
    Vnni,
    /// AVX2 and FMA: `vpmaddubsw` then `vpmaddwd`, weights in −64..=64.
    Avx2,
}

/// Whether this CPU runs the int8 products: AVX-512 VNNI or AVX2.
pub fn available() -> bool {
    kernel().is_some()
}

/// The fastest kernel this CPU has, if any (`MCP_GATEWAY_SEARCH_AVX2=1` takes AVX2 where
/// VNNI is there too, to compare them).
pub fn kernel() -> Option<Kernel> {
    static K: std::sync::OnceLock<Option<Kernel>> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let avx2 = has(Kernel::Avx2);
        if has(Kernel::Vnni) && !(avx2 && std::env::var_os("MCP_GATEWAY_SEARCH_AVX2").is_some()) {
            Some(Kernel::Vnni)
        } else if avx2 {
            Some(Kernel::Avx2)
        } else {
            None
        }
    })
}

/// Whether this CPU has what `kernel` needs.
#[cfg(target_arch = "x86_64")]
pub fn has(kernel: Kernel) -> bool {
    match kernel {
        Kernel::Vnni => {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn has(_: Kernel) -> bool {
    false
}

/// Whether a product of `inp` inputs and `out` outputs is whole steps and vectors.
pub fn fits(inp: usize, out: usize) -> bool {
    inp > 0 && out > 0 && inp.is_multiple_of(K_STEP) && out.is_multiple_of(LANES)
}

/// `W` (`out` rows of `inp`, as stored) in int8, in the order the product reads it: by
/// vector of 16 outputs, then by 4 inputs, each 64 bytes (output-major, 4 inputs each).
pub struct Packed {
    /// The kernel the weights were packed for (their range is its own).
    kernel: Kernel,
    q: Vec<i8>,
    /// Per output: the weight row's scale, and `Σq` (what an input's zero point adds, times it).
    scale: Vec<f32>,
    sums: Vec<i32>,
    inp: usize,
    out: usize,
}

/// What [`Packed::apply`] does to each output after its sum, on the thread that made it:
/// adds `bias` (one per output), then `plus` (as long as the output: a residual), then
/// applies GELU.
#[derive(Clone, Copy)]
pub struct Finish<'a> {
    pub bias: &'a [f32],
    pub plus: Option<&'a [f32]>,
    pub gelu: bool,
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
    /// Quantizes and packs `w` (`out` × `inp`, row-major) for this CPU's kernel;
    /// `fits(inp, out)` and [`available`] must hold.
    pub fn new(w: &[f32], out: usize, inp: usize) -> Packed {
        Packed::new_for(kernel().expect("int8 products on a CPU without AVX2"), w, out, inp)
    }

    /// [`Packed::new`] for `kernel`, which the CPU must have to [`Packed::apply`] them.
    pub fn new_for(kernel: Kernel, w: &[f32], out: usize, inp: usize) -> Packed {
        assert!(fits(inp, out) && w.len() == out * inp, "not whole vectors: {out}×{inp}");
        let top = match kernel {
            Kernel::Vnni => 127.0,
            Kernel::Avx2 => 64.0,
        };
        let steps = inp / K_STEP;
        let mut q = vec![0i8; out * inp];
        let mut scale = vec![0f32; out];
        let mut sums = vec![0i32; out];
        for (o, row) in w.chunks_exact(inp).enumerate() {
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = if max > 0.0 { max / top } else { 1.0 };
            scale[o] = s;
            let (panel, lane) = (o / LANES, o % LANES);
            let mut sum = 0i32;
            for (k, v) in row.iter().enumerate() {
                let v = (v / s).round().clamp(-top, top) as i8;
                sum += i32::from(v);
                q[((panel * steps + k / K_STEP) * LANES + lane) * K_STEP + k % K_STEP] = v;
            }
            sums[o] = sum;
        }
        Packed {
            kernel,
            q,
            scale,
            sums,
            inp,
            out,
        }
    }

    /// `out = x · Wᵀ` for `n` rows of `x` (`inp` wide, row-major); `out` gets `n × self.out`
    /// values, row-major, each finished as `finish` says. The CPU must have the weights'
    /// kernel ([`has`]). With a `helper`, its thread may take some of the output
    /// vectors.
    pub fn apply(
        &self,
        x: &[f32],
        n: usize,
        out: &mut Vec<f32>,
        scratch: &mut Scratch,
        helper: Option<&Helper>,
        finish: Finish<'_>,
    ) {
        let kernel = self.kernel;
        assert!(x.len() >= n * self.inp && has(kernel), "int8 product of {n} rows");
        assert!(
            finish.bias.len() == self.out && finish.plus.is_none_or(|p| p.len() >= n * self.out),
            "a product's bias or residual is short"
        );
        quantize(&x[..n * self.inp], self.inp, scratch, kernel);
        out.resize(n * self.out, 0.0);
        let job = Product {
            packed: self,
            kernel,
            x: scratch.bytes.as_ptr(),
            scales: scratch.scales.as_ptr(),
            zeros: scratch.zeros.as_ptr(),
            n,
            out: out.as_mut_ptr(),
            bias: finish.bias.as_ptr(),
            plus: finish.plus.map_or(std::ptr::null(), <[f32]>::as_ptr),
            gelu: finish.gelu,
        };
        let panels = self.out / LANES;
        // Chunks of a few microseconds: VNNI's blocks of panels, two panels on AVX2.
        let chunk = match kernel {
            Kernel::Vnni => BLOCK_PANELS,
            Kernel::Avx2 => 2,
        };
        match helper {
            // SAFETY: `job` is made of the checked buffers above, which stay borrowed until
            // `share` returns.
            Some(h) => unsafe { h.share(Job::new(&job, panels, chunk)) },
            // SAFETY: as above.
            None => unsafe { job.run(0..panels) },
        }
    }
}

/// One product, as [`Packed::apply_with`] checked it: `x` has `n` rows of `packed.inp`
/// bytes, `scales` and `zeros`
/// `n` values, `out` room for `n × packed.out` values; the CPU has `kernel`.
struct Product<'a> {
    packed: &'a Packed,
    kernel: Kernel,
    x: *const u8,
    scales: *const f32,
    zeros: *const i32,
    n: usize,
    out: *mut f32,
    /// [`Finish`]'s: `packed.out` biases, and (unless null) `n × packed.out` residuals.
    bias: *const f32,
    plus: *const f32,
    gelu: bool,
}

impl Panels for Product<'_> {
    /// Runs the output vectors `panels` of the product on this thread (the buffers are as
    /// `Packed::apply` made them, and [`available`] said yes).
    unsafe fn run(&self, panels: Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the caller promises.
        unsafe {
            match self.kernel {
                Kernel::Vnni => self.products(panels),
                Kernel::Avx2 => self.products_avx2(panels),
            }
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
            // SAFETY: as `run` promises; these panels' sums are all stored.
            unsafe { self.finish(p..p + np) };
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

impl Product<'_> {
    /// [`Product::products`] on AVX2: the same panels, four rows at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn products_avx2(&self, panels: Range<usize>) {
        for p in panels {
            let mut m = 0;
            while m < self.n {
                let rows = (self.n - m).min(AVX2_ROWS);
                // SAFETY: as `run` promises; `rows` rows from `m` and the panel `p` are inside
                // the product.
                unsafe {
                    match rows {
                        4 => self.block_avx2::<4>(m, p),
                        3 => self.block_avx2::<3>(m, p),
                        2 => self.block_avx2::<2>(m, p),
                        _ => self.block_avx2::<1>(m, p),
                    }
                }
                m += rows;
            }
            // SAFETY: as `run` promises; this panel's sums are all stored.
            unsafe { self.finish(p..p + 1) };
        }
    }

    /// [`Finish`] of the outputs of `panels`, for every row, once their sums are stored:
    /// inlined into each kernel, so its loops run as wide as the kernel's vectors.
    ///
    /// # Safety
    /// As [`Panels::run`]: the panels are inside the product, and this thread has them.
    #[inline(always)]
    unsafe fn finish(&self, panels: Range<usize>) {
        let (width, at) = (self.packed.out, panels.start * LANES);
        let len = panels.len() * LANES;
        // SAFETY: as the caller promises: `bias` has `width` values, and `out` (and `plus`,
        // unless null) `n × width`; these outputs are this thread's alone.
        unsafe {
            let bias = std::slice::from_raw_parts(self.bias.add(at), len);
            for r in 0..self.n {
                let o = std::slice::from_raw_parts_mut(self.out.add(r * width + at), len);
                for (o, b) in o.iter_mut().zip(bias) {
                    *o += b;
                }
                if !self.plus.is_null() {
                    let plus = std::slice::from_raw_parts(self.plus.add(r * width + at), len);
                    for (o, p) in o.iter_mut().zip(plus) {
                        *o += p;
                    }
                }
                if self.gelu {
                    super::model::gelu_all(o);
                }
            }
        }
    }

    /// The sums of rows `m..m + R` and the 16 outputs of panel `p`, on AVX2. A 32-byte half
    /// of a packed step is 8 outputs × 4 inputs; `vpmaddubsw` with the row's 4 input bytes
    /// (repeated) gives each output's sums of inputs 0–1 and 2–3 in two 16-bit lanes, and
    /// `vpmaddwd` by ones adds them into the output's 32-bit lane, in order.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block_avx2<const R: usize>(&self, m: usize, p: usize) {
        let w8 = self.packed;
        let (inp, steps) = (w8.inp, w8.inp / K_STEP);
        let (w, x) = (w8.q.as_ptr(), self.x);
        // SAFETY: as `products_avx2` promises: panel `p` holds `steps` vectors of 64 bytes
        // (weights in −64..=64, so a pair's sum fits 16 bits), the rows `m..m + R` `inp`
        // bytes each, and their outputs are in `out`.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let panel = w.add(p * steps * 64);
            for s in 0..steps {
                let w0 = _mm256_loadu_si256(panel.add(s * 64).cast());
                let w1 = _mm256_loadu_si256(panel.add(s * 64 + 32).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_set1_epi32(x.add((m + r) * inp + s * K_STEP).cast::<i32>().read_unaligned());
                    let lo = _mm256_madd_epi16(_mm256_maddubs_epi16(a, w0), ones);
                    let hi = _mm256_madd_epi16(_mm256_maddubs_epi16(a, w1), ones);
                    acc[0] = _mm256_add_epi32(acc[0], lo);
                    acc[1] = _mm256_add_epi32(acc[1], hi);
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let s = _mm256_set1_ps(*self.scales.add(m + r));
                let z = _mm256_set1_epi32(*self.zeros.add(m + r));
                for (half, acc) in acc.iter().enumerate() {
                    let o = p * LANES + half * 8;
                    let q = _mm256_loadu_si256(w8.sums.as_ptr().add(o).cast());
                    let sums = _mm256_sub_epi32(*acc, _mm256_mullo_epi32(q, z));
                    let v = _mm256_mul_ps(
                        _mm256_cvtepi32_ps(sums),
                        _mm256_mul_ps(_mm256_loadu_ps(w8.scale.as_ptr().add(o)), s),
                    );
                    _mm256_storeu_ps(self.out.add((m + r) * w8.out + o), v);
                }
            }
        }
    }
}

/// Each `inp`-wide row of `x` as `s · (u − z)`: the bytes `u`, the scales `s` and the zero
/// points `z`.
fn quantize(x: &[f32], inp: usize, scratch: &mut Scratch, kernel: Kernel) {
    scratch.bytes.clear();
    scratch.scales.clear();
    scratch.zeros.clear();
    scratch.bytes.resize(x.len(), 0);
    for (row, bytes) in x.chunks_exact(inp).zip(scratch.bytes.chunks_exact_mut(inp)) {
        #[cfg(target_arch = "x86_64")]
        if inp.is_multiple_of(16) && kernel == Kernel::Vnni && has(Kernel::Vnni) {
            // SAFETY: the CPU has AVX-512 F and BW, and the row's length is whole vectors
            // of 16.
            let (s, z) = unsafe { quantize_row_avx512(row, bytes) };
            scratch.scales.push(s);
            scratch.zeros.push(z);
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if inp.is_multiple_of(8) && kernel == Kernel::Avx2 && has(Kernel::Avx2) {
            // SAFETY: the CPU has AVX2 and FMA, and the row's length is whole vectors of 8.
            let (s, z) = unsafe { quantize_row_avx2(row, bytes) };
            scratch.scales.push(s);
            scratch.zeros.push(z);
            continue;
        }
        let (s, z) = quantize_row(row, bytes);
        scratch.scales.push(s);
        scratch.zeros.push(z);
    }
}

/// [`quantize`] of one row, one value at a time; returns its scale and zero point.
fn quantize_row(row: &[f32], bytes: &mut [u8]) -> (f32, i32) {
    let (lo, hi) = row.iter().fold((0f32, 0f32), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let (s, inv, z) = steps(lo, hi);
    for (b, v) in bytes.iter_mut().zip(row) {
        // Non-negative once clamped: adding ½ and truncating rounds to nearest.
        *b = ((v * inv + z).clamp(0.0, 255.0) + 0.5) as u8;
    }
    (s, z as i32)
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

/// [`quantize`] of one row, 8 values at a time, rounded as
/// [`quantize_row_avx512`] rounds; returns its scale and zero point.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(row: &[f32], bytes: &mut [u8]) -> (f32, i32) {
    // SAFETY: as the caller promises: `row` and `bytes` are `row.len()` long, a multiple
    // of 8, so every load and store below is inside them.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in row.chunks_exact(8) {
            let v = _mm256_loadu_ps(c.as_ptr());
            lo = _mm256_min_ps(lo, v);
            hi = _mm256_max_ps(hi, v);
        }
        let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(l.as_mut_ptr(), lo);
        _mm256_storeu_ps(h.as_mut_ptr(), hi);
        let lo = l.iter().fold(0f32, |m, v| m.min(*v));
        let hi = h.iter().fold(0f32, |m, v| m.max(*v));
        let (s, inv, z) = steps(lo, hi);
        let (vinv, vz, top) = (_mm256_set1_ps(inv), _mm256_set1_ps(z), _mm256_set1_ps(255.0));
        let half = _mm256_set1_ps(0.5);
        for (c, b) in row.chunks_exact(8).zip(bytes.chunks_exact_mut(8)) {
            let v = _mm256_fmadd_ps(_mm256_loadu_ps(c.as_ptr()), vinv, vz);
            let v = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), top), half);
            // 8 values in 0..=255: as words [0..4 0..4 | 4..8 4..8], as bytes [0..4 × 4 |
            // 4..8 × 4], then the two halves' first four.
            let v = _mm256_packus_epi32(_mm256_cvttps_epi32(v), _mm256_setzero_si256());
            let v = _mm256_packus_epi16(v, _mm256_setzero_si256());
            let v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
            _mm_storel_epi64(b.as_mut_ptr().cast(), _mm256_castsi256_si128(v));
        }
        (s, z as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_is_near_the_f32_product() {
        let kernels: Vec<Kernel> = [Kernel::Vnni, Kernel::Avx2].into_iter().filter(|&k| has(k)).collect();
        if kernels.is_empty() {
            eprintln!("neither AVX-512 VNNI nor AVX2 here: the int8 products are not checked");
            return;
        }
        // 36 inputs are quantized one at a time, 64 by vectors.
        for (out, inp) in [(48, 36), (32, 64)] {
            let w: Vec<f32> = (0..out * inp)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            for &kernel in &kernels {
                let packed = Packed::new_for(kernel, &w, out, inp);
                for n in [1, 3, 4, 5, 9] {
                    let x: Vec<f32> = (0..n * inp)
                        .map(|i| ((i * 104_729 % 997) as f32 / 400.0) - 1.2)
                        .collect();
                    let bias: Vec<f32> = (0..out).map(|o| o as f32 / 100.0).collect();
                    let plus: Vec<f32> = (0..n * out).map(|i| (i % 7) as f32 / 10.0).collect();
                    let finish = Finish {
                        bias: &bias,
                        plus: Some(&plus),
                        gelu: false,
                    };
                    let (mut got, mut scratch) = (Vec::new(), Scratch::default());
                    packed.apply(&x, n, &mut got, &mut scratch, None, finish);
                    assert_eq!(got.len(), n * out);
                    let session = Helper::begin();
                    let mut two = Vec::new();
                    packed.apply(
                        &x,
                        n,
                        &mut two,
                        &mut scratch,
                        session.as_ref().map(|s| s.helper),
                        finish,
                    );
                    assert_eq!(got, two, "{kernel:?}: two threads give the same product");
                    let mut gelu = Vec::new();
                    let finish = Finish { gelu: true, ..finish };
                    packed.apply(&x, n, &mut gelu, &mut scratch, None, finish);
                    super::super::model::gelu_all(&mut two);
                    assert_eq!(gelu, two, "{kernel:?}: GELU after the sums");
                    for r in 0..n {
                        for o in 0..out {
                            let want: f32 = (0..inp).map(|k| x[r * inp + k] * w[o * inp + k]).sum::<f32>()
                                + bias[o]
                                + plus[r * out + o];
                            let bound =
                                0.02 * (0..inp).map(|k| (x[r * inp + k] * w[o * inp + k]).abs()).sum::<f32>() + 1e-3;
                            assert!(
                                (got[r * out + o] - want).abs() <= bound,
                                "{kernel:?}, {inp} inputs, n {n}, row {r}, out {o}: {} against {want}",
                                got[r * out + o]
                            );
                        }
                    }
                }
            }
        }
    }

    /// The vector loops quantize a row to the bytes, scale and zero point the plain one
    /// gives, extremes and all.
    #[test]
    fn rows_are_quantized_as_the_plain_loop_quantizes_them() {
        let rows: [Vec<f32>; 4] = [
            (0..64).map(|i| ((i * 37 % 61) as f32 / 7.0) - 3.0).collect(),
            (0..64).map(|i| i as f32 / 10.0).collect(),
            (0..64).map(|i| -(i as f32) * 1e-3).collect(),
            vec![0.0; 64],
        ];
        for kernel in [Kernel::Vnni, Kernel::Avx2].into_iter().filter(|&k| has(k)) {
            for row in &rows {
                let mut scratch = Scratch::default();
                quantize(row, row.len(), &mut scratch, kernel);
                let mut plain = vec![0u8; row.len()];
                let (s, z) = quantize_row(row, &mut plain);
                assert_eq!(scratch.bytes, plain, "{kernel:?}");
                assert_eq!((scratch.scales[0], scratch.zeros[0]), (s, z), "{kernel:?}");
            }
        }
    }

    #[test]
    fn a_zero_row_is_zero() {
        for kernel in [Kernel::Vnni, Kernel::Avx2].into_iter().filter(|&k| has(k)) {
            let packed = Packed::new_for(kernel, &[0.0; 16 * 4], 16, 4);
            let (mut got, mut scratch) = (Vec::new(), Scratch::default());
            let finish = Finish {
                bias: &[0.0; 16],
                plus: None,
                gelu: false,
            };
            packed.apply(&[0.0; 8], 2, &mut got, &mut scratch, None, finish);
            assert_eq!(got, vec![0.0; 32]);
        }
    }
}
