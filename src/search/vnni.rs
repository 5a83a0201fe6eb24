//! The model's weight products in int8 on AVX-512 VNNI, for CPUs without AMX: `out = x · Wᵀ`
//! with `W` quantized once at load (a scale per output), `x` quantized per row on each
//! product, sums in i32 (`vpdpbusd`: 64 multiply-adds an instruction, against 16 for an f32
//! FMA).
//!
//! Why: a cloud VM may hide AMX while showing AVX-512 VNNI (this project's 2-core VMs do,
//! some days: a Xeon of the same family with `amx_*` masked). There, the f32 products took a
//! 10-token request 12.5 ms with `matrixmultiply`, which also packs every weight on every
//! call; int8 weights are 10.6 MB instead of 42 MB, read once per product in the order
//! the kernel wants them. BENCHMARKS.md ("Session 16") has the figures and what int8 does
//! to the vectors and to recall.
//!
//! The quantization is symmetric: a weight row (one output) is `scale · q` with `q` in
//! −127..=127, and an input row is `s · (u − 128)` with `u` in 1..=255 (`vpdpbusd` takes
//! unsigned × signed bytes); the product's `128 · Σq` is taken off per output.
#![allow(unsafe_code)]

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
    /// Per output: the weight row's scale, and `128 · Σq` (what the inputs' offset adds).
    scale: Vec<f32>,
    offset: Vec<i32>,
    inp: usize,
    out: usize,
}

/// Where [`Packed::apply`] keeps an input's bytes and row scales between products.
#[derive(Default)]
pub struct Scratch {
    bytes: Vec<u8>,
    scales: Vec<f32>,
}

impl Packed {
    /// Quantizes and packs `w` (`out` × `inp`, row-major); `fits(inp, out)` must hold.
    pub fn new(w: &[f32], out: usize, inp: usize) -> Packed {
        assert!(fits(inp, out) && w.len() == out * inp, "not whole vectors: {out}×{inp}");
        let steps = inp / K_STEP;
        let mut q = vec![0i8; out * inp];
        let mut scale = vec![0f32; out];
        let mut offset = vec![0i32; out];
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
            offset[o] = 128 * sum;
        }
        Packed {
            q,
            scale,
            offset,
            inp,
            out,
        }
    }

    /// `out = x · Wᵀ` for `n` rows of `x` (`inp` wide, row-major); `out` gets `n × self.out`
    /// values, row-major. [`available`] must hold.
    pub fn apply(&self, x: &[f32], n: usize, out: &mut Vec<f32>, scratch: &mut Scratch) {
        assert!(x.len() >= n * self.inp && available(), "int8 product of {n} rows");
        quantize(&x[..n * self.inp], self.inp, scratch);
        out.resize(n * self.out, 0.0);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F, BW and VNNI (`available`); `scratch` holds `n` rows
        // of `inp` bytes and `n` scales, `out` `n × self.out` values, `self.q` the packed
        // `self.out × self.inp` weights (checked in `new`); `block` reads and writes only
        // inside them.
        unsafe {
            self.products(&scratch.bytes, &scratch.scales, n, out);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn products(&self, x: &[u8], scales: &[f32], n: usize, out: &mut [f32]) {
        let panels = self.out / LANES;
        // Panels outside, rows inside: each panel's weights (at most 96 KiB) are read
        // from memory once and stay in cache for every row.
        let mut p = 0;
        while p < panels {
            let np = (panels - p).min(BLOCK_PANELS);
            let mut m = 0;
            while m < n {
                let rows = (n - m).min(BLOCK_ROWS);
                // SAFETY: as `apply` promises; `rows` rows from `m` and `np` panels from `p`
                // are inside the product.
                unsafe {
                    match (rows, np) {
                        (4, 4) => self.block::<4, 4>(x, scales, m, p, out),
                        (3, 4) => self.block::<3, 4>(x, scales, m, p, out),
                        (2, 4) => self.block::<2, 4>(x, scales, m, p, out),
                        (1, 4) => self.block::<1, 4>(x, scales, m, p, out),
                        _ => {
                            for j in p..p + np {
                                for r in m..m + rows {
                                    self.block::<1, 1>(x, scales, r, j, out);
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
    unsafe fn block<const R: usize, const P: usize>(
        &self,
        x: &[u8],
        scales: &[f32],
        m: usize,
        p: usize,
        out: &mut [f32],
    ) {
        let steps = self.inp / K_STEP;
        let (w, x) = (self.q.as_ptr(), x.as_ptr());
        // SAFETY: as `products` promises: the panels `p..p + P` hold `steps` vectors of 64
        // bytes each, the rows `m..m + R` `inp` bytes each, and the outputs are in `out`.
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            for s in 0..steps {
                let mut wv = [_mm512_setzero_si512(); P];
                for (j, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(w.add(((p + j) * steps + s) * 64).cast());
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_epi32(x.add((m + r) * self.inp + s * K_STEP).cast::<i32>().read_unaligned());
                    for (acc, v) in acc.iter_mut().zip(&wv) {
                        *acc = _mm512_dpbusd_epi32(*acc, a, *v);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let s = _mm512_set1_ps(scales[m + r]);
                for (j, acc) in acc.iter().enumerate() {
                    let o = (p + j) * LANES;
                    let sums = _mm512_sub_epi32(*acc, _mm512_loadu_si512(self.offset.as_ptr().add(o).cast()));
                    let v = _mm512_mul_ps(
                        _mm512_cvtepi32_ps(sums),
                        _mm512_mul_ps(_mm512_loadu_ps(self.scale.as_ptr().add(o)), s),
                    );
                    _mm512_storeu_ps(out.as_mut_ptr().add((m + r) * self.out + o), v);
                }
            }
        }
    }
}

/// Each `inp`-wide row of `x` as `s · (u − 128)`: the bytes `u` and the scales `s`.
fn quantize(x: &[f32], inp: usize, scratch: &mut Scratch) {
    scratch.bytes.clear();
    scratch.scales.clear();
    for row in x.chunks_exact(inp) {
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = if max > 0.0 { max / 127.0 } else { 1.0 };
        let inv = 1.0 / s;
        scratch.scales.push(s);
        scratch.bytes.extend(
            row.iter()
                .map(|v| ((v * inv).round().clamp(-127.0, 127.0) as i32 + 128) as u8),
        );
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
            packed.apply(&x, n, &mut got, &mut scratch);
            assert_eq!(got.len(), n * out);
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
        packed.apply(&[0.0; 8], 2, &mut got, &mut scratch);
        assert_eq!(got, vec![0.0; 32]);
    }
}
