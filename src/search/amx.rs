//! The model's weight products on Intel AMX: `out = x · Wᵀ` with `W` in bfloat16, packed
//! once at load into the tiles' layout, `x` rounded to bfloat16 per product, sums in f32.
//!
//! Why: a 10-token request is about 106 M multiply-adds over 42 MB of f32 weights. On the
//! 2-core Xeon this project is measured on, AVX-512 FMA gives about 30 G multiply-adds a
//! second (10 ms a request with `matrixmultiply`, which also packs every weight on every
//! call), while AMX's bf16 tiles give about 1.6 T; the product then costs what reading
//! 21 MB of bf16 weights costs (about 26 GB/s here). BENCHMARKS.md ("Session 14") has the
//! figures, and what bf16 does to the vectors (cosine to the f32 vectors above 0.999) and
//! to recall.
//!
//! Used only where the CPU has AMX-TILE and AMX-BF16 and Linux grants the process the tile
//! state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, Linux 5.16 and later); anywhere else, and for
//! shapes that are not whole tiles, the model stays on f32 `matrixmultiply`.
//!
//! A tile register is per thread and nothing else in the process uses them (Rust emits no
//! AMX code of its own), so each product configures the tiles, runs, and releases them,
//! within one call on one thread.
#![allow(unsafe_code)]

use super::helper::{Helper, Job, Panels};

/// Rows of a tile: tokens are taken 16 at a time (padded with zero rows).
pub const ROWS: usize = 16;
/// bf16 values of `k` in one tile row (64 bytes).
const K_STEP: usize = 32;
/// Output columns of one pass: four f32 tiles of 16.
const PANEL: usize = 64;

/// Runs `tdpbf16ps` (bf16 pairs summed into f32) over panels `panels` of the packed B
/// (`b0`: by panel of 64 outputs, `chunks` steps of four 1 KiB tiles each), for `rows`
/// rows of A (`a0`, `stride_a` bytes a row, 64 bytes a step), into C (`c0`, `rows` ×
/// `out` f32 values, row-major).
///
/// # Safety
/// [`configure`] ran on this thread, and every byte named above is inside its
/// allocation.
#[allow(clippy::too_many_arguments)]
unsafe fn tiles(
    a0: *const u16,
    stride_a: usize,
    b0: *const Line,
    chunks: usize,
    c0: *mut f32,
    rows: usize,
    out: usize,
    panels: std::ops::Range<usize>,
) {
    // SAFETY: as the caller promises.
    unsafe {
        for p in panels {
            let b = b0.add(p * chunks * 4 * 16);
            for m in (0..rows).step_by(ROWS) {
                let a = a0.cast::<u8>().add(m * stride_a);
                let c = c0.add(m * out + p * PANEL);
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a} + {sa}*1]",
                    "tileloadd tmm5, [{b} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm5",
                    "tileloadd tmm6, [{b} + {sb}*1 + 1024]",
                    "tdpbf16ps tmm1, tmm4, tmm6",
                    "tileloadd tmm7, [{b} + {sb}*1 + 2048]",
                    "tdpbf16ps tmm2, tmm4, tmm7",
                    "tileloadd tmm5, [{b} + {sb}*1 + 3072]",
                    "tdpbf16ps tmm3, tmm4, tmm5",
                    "add {a}, 64",
                    "add {b}, 4096",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 64], tmm1",
                    "tilestored [{c} + {sc}*1 + 128], tmm2",
                    "tilestored [{c} + {sc}*1 + 192], tmm3",
                    a = inout(reg) a => _,
                    b = inout(reg) b => _,
                    n = inout(reg) chunks => _,
                    sa = in(reg) stride_a,
                    sb = in(reg) 64usize,
                    c = in(reg) c,
                    sc = in(reg) out * 4,
                    options(nostack),
                );
            }
        }
    }
}

/// Configures this thread's tiles for [`tiles`]: all eight 16 rows of 64 bytes.
///
/// # Safety
/// [`available`] said yes; [`release`] follows on this thread before any other AMX code.
unsafe fn configure() {
    let config = TileConfig::all_full();
    // SAFETY: as the caller promises; the configuration is 64 readable bytes.
    unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
}

/// Releases this thread's tiles.
///
/// # Safety
/// [`configure`] ran on this thread.
unsafe fn release() {
    // SAFETY: as the caller promises.
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

/// Whether this process may run AMX bf16 products (asked once).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if std::env::var_os("MCP_GATEWAY_SEARCH_NO_AMX").is_some() {
            return false;
        }
        detect()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    // CPUID leaf 7, subleaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf.edx & (1 << 22) == 0 || leaf.edx & (1 << 24) == 0 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with two integer arguments; it only changes which
    // register state the kernel lets this process use.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    r == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// Whether a product of `inp` inputs and `out` outputs is whole tiles.
pub fn fits(inp: usize, out: usize) -> bool {
    inp > 0 && out > 0 && inp.is_multiple_of(K_STEP) && out.is_multiple_of(PANEL)
}

/// 64 bytes, so a tile's rows start on cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line([u16; 32]);

/// `W` (`out` rows of `inp`, as stored) in bf16, in the order the product reads it: by
/// panel of 64 outputs, then by 32 inputs, then the panel's four tiles, each 16 rows of 16
/// outputs × 2 consecutive inputs (the layout `tdpbf16ps` takes for its second operand).
pub struct Packed {
    lines: Vec<Line>,
    inp: usize,
    out: usize,
}

/// f32 to bf16, rounding to nearest even (no NaN reaches here: the weights and
/// activations of a loaded model are finite).
#[inline(always)]
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

impl Packed {
    /// Packs `w` (`out` × `inp`, row-major); `fits(inp, out)` must hold.
    pub fn new(w: &[f32], out: usize, inp: usize) -> Packed {
        assert!(fits(inp, out) && w.len() == out * inp, "not whole tiles: {out}×{inp}");
        let mut lines = vec![Line([0; 32]); out * inp / 32];
        let chunks = inp / K_STEP;
        for j in 0..out {
            let (p, cb, c) = (j / PANEL, (j % PANEL) / 16, j % 16);
            for k in 0..inp {
                let (kc, r, e) = (k / K_STEP, (k % K_STEP) / 2, k % 2);
                let tile = (p * chunks + kc) * 4 + cb;
                lines[tile * 16 + r].0[c * 2 + e] = bf16(w[j * inp + k]);
            }
        }
        Packed { lines, inp, out }
    }

    /// `out = x · Wᵀ` for `rows` rows of `x` (`inp` wide, bf16, row-major), `rows` a
    /// multiple of [`ROWS`]; `out` gets `rows` × `self.out` f32 values, row-major. With a
    /// `helper`, its thread may take the second half of the panels.
    pub fn apply(&self, x: &[u16], rows: usize, out: &mut Vec<f32>, helper: Option<&Helper>) {
        assert!(
            rows.is_multiple_of(ROWS) && x.len() >= rows * self.inp && available(),
            "AMX product of {rows} rows"
        );
        // Every value is written by a tile store; only rows added since the last product
        // into this buffer get zeroed here.
        out.resize(rows * self.out, 0.0);
        let job = TileJob {
            a: x.as_ptr(),
            stride_a: self.inp * 2,
            b: self.lines.as_ptr(),
            chunks: self.inp / K_STEP,
            c: out.as_mut_ptr(),
            rows,
            out: self.out,
        };
        let panels = self.out / PANEL;
        match helper {
            // SAFETY: the job is made of the checked slices above (see `TileJob::run`),
            // which stay borrowed until `share` returns.
            Some(h) => unsafe { h.share(Job::new(&job, panels, panels.div_ceil(2))) },
            // SAFETY: as above.
            None => unsafe { job.run(0..panels) },
        }
    }
}

/// One product, as `Packed::apply` checked it: `a` has `rows` rows of `stride_a` bytes
/// (`chunks` steps of 64), `b` the packed weights' panels, `c` `rows × out` f32 values.
struct TileJob {
    a: *const u16,
    stride_a: usize,
    b: *const Line,
    chunks: usize,
    c: *mut f32,
    rows: usize,
    out: usize,
}

impl Panels for TileJob {
    /// Runs `panels` of the product on this thread (the buffers are as `Packed::apply`
    /// made them, and `available` said yes).
    unsafe fn run(&self, panels: std::ops::Range<usize>) {
        // SAFETY: as the caller promises; configure and release bracket the products.
        unsafe {
            configure();
            tiles(
                self.a,
                self.stride_a,
                self.b,
                self.chunks,
                self.c,
                self.rows,
                self.out,
                panels,
            );
            release();
        }
    }
}

/// The 64-byte tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn all_full() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            // bytes 16..48: each tile's bytes per row (u16); 48..64: its rows.
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            c[48 + t] = ROWS as u8;
        }
        TileConfig(c)
    }
}

/// `x` (`n` rows of `inp`) as bf16, padded with zero rows to a multiple of [`ROWS`];
/// returns the padded row count.
#[inline(always)]
pub fn rows_bf16(x: &[f32], n: usize, inp: usize, into: &mut Vec<u16>) -> usize {
    let rows = n.div_ceil(ROWS) * ROWS;
    into.clear();
    into.extend(x[..n * inp].iter().map(|v| bf16(*v)));
    into.resize(rows * inp, 0);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        assert_eq!(bf16(-2.0), 0xc000);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(1.0 + 1.5 / 256.0), 0x3f81);
    }

    /// The product matches f32 arithmetic on the same bf16 values, for more rows than one
    /// tile and more than one panel.
    #[test]
    fn the_product_is_the_f32_product_of_the_bf16_values() {
        if !available() {
            eprintln!("no AMX here: skipped");
            return;
        }
        let (out_n, inp, n) = (128, 96, 21);
        let wv = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 250.0;
        let w: Vec<f32> = (0..out_n * inp).map(wv).collect();
        let x: Vec<f32> = (0..n * inp).map(|i| wv(i * 31 + 3) * 0.5).collect();
        let packed = Packed::new(&w, out_n, inp);
        let mut xb = Vec::new();
        let rows = rows_bf16(&x, n, inp, &mut xb);
        assert_eq!(rows, 32);
        let mut got = Vec::new();
        packed.apply(&xb, rows, &mut got, None);
        let session = Helper::begin();
        let mut two = Vec::new();
        packed.apply(&xb, rows, &mut two, session.as_ref().map(|s| s.helper));
        assert_eq!(got, two, "two threads give the same product");
        assert_eq!(got.len(), rows * out_n);
        let back = |b: u16| f32::from_bits(u32::from(b) << 16);
        for t in 0..rows {
            for j in 0..out_n {
                let want: f32 = if t < n {
                    (0..inp)
                        .map(|k| back(xb[t * inp + k]) * back(bf16(w[j * inp + k])))
                        .sum()
                } else {
                    0.0
                };
                let g = got[t * out_n + j];
                assert!(
                    (g - want).abs() <= 1e-3 * (1.0 + want.abs()),
                    "[{t}][{j}]: {g} vs {want}"
                );
            }
        }
    }
}
