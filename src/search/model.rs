//! A sentence encoder for tool search: a BERT model in the layout sentence-transformers
//! saves (all-MiniLM-L6-v2 is the one the tests and BENCHMARKS.md use), run on the CPU.
//!
//! The operator points `[gateway] search_model` at the model's folder:
//! - `config.json`: a `bert` model (`hidden_size`, `num_attention_heads`,
//!   `num_hidden_layers`, `intermediate_size`, `layer_norm_eps`, `hidden_act = "gelu"`), or an
//!   `mpnet` one (all-mpnet-base-v2: the same layers, no token types, positions from
//!   `pad_token_id + 1`, and a learned bias per head and relative position bucket added to
//!   every layer's attention scores, `relative_attention_num_buckets`);
//! - `model.safetensors`: its weights, in float32, float16 or bfloat16, with or without the
//!   `bert.` prefix;
//! - `tokenizer.json` (or `vocab.txt` with `tokenizer_config.json`'s `do_lower_case`);
//! - optionally `sentence_bert_config.json` (`max_seq_length`, else 256),
//!   `1_Pooling/config.json` (mean pooling unless it says CLS) and
//!   `config_sentence_transformers.json`, whose `prompts` (e5's `"query": "query: "`,
//!   `"passage": "passage: "`; an instruction before requests) are put before a search's
//!   request (`query`) and before each tool's text (`document`, else `passage`).
//!
//! A text's vector is the pooled last layer, normalized to length 1, so a dot product is the
//! cosine. No weights are fetched at run time: the folder is read once, when the config
//! names it, and any missing or malformed part is an error naming the file.
//!
//! The arithmetic is the model's own, one sequence at a time, so there is no attention
//! mask; GELU with `erf` as BERT defines it. The weight products ([`Products`]) run on AMX
//! in bf16 where the CPU has it ([`super::amx`]: about 10× faster, cosine to the f32
//! vectors above 0.9995), else in int8 on AVX-512 VNNI or AVX2, where it has one of those
//! ([`super::vnni`]), else in f32 by `matrixmultiply`. The rest (norms, attention, GELU)
//! is plain loops, compiled for AVX-512 or AVX2 as well.

use super::wordpiece::WordPiece;
use serde::Deserialize;
use std::path::Path;

/// The most tokens of a search's request the model reads: a request in words is a small
/// part of it, and a request the size `gateway__search_tools` allows (2,048 bytes) would
/// otherwise cost a search 256 tokens' worth (tens of milliseconds of CPU; BENCHMARKS.md).
pub const QUERY_TOKENS: usize = 64;

/// A loaded sentence encoder.
pub struct Model {
    tokenizer: WordPiece,
    dim: usize,
    heads: usize,
    eps: f32,
    max_tokens: usize,
    cls_pooling: bool,
    /// Put before a search's request ([`Model::embed_now`]) and before a tool's text
    /// ([`Model::embed_document`]): the model's own `prompts`, empty for most.
    query_prompt: String,
    document_prompt: String,
    word: Vec<f32>,
    position: Vec<f32>,
    /// The first token type's vector (a single sequence has only that type); zeros for
    /// MPNet, which has none.
    token_type: Vec<f32>,
    /// The first position's row: 0 for BERT, `pad_token_id + 1` for MPNet.
    position_offset: usize,
    /// MPNet's attention bias: `buckets × heads`, by relative position bucket; empty for BERT.
    relative_bias: Vec<f32>,
    relative_buckets: usize,
    embed_norm: Norm,
    layers: Vec<Layer>,
    /// Where it was read from, for `/status` and errors.
    pub path: String,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("dim", &self.dim)
            .field("layers", &self.layers.len())
            .finish_non_exhaustive()
    }
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

/// `y = x · Wᵀ + b`, with `W` as stored: `out` rows of `inp` columns.
struct Linear {
    /// The weights in f32; empty once packed for AMX or VNNI.
    w: Vec<f32>,
    /// The weights in bf16 for AMX, where the CPU has it (see [`super::amx`]).
    packed: Option<super::amx::Packed>,
    /// The weights in int8 for AVX-512 VNNI or AVX2, where the CPU has one and not AMX
    /// (see [`super::vnni`]).
    int8: Option<super::vnni::Packed>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
}

struct Layer {
    /// Query, key and value in one product: `3 · dim` outputs.
    qkv: Linear,
    attn_out: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    model_type: Option<String>,
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f32,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    vocab_size: usize,
    /// MPNet's: positions start after it.
    #[serde(default)]
    pad_token_id: Option<usize>,
    /// MPNet's: how many relative position buckets its attention bias has.
    #[serde(default)]
    relative_attention_num_buckets: Option<usize>,
}

fn default_eps() -> f32 {
    1e-12
}

fn default_positions() -> usize {
    512
}

/// The JSON file `name` of the folder, if it has one.
fn optional<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// How a model's weight products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    F32,
    /// int8 on AVX-512 VNNI or AVX2 ([`super::vnni`]).
    Int8,
    /// bf16 on AMX tiles ([`super::amx`]).
    Amx,
}

impl Products {
    /// The fastest this CPU has: AMX, else VNNI, else f32 (`MCP_GATEWAY_SEARCH_NO_AMX`
    /// rules out the first, `MCP_GATEWAY_SEARCH_F32` both).
    pub fn best() -> Products {
        if std::env::var_os("MCP_GATEWAY_SEARCH_F32").is_some() {
            Products::F32
        } else if super::amx::available() {
            Products::Amx
        } else if super::vnni::available() {
            Products::Int8
        } else {
            Products::F32
        }
    }
}

impl Model {
    /// Reads the model in `dir`; its products run the fastest way this CPU has
    /// ([`Products::best`]).
    pub fn load(dir: &Path) -> Result<Model, String> {
        Model::load_with(dir, Products::best())
    }

    /// Reads the model in `dir`, its products as `products` says (AMX and int8 only where
    /// [`super::amx::available`] and [`super::vnni::available`] allow them: elsewhere f32).
    pub fn load_with(dir: &Path, products: Products) -> Result<Model, String> {
        let file = |name: &str| dir.join(name);
        let read =
            |name: &str| std::fs::read_to_string(file(name)).map_err(|e| format!("{}: {e}", file(name).display()));
        let config: Config = serde_json::from_str(&read("config.json")?)
            .map_err(|e| format!("{}: {e}", file("config.json").display()))?;
        let config_err = |what: String| format!("{}: {what}", file("config.json").display());
        let mpnet = config.model_type.as_deref() == Some("mpnet");
        if let Some(t) = config.model_type.as_deref().filter(|t| *t != "bert" && !mpnet) {
            return Err(config_err(format!(
                "model_type is {t:?}; only \"bert\" and \"mpnet\" models are read"
            )));
        }
        if let Some(act) = config.hidden_act.as_deref().filter(|a| *a != "gelu") {
            return Err(config_err(format!("hidden_act is {act:?}; only \"gelu\" is read")));
        }
        let (dim, heads) = (config.hidden_size, config.num_attention_heads);
        let sizes = [
            config.num_hidden_layers,
            config.intermediate_size,
            config.vocab_size,
            config.max_position_embeddings,
        ];
        if sizes.contains(&0) {
            return Err(config_err(
                "num_hidden_layers, intermediate_size, vocab_size and max_position_embeddings must not be 0".into(),
            ));
        }
        if dim == 0 || heads == 0 || dim % heads != 0 {
            return Err(config_err(format!(
                "hidden_size {dim} is not a multiple of num_attention_heads {heads}"
            )));
        }
        let tokenizer = if file("tokenizer.json").exists() {
            WordPiece::from_tokenizer_json(&read("tokenizer.json")?)
                .map_err(|e| format!("{}: {e}", file("tokenizer.json").display()))?
        } else {
            #[derive(Deserialize)]
            struct TokenizerConfig {
                #[serde(default = "yes")]
                do_lower_case: bool,
            }
            fn yes() -> bool {
                true
            }
            let lowercase = optional::<TokenizerConfig>(dir, "tokenizer_config.json")?.is_none_or(|c| c.do_lower_case);
            WordPiece::from_vocab_txt(&read("vocab.txt")?, lowercase)
                .map_err(|e| format!("{}: {e}", file("vocab.txt").display()))?
        };
        #[derive(Deserialize)]
        struct Sbert {
            #[serde(default)]
            max_seq_length: Option<usize>,
        }
        let max_seq = optional::<Sbert>(dir, "sentence_bert_config.json")?.and_then(|c| c.max_seq_length);
        #[derive(Deserialize)]
        struct Pooling {
            #[serde(default)]
            pooling_mode_cls_token: bool,
        }
        let cls_pooling = optional::<Pooling>(dir, "1_Pooling/config.json")?.is_some_and(|c| c.pooling_mode_cls_token);
        #[derive(Deserialize, Default)]
        struct Prompts {
            #[serde(default)]
            query: Option<String>,
            #[serde(default)]
            document: Option<String>,
            #[serde(default)]
            passage: Option<String>,
        }
        #[derive(Deserialize)]
        struct SentenceTransformers {
            #[serde(default)]
            prompts: Option<Prompts>,
        }
        let prompts = optional::<SentenceTransformers>(dir, "config_sentence_transformers.json")?
            .and_then(|c| c.prompts)
            .unwrap_or_default();

        let path = file("model.safetensors");
        let opened = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let tensors =
            Tensors::parse(std::io::BufReader::new(opened)).map_err(|e| format!("{}: {e}", path.display()))?;
        let w = |name: &str, shape: &[usize]| tensors.get(name, shape).map_err(|e| format!("{}: {e}", path.display()));
        let norm = |p: &str| -> Result<Norm, String> {
            Ok(Norm {
                weight: w(&format!("{p}.weight"), &[dim])?,
                bias: w(&format!("{p}.bias"), &[dim])?,
            })
        };
        let linear = |p: &str, out: usize, inp: usize| -> Result<Linear, String> {
            Ok(Linear {
                w: w(&format!("{p}.weight"), &[out, inp])?,
                packed: None,
                int8: None,
                b: w(&format!("{p}.bias"), &[out])?,
                out,
                inp,
            })
        };
        let inter = config.intermediate_size;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            // MPNet names the same parts otherwise.
            let [query, key, value, attn_out, attn_norm] = if mpnet {
                [
                    "attention.attn.q",
                    "attention.attn.k",
                    "attention.attn.v",
                    "attention.attn.o",
                    "attention.LayerNorm",
                ]
            } else {
                [
                    "attention.self.query",
                    "attention.self.key",
                    "attention.self.value",
                    "attention.output.dense",
                    "attention.output.LayerNorm",
                ]
            };
            let (q, k, v) = (
                linear(&format!("{p}.{query}"), dim, dim)?,
                linear(&format!("{p}.{key}"), dim, dim)?,
                linear(&format!("{p}.{value}"), dim, dim)?,
            );
            let qkv = Linear {
                w: [q.w, k.w, v.w].concat(),
                packed: None,
                int8: None,
                b: [q.b, k.b, v.b].concat(),
                out: 3 * dim,
                inp: dim,
            };
            let mut layer = Layer {
                qkv,
                attn_out: linear(&format!("{p}.{attn_out}"), dim, dim)?,
                attn_norm: norm(&format!("{p}.{attn_norm}"))?,
                up: linear(&format!("{p}.intermediate.dense"), inter, dim)?,
                down: linear(&format!("{p}.output.dense"), dim, inter)?,
                out_norm: norm(&format!("{p}.output.LayerNorm"))?,
            };
            if products != Products::F32 {
                for l in [&mut layer.qkv, &mut layer.attn_out, &mut layer.up, &mut layer.down] {
                    l.pack(products);
                }
            }
            layers.push(layer);
        }
        let positions = config.max_position_embeddings;
        let (token_type, position_offset, relative_bias, relative_buckets) = if mpnet {
            let buckets = config.relative_attention_num_buckets.unwrap_or(32);
            let offset = config.pad_token_id.unwrap_or(1).saturating_add(1);
            if buckets < 4 || offset.saturating_add(2) > positions {
                return Err(config_err(format!(
                    "relative_attention_num_buckets is {buckets} (at least 4), or pad_token_id {} leaves no positions",
                    offset - 1
                )));
            }
            let bias = w("encoder.relative_attention_bias.weight", &[buckets, heads])?;
            (vec![0.0; dim], offset, bias, buckets)
        } else {
            let mut token_type = w("embeddings.token_type_embeddings.weight", &[0, dim])?;
            token_type.truncate(dim);
            (token_type, 0, Vec::new(), 0)
        };
        Ok(Model {
            tokenizer,
            dim,
            heads,
            eps: config.layer_norm_eps,
            max_tokens: max_seq.unwrap_or(256).clamp(2, positions - position_offset),
            cls_pooling,
            query_prompt: prompts.query.unwrap_or_default(),
            document_prompt: prompts.document.or(prompts.passage).unwrap_or_default(),
            word: w("embeddings.word_embeddings.weight", &[config.vocab_size, dim])?,
            position: w("embeddings.position_embeddings.weight", &[positions, dim])?,
            token_type,
            position_offset,
            relative_bias,
            relative_buckets,
            embed_norm: norm("embeddings.LayerNorm")?,
            layers,
            path: dir.display().to_string(),
        })
    }

    /// The length of its vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The vector of `text`: length [`Model::dim`], norm 1 (all zeros for a text that is
    /// nothing but special tokens' worth of nothing, which cannot happen: [CLS] is always in).
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let ids = self.tokenizer.encode(text, self.max_tokens);
        self.embed_ids(&ids, None)
    }

    /// The vector of a tool's `text`, after the model's document prompt if it has one.
    pub fn embed_document(&self, text: &str) -> Vec<f32> {
        self.embed(&prompted(&self.document_prompt, text))
    }

    /// The vector of a search's request `text` (after the model's query prompt, if it has
    /// one; its first [`QUERY_TOKENS`] tokens), for a search waiting on it: where the
    /// products run on AMX or VNNI and there is more than one CPU, the process's helper
    /// thread takes half of each product if no other search has it
    /// ([`super::helper::Helper`]). A catalog's vectors are made one thread at a time
    /// ([`Model::embed_document`]), in the background.
    pub fn embed_now(&self, text: &str) -> Vec<f32> {
        self.embed_now_with_dots(text, &[]).0
    }

    /// [`Model::embed_now`], and the dot product of its vector with each of the rows of
    /// `rows` (a catalog's vectors, [`Model::dim`] wide), shared with the helper too.
    pub fn embed_now_with_dots(&self, text: &str, rows: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let ids = self
            .tokenizer
            .encode(&prompted(&self.query_prompt, text), self.max_tokens.min(QUERY_TOKENS));
        let shared = self
            .layers
            .first()
            .is_some_and(|l| l.up.packed.is_some() || l.up.int8.is_some());
        let session = if shared { super::helper::Helper::begin() } else { None };
        let helper = session.as_ref().map(|s| s.helper);
        let v = self.embed_ids(&ids, helper);
        let dots = super::cosines::shared(rows, &v, helper);
        (v, dots)
    }

    fn embed_ids(&self, ids: &[u32], helper: Option<&super::helper::Helper>) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { self.forward_avx512(ids, helper) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            return unsafe { self.forward_avx2(ids, helper) };
        }
        self.forward(ids, helper)
    }

    /// [`Model::forward`] compiled for AVX-512: its loops (sums, norms, GELU, the
    /// attention of a short text) run 16 lanes wide.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn forward_avx512(&self, ids: &[u32], helper: Option<&super::helper::Helper>) -> Vec<f32> {
        self.forward(ids, helper)
    }

    /// [`Model::forward`] compiled for AVX2 and FMA, 8 lanes wide.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn forward_avx2(&self, ids: &[u32], helper: Option<&super::helper::Helper>) -> Vec<f32> {
        self.forward(ids, helper)
    }

    #[inline(always)]
    fn forward(&self, ids: &[u32], helper: Option<&super::helper::Helper>) -> Vec<f32> {
        let (n, d) = (ids.len(), self.dim);
        let vocab = self.word.len() / d;
        let mut x = vec![0f32; n * d];
        for (t, &id) in ids.iter().enumerate() {
            let id = (id as usize).min(vocab.saturating_sub(1));
            let row = &mut x[t * d..(t + 1) * d];
            let word = &self.word[id * d..(id + 1) * d];
            let p = t + self.position_offset;
            let pos = &self.position[p * d..(p + 1) * d];
            for (((r, w), p), ty) in row.iter_mut().zip(word).zip(pos).zip(&self.token_type) {
                *r = w + p + ty;
            }
        }
        layer_norm(&mut x, &self.embed_norm, d, self.eps);
        let hd = d / self.heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scratch = Scratch {
            bf16: Vec::new(),
            int8: super::vnni::Scratch::default(),
            helper,
        };
        let mut qkv = Vec::new();
        let mut scores = vec![0f32; n * n];
        // MPNet: each head's bias for each relative position `j - i`, at index
        // `(j - i + n - 1) · heads + h`.
        let bias: Vec<f32> = if self.relative_bias.is_empty() {
            Vec::new()
        } else {
            let heads = self.heads;
            (0..(2 * n).saturating_sub(1))
                .flat_map(|r| {
                    let b = relative_bucket(r as i64 - (n as i64 - 1), self.relative_buckets);
                    self.relative_bias[b * heads..(b + 1) * heads].iter().copied()
                })
                .collect()
        };
        let bias_of = |h: usize, i: usize, j: usize| bias[(j + n - 1 - i) * self.heads + h];
        let mut ctx = vec![0f32; n * d];
        let mut attn = Vec::new();
        let mut up = Vec::new();
        let mut down = Vec::new();
        for layer in &self.layers {
            layer.qkv.apply(&x, n, &mut qkv, &mut scratch, Finish::BIAS);
            if n <= SHORT {
                // A short text's attention, in plain loops (`matrixmultiply` would pack these
                // few rows for every head), its heads shared with the helper.
                super::attention::short(&qkv, &mut ctx, [n, d, self.heads], scale, &bias, scratch.helper);
            } else {
                for h in 0..self.heads {
                    let q = &qkv[h * hd..];
                    let k = &qkv[d + h * hd..];
                    let v = &qkv[2 * d + h * hd..];
                    // scores = Q_h · K_hᵀ · scale
                    gemm([n, hd, n], scale, (q, 3 * d, 1), (k, 1, 3 * d), 0.0, (&mut scores, n));
                    for (i, row) in scores.chunks_exact_mut(n).enumerate() {
                        if !bias.is_empty() {
                            for (j, s) in row.iter_mut().enumerate() {
                                *s += bias_of(h, i, j);
                            }
                        }
                        softmax(row);
                    }
                    // ctx_h = P · V_h
                    gemm(
                        [n, n, hd],
                        1.0,
                        (&scores, n, 1),
                        (v, 3 * d, 1),
                        0.0,
                        (&mut ctx[h * hd..], d),
                    );
                }
            }
            layer.attn_out.apply(&ctx, n, &mut attn, &mut scratch, Finish::plus(&x));
            layer_norm(&mut attn, &layer.attn_norm, d, self.eps);
            layer.up.apply(&attn, n, &mut up, &mut scratch, Finish::GELU);
            layer.down.apply(&up, n, &mut down, &mut scratch, Finish::plus(&attn));
            layer_norm(&mut down, &layer.out_norm, d, self.eps);
            std::mem::swap(&mut x, &mut down);
        }
        let mut out = vec![0f32; d];
        if self.cls_pooling {
            out.copy_from_slice(&x[..d]);
        } else {
            for row in x.chunks_exact(d) {
                for (o, v) in out.iter_mut().zip(row) {
                    *o += v;
                }
            }
        }
        let norm = out.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm > 0.0 {
            for o in &mut out {
                *o /= norm;
            }
        }
        out
    }
}

/// What follows a product's bias: a residual added (`plus`, as long as the output), or
/// GELU.
#[derive(Clone, Copy)]
struct Finish<'a> {
    plus: Option<&'a [f32]>,
    gelu: bool,
}

impl<'a> Finish<'a> {
    const BIAS: Finish<'static> = Finish {
        plus: None,
        gelu: false,
    };
    const GELU: Finish<'static> = Finish { plus: None, gelu: true };

    fn plus(residual: &'a [f32]) -> Finish<'a> {
        Finish {
            plus: Some(residual),
            gelu: false,
        }
    }
}

/// What a product needs beside its input and output.
struct Scratch<'a> {
    /// The input rounded to bf16, for AMX.
    bf16: Vec<u16>,
    /// The input in int8, for VNNI.
    int8: super::vnni::Scratch,
    helper: Option<&'a super::helper::Helper>,
}

impl Linear {
    /// Moves the weights to bf16 tiles or int8 vectors, if their shape is whole ones.
    fn pack(&mut self, products: Products) {
        match products {
            Products::Amx if super::amx::available() && super::amx::fits(self.inp, self.out) => {
                self.packed = Some(super::amx::Packed::new(&self.w, self.out, self.inp));
            }
            Products::Int8 if super::vnni::available() && super::vnni::fits(self.inp, self.out) => {
                self.int8 = Some(super::vnni::Packed::new(&self.w, self.out, self.inp));
            }
            _ => return,
        }
        self.w = Vec::new();
    }

    /// `out = x · Wᵀ + b`, then as `finish` says, for `n` rows of `x` (on AMX, `scratch`
    /// holds `x` in bf16, and its helper thread, if any, takes part; in int8 the helper
    /// also finishes the outputs it made).
    #[inline(always)]
    fn apply(&self, x: &[f32], n: usize, out: &mut Vec<f32>, scratch: &mut Scratch<'_>, finish: Finish<'_>) {
        if let Some(int8) = &self.int8 {
            let finish = super::vnni::Finish {
                bias: &self.b,
                plus: finish.plus,
                gelu: finish.gelu,
            };
            int8.apply(x, n, out, &mut scratch.int8, scratch.helper, finish);
            return;
        }
        if let Some(packed) = &self.packed {
            let rows = super::amx::rows_bf16(x, n, self.inp, &mut scratch.bf16);
            packed.apply(&scratch.bf16, rows, out, scratch.helper);
            out.truncate(n * self.out);
            for row in out.chunks_exact_mut(self.out) {
                for (o, b) in row.iter_mut().zip(&self.b) {
                    *o += b;
                }
            }
        } else {
            out.clear();
            for _ in 0..n {
                out.extend_from_slice(&self.b);
            }
            self.apply_f32(x, n, out);
        }
        if let Some(plus) = finish.plus {
            for (o, p) in out.iter_mut().zip(plus) {
                *o += p;
            }
        }
        if finish.gelu {
            gelu_all(out);
        }
    }

    /// `out += x · Wᵀ` in f32.
    fn apply_f32(&self, x: &[f32], n: usize, out: &mut [f32]) {
        // W is out × inp, read transposed: inp × out with row stride 1, column stride inp.
        gemm(
            [n, self.inp, self.out],
            1.0,
            (x, self.inp, 1),
            (&self.w, 1, self.inp),
            1.0,
            (out, self.out),
        );
    }
}

/// `c = alpha · a · b + beta · c` for `a` m × k, `b` k × n, `c` m × n (`[m, k, n]`), each
/// given as a slice with its row and column strides (`c`'s columns are adjacent). Every
/// element the strides reach is checked to be inside its slice before `matrixmultiply`
/// runs, so this is safe whatever the shapes.
fn gemm(
    [m, k, n]: [usize; 3],
    alpha: f32,
    (a, rsa, csa): (&[f32], usize, usize),
    (b, rsb, csb): (&[f32], usize, usize),
    beta: f32,
    (c, rsc): (&mut [f32], usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + cols.saturating_sub(1) * cs;
    let fits = k > 0
        && last(m, k, rsa, csa) < a.len()
        && last(k, n, rsb, csb) < b.len()
        && last(m, n, rsc, 1) < c.len()
        && [rsa, csa, rsb, csb, rsc].iter().all(|s| isize::try_from(*s).is_ok());
    assert!(fits, "matrix product out of bounds: {m}×{k}·{k}×{n}");
    #[allow(unsafe_code)]
    // SAFETY: checked above: every (row, column) the strides reach in a, b and c is inside
    // its slice, and c is borrowed mutably, so nothing else reads it meanwhile.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            1,
        );
    }
}

/// Texts of at most this many tokens get their attention in plain loops.
pub(super) const SHORT: usize = 32;

/// The dot product of `query` with each of the rows of `rows` (`query.len()` wide), into
/// `out`, as many rows as both have: a search's cosines, 16 lanes at a time where the CPU
/// has AVX-512, 8 with AVX2 (a sum in order, one add waiting on the last, took 0.4 ms for
/// 1,000 tools).
pub fn dots_into(rows: &[f32], query: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { dots_avx512(rows, query, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        return unsafe { dots_avx2(rows, query, out) };
    }
    dots_loop(rows, query, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dots_avx2(rows: &[f32], query: &[f32], out: &mut [f32]) {
    dots_loop(rows, query, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dots_avx512(rows: &[f32], query: &[f32], out: &mut [f32]) {
    dots_loop(rows, query, out)
}

#[inline(always)]
fn dots_loop(rows: &[f32], query: &[f32], out: &mut [f32]) {
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(query.len().max(1))) {
        *o = dot(r, query);
    }
}

/// `a · b`, in 16 partial sums (so it vectorizes).
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The sum of `f` over `v`, in 16 partial sums.
#[inline(always)]
fn sum_of(v: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = v.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|x| f(*x)).sum();
    for c in chunks {
        for l in 0..16 {
            acc[l] += f(c[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn layer_norm(x: &mut [f32], norm: &Norm, d: usize, eps: f32) {
    for row in x.chunks_exact_mut(d) {
        let mean = sum_of(row, |v| v) / d as f32;
        let var = sum_of(row, |v| (v - mean) * (v - mean)) / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// `text` after `prompt`, copied only when there is a prompt.
fn prompted<'a>(prompt: &str, text: &'a str) -> std::borrow::Cow<'a, str> {
    if prompt.is_empty() {
        text.into()
    } else {
        format!("{prompt}{text}").into()
    }
}

/// MPNet's relative position bucket of `rel = j - i` (the key `rel` places after its query),
/// as `transformers` computes it: half the buckets for each direction, exact up to a quarter
/// of them, then logarithmic up to a distance of 128, in f32 as torch does.
fn relative_bucket(rel: i64, buckets: usize) -> usize {
    let half = (buckets / 2) as i64;
    let mut out = if rel > 0 { half } else { 0 };
    let n = rel.abs();
    let exact = half / 2;
    out += if n < exact {
        n
    } else {
        let scaled =
            ((n as f32 / exact as f32).ln() / (128.0f64 / exact as f64).ln() as f32 * (half - exact) as f32) as i64;
        (exact + scaled).min(half - 1)
    };
    out as usize
}

#[inline(always)]
pub(super) fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in row.iter_mut() {
        *v = exp(*v - max);
    }
    let sum = sum_of(row, |v| v);
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// `eˣ` in f32 for `x ≤ 0` (a softmax's), within 2 units in the last place, in a form the
/// compiler vectorizes (libm's `expf` is a call per value): `x = k · ln 2 + r` with
/// `|r| ≤ ln 2 / 2`, Cephes' polynomial for `eʳ`, and `2ᵏ` put in the exponent bits.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.max(-87.0);
    let k = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - k * 0.693_359_4 + k * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = p * r + c;
    }
    let e = p * r * r + r + 1.0;
    e * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// BERT's GELU over a slice: a loop the compiler vectorizes (no call, no branch), 16
/// lanes wide in [`Model::forward_avx512`].
#[inline(always)]
pub(super) fn gelu_all(v: &mut [f32]) {
    for x in v.iter_mut() {
        *x = gelu(*x);
    }
}

/// BERT's GELU: `x · Φ(x)`, with `erf`.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `erf` in f32, to within a few units in the last place: the rational fit Eigen and XLA
/// use (odd numerator of degree 13 over even denominator of degree 8, on [-4, 4], where
/// f32's erf is ±1 beyond).
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    for c in [
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.9546e-3,
        -1.609_603_3e-2,
    ] {
        p = x2 * p + c;
    }
    let p = x * p;
    let mut q = x2 * -1.456_607_2e-5 - 2.133_740_6e-4;
    for c in [-1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = x2 * q + c;
    }
    p / q
}

/// The tensors of a `.safetensors` file: an 8-byte little-endian header length, a JSON
/// header (`{name: {dtype, shape, data_offsets}}`), then the data. Read tensor by tensor,
/// through a small buffer, so loading holds the weights once, never the file's bytes too.
struct Tensors<R> {
    header: serde_json::Map<String, serde_json::Value>,
    /// Where the data starts, and its length.
    data: (u64, u64),
    reader: std::cell::RefCell<R>,
}

/// The longest header read (a BERT's is a few kilobytes).
const MAX_HEADER: u64 = 16 << 20;

impl<R: std::io::Read + std::io::Seek> Tensors<R> {
    fn parse(mut reader: R) -> Result<Tensors<R>, String> {
        let io = |e: std::io::Error| format!("not a safetensors file: {e}");
        let total = reader.seek(std::io::SeekFrom::End(0)).map_err(io)?;
        reader.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
        let mut len = [0u8; 8];
        reader
            .read_exact(&mut len)
            .map_err(|_| "not a safetensors file: shorter than its header length")?;
        let len = u64::from_le_bytes(len);
        if len > MAX_HEADER || len > total.saturating_sub(8) {
            return Err("not a safetensors file: its header runs past the end".into());
        }
        let mut header = vec![0u8; len as usize];
        reader.read_exact(&mut header).map_err(io)?;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| format!("its header: {e}"))?;
        Ok(Tensors {
            header,
            data: (8 + len, total - 8 - len),
            reader: std::cell::RefCell::new(reader),
        })
    }

    /// The tensor `name` (or `bert.name`) as f32, checked against `shape`; a 0 in `shape`
    /// takes whatever the file has there.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
        let prefixed = format!("bert.{name}");
        let entry = self
            .header
            .get(name)
            .or_else(|| self.header.get(&prefixed))
            .ok_or_else(|| format!("no tensor {name}"))?;
        #[derive(Deserialize)]
        struct Entry {
            dtype: String,
            shape: Vec<usize>,
            data_offsets: [u64; 2],
        }
        let e: Entry = serde_json::from_value(entry.clone()).map_err(|e| format!("tensor {name}: {e}"))?;
        let fits = e.shape.len() == shape.len() && e.shape.iter().zip(shape).all(|(a, b)| *b == 0 || a == b);
        if !fits {
            return Err(format!("tensor {name} has shape {:?}, expected {shape:?}", e.shape));
        }
        let width: u64 = match e.dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            other => return Err(format!("tensor {name} is {other}; F32, F16 and BF16 are read")),
        };
        let count = e
            .shape
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(*d as u64))
            .ok_or_else(|| format!("tensor {name}: its shape is too large"))?;
        let [from, to] = e.data_offsets;
        if from > to || to > self.data.1 {
            return Err(format!("tensor {name}: its data runs past the end of the file"));
        }
        if Some(to - from) != count.checked_mul(width) {
            return Err(format!("tensor {name}: {} bytes for {count} values", to - from));
        }
        let mut reader = self.reader.borrow_mut();
        let io = |e: std::io::Error| format!("tensor {name}: {e}");
        reader.seek(std::io::SeekFrom::Start(self.data.0 + from)).map_err(io)?;
        let mut out = Vec::with_capacity(count as usize);
        let mut left = to - from;
        let mut buf = vec![0u8; 1 << 16];
        while left > 0 {
            let chunk = &mut buf[..left.min(1 << 16) as usize];
            reader.read_exact(chunk).map_err(io)?;
            left -= chunk.len() as u64;
            match e.dtype.as_str() {
                "F32" => out.extend(
                    chunk
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                ),
                "BF16" => out.extend(
                    chunk
                        .chunks_exact(2)
                        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
                ),
                _ => out.extend(
                    chunk
                        .chunks_exact(2)
                        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
                ),
            }
        }
        Ok(out)
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalize it.
            let shift = f.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | ((f << (shift + 1)) & 0x3ff) << 13
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The model the tests use: `MCP_GATEWAY_SEARCH_MODEL`, or what scripts/setup-test-deps
    /// installs.
    pub fn model_dir() -> std::path::PathBuf {
        let dir = std::env::var_os("MCP_GATEWAY_SEARCH_MODEL").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/models/all-MiniLM-L6-v2"),
            Into::into,
        );
        assert!(
            dir.join("model.safetensors").exists(),
            "no search model at {} (scripts/setup-test-deps installs it; or set MCP_GATEWAY_SEARCH_MODEL)",
            dir.display()
        );
        dir
    }

    #[test]
    fn erf_and_f16_are_right() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.5, 0.999_999_3),
        ] {
            assert!((erf(x) - want).abs() < 1e-6, "erf({x}) = {}", erf(x));
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x0000), 0.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
    }

    #[test]
    fn a_broken_model_folder_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Model::load(dir.path()).expect_err("empty folder");
        assert!(err.contains("config.json"), "{err}");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"model_type":"gpt2","hidden_size":8,"num_attention_heads":2,"num_hidden_layers":1,"intermediate_size":8,"vocab_size":4}"#,
        )
        .expect("write");
        let err = Model::load(dir.path()).expect_err("gpt2");
        assert!(err.contains("only \"bert\""), "{err}");
        let bad = Tensors::parse(std::io::Cursor::new(vec![200, 0, 0, 0, 0, 0, 0, 0, b'{']));
        assert!(bad.is_err());
        assert!(Tensors::parse(std::io::Cursor::new(b"short".to_vec())).is_err());
        // A tensor whose offsets run past the data, or whose size is not its shape's.
        let file = |header: &str, data: &[u8]| {
            let mut v = (header.len() as u64).to_le_bytes().to_vec();
            v.extend_from_slice(header.as_bytes());
            v.extend_from_slice(data);
            Tensors::parse(std::io::Cursor::new(v)).expect("parses")
        };
        let t = file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}"#, &[0; 8]);
        assert!(t.get("a", &[2]).expect_err("past the end").contains("past the end"));
        let t = file(r#"{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}}"#, &[0; 4]);
        assert!(t.get("a", &[3]).expect_err("size").contains("4 bytes for 3 values"));
        let t = file(
            r#"{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#,
            &[0x00, 0x3c, 0x00, 0xc0],
        );
        assert_eq!(t.get("a", &[2]).expect("f16"), [1.0, -2.0]);
        assert!(t.get("a", &[3]).expect_err("shape").contains("expected [3]"));
        assert!(t.get("b", &[2]).expect_err("missing").contains("no tensor b"));
    }

    /// The vectors match the reference implementation's (scripts/search-model-reference:
    /// numpy over the same weights, HF's tokenizer), and paraphrases are nearer than
    /// unrelated requests.
    ///
    /// In f32 (here and on any CPU) to within rounding; with AMX's bf16 products (where
    /// this CPU has them) to within what bf16 costs: cosine above 0.9995.
    #[test]
    fn vectors_match_the_reference() {
        reference_holds(Products::F32, 0.9999, 1e-3);
        if super::super::amx::available() {
            reference_holds(Products::Amx, 0.9995, 5e-3);
        } else {
            eprintln!("no AMX here: the bf16 products are not checked");
        }
        // The int8 kernel this CPU runs: VNNI's weights take −127..=127, AVX2's −64..=64.
        if super::super::vnni::available() {
            reference_holds(Products::Int8, MIN_INT8_COS, 3e-2);
        } else {
            eprintln!("neither AVX-512 VNNI nor AVX2 here: the int8 products are not checked");
        }
    }

    /// How near the int8 vectors must be to the f32 reference: on AVX-512 VNNI 0.9985–0.9992
    /// for the reference texts, 0.9935 for the empty one (two tokens, [CLS] and [SEP]); on
    /// AVX2, whose weights take half the steps, 0.9955–0.9984 and 0.9917 (each value within
    /// 0.023).
    const MIN_INT8_COS: f32 = 0.99;

    fn reference_holds(products: Products, min_cos: f32, max_diff: f32) {
        let model = Model::load_with(&model_dir(), products).expect("model");
        assert_eq!(model.layers[0].up.packed.is_some(), products == Products::Amx);
        assert_eq!(model.layers[0].up.int8.is_some(), products == Products::Int8);
        #[derive(Deserialize)]
        struct Reference {
            text: String,
            vector: Vec<f32>,
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search/model-reference.json");
        let refs: Vec<Reference> =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("reference")).expect("reference json");
        assert!(refs.len() >= 5);
        for r in &refs {
            let v = model.embed(&r.text);
            assert_eq!(v.len(), r.vector.len());
            let cos: f32 = v.iter().zip(&r.vector).map(|(a, b)| a * b).sum();
            let worst = v.iter().zip(&r.vector).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(
                cos > min_cos && worst < max_diff,
                "{:?} ({products:?}): cos {cos}, worst {worst}",
                r.text
            );
        }
        let a = model.embed("open a ticket about the login crash");
        let b = model.embed("create a new issue in a repository");
        let c = model.embed("list the files in a directory");
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
        assert!(dot(&a, &b) > dot(&a, &c) + 0.05, "{} vs {}", dot(&a, &b), dot(&a, &c));
    }

    /// MPNet's relative position buckets are transformers' (the values numpy gives for the
    /// same formula, in f32 as torch computes it).
    #[test]
    fn relative_buckets_are_transformers() {
        let want: [(i64, usize); 19] = [
            (0, 0),
            (-1, 1),
            (1, 17),
            (-7, 7),
            (7, 23),
            (-8, 8),
            (8, 24),
            (-11, 8),
            (12, 25),
            (-16, 10),
            (16, 26),
            (-31, 11),
            (32, 28),
            (-64, 14),
            (64, 30),
            (-127, 15),
            (128, 31),
            (-500, 15),
            (500, 31),
        ];
        for (rel, bucket) in want {
            assert_eq!(relative_bucket(rel, 32), bucket, "relative position {rel}");
        }
    }

    /// An MPNet model (`tests/fixtures/search/tiny-mpnet`: a random one of 2 layers, 16
    /// wide, with RoBERTa's `<s>` … `</s>` framing, written by `scripts/tiny-mpnet` with the
    /// vectors a numpy forward pass of MPNet gives) reads its texts as HF's tokenizer does
    /// and gives the reference's vectors, for a short text and one past [`SHORT`] tokens
    /// (whose attention runs through `gemm`, and whose relative positions reach the
    /// logarithmic buckets).
    #[test]
    fn an_mpnet_model_gives_its_reference_vectors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search/tiny-mpnet");
        #[derive(Deserialize)]
        struct Reference {
            text: String,
            ids: Vec<u32>,
            vector: Vec<f32>,
        }
        let refs: Vec<Reference> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).expect("reference"))
                .expect("reference json");
        assert!(refs.iter().any(|r| r.ids.len() > SHORT));
        for products in [Products::F32, Products::best()] {
            let model = Model::load_with(&dir, products).expect("tiny mpnet");
            assert_eq!(model.position_offset, 2);
            for r in &refs {
                assert_eq!(model.tokenizer.encode(&r.text, model.max_tokens), r.ids, "{:?}", r.text);
                let v = model.embed(&r.text);
                let cos: f32 = v.iter().zip(&r.vector).map(|(a, b)| a * b).sum();
                let worst = v.iter().zip(&r.vector).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                let (min_cos, max_diff) = if products == Products::F32 {
                    (0.99999, 1e-4)
                } else {
                    (0.99, 5e-2)
                };
                assert!(
                    cos > min_cos && worst < max_diff,
                    "{:?} ({products:?}): cos {cos}, worst {worst}",
                    r.text
                );
            }
        }
        // Without its relative position bias it is another model: the bias is read.
        let mut model = Model::load_with(&dir, Products::F32).expect("tiny mpnet");
        model.relative_bias.fill(0.0);
        let v = model.embed(&refs[0].text);
        let cos: f32 = v.iter().zip(&refs[0].vector).map(|(a, b)| a * b).sum();
        assert!(cos < 0.9999, "cos {cos}");
        // A config whose numbers leave no positions, or no buckets, is an error naming it.
        let bad = tempfile::tempdir().expect("tempdir");
        for e in std::fs::read_dir(&dir).expect("fixture").flatten() {
            if e.file_name() != "config.json" {
                std::os::unix::fs::symlink(e.path(), bad.path().join(e.file_name())).expect("link");
            }
        }
        let config = std::fs::read_to_string(dir.join("config.json")).expect("config");
        for (from, to) in [
            ("\"pad_token_id\": 1", format!("\"pad_token_id\": {}", usize::MAX)),
            (
                "\"relative_attention_num_buckets\": 32",
                "\"relative_attention_num_buckets\": 2".into(),
            ),
        ] {
            assert!(config.contains(from), "{from}");
            std::fs::write(bad.path().join("config.json"), config.replace(from, &to)).expect("write");
            let err = Model::load_with(bad.path(), Products::F32).expect_err("bad config");
            assert!(err.contains("config.json"), "{err}");
        }
    }

    /// A model's `prompts` go before requests and tools' texts, and nothing goes before
    /// them without any (all-MiniLM-L6-v2 has none).
    #[test]
    fn prompts_go_before_requests_and_documents() {
        let plain = Model::load_with(&model_dir(), Products::F32).expect("model");
        assert_eq!(plain.embed_now("list my repos"), plain.embed("list my repos"));
        assert_eq!(
            plain.embed_document("github: list repos."),
            plain.embed("github: list repos.")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        for e in std::fs::read_dir(model_dir()).expect("model folder").flatten() {
            std::os::unix::fs::symlink(e.path(), dir.path().join(e.file_name())).expect("link");
        }
        let st = dir.path().join("config_sentence_transformers.json");
        std::fs::remove_file(&st).ok();
        std::fs::write(&st, r#"{"prompts": {"query": "query: ", "passage": "passage: "}}"#).expect("write");
        let e5 = Model::load_with(dir.path(), Products::F32).expect("model with prompts");
        assert_eq!(e5.embed_now("list my repos"), plain.embed("query: list my repos"));
        assert_ne!(e5.embed_now("list my repos"), plain.embed("list my repos"));
        assert_eq!(
            e5.embed_document("github: list repos."),
            plain.embed("passage: github: list repos.")
        );
        std::fs::write(
            &st,
            r#"{"prompts": {"query": "q: ", "document": "d: ", "passage": "p: "}}"#,
        )
        .expect("write");
        let both = Model::load_with(dir.path(), Products::F32).expect("model");
        assert_eq!(both.embed_document("x"), plain.embed("d: x"));
        std::fs::write(&st, r#"{"prompts": 7}"#).expect("write");
        let err = Model::load_with(dir.path(), Products::F32).expect_err("bad prompts");
        assert!(err.contains("config_sentence_transformers.json"), "{err}");
    }

    /// How long a request's and a tool's vectors take (run by hand, in release:
    /// `cargo test --release --lib model::tests::speed -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn speed() {
        let model = Model::load(&model_dir()).expect("model");
        let tool = "github: create issue. Create a new issue in a GitHub repository. Use it to report bugs, ask for features or track tasks; labels, assignees and milestones can be set at once.";
        for (what, text, n) in [
            ("request", "open a ticket about the login crash", 200),
            ("request, embed_now", "open a ticket about the login crash", 200),
            ("tool", tool, 50),
        ] {
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                if what.ends_with("embed_now") {
                    std::hint::black_box(model.embed_now(std::hint::black_box(text)));
                } else {
                    std::hint::black_box(model.embed(std::hint::black_box(text)));
                }
            }
            let ids = model.tokenizer.encode(text, model.max_tokens).len();
            eprintln!(
                "{what} ({ids} ids): {:.0} us",
                t0.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        }
        // Every request of the search fixtures, as a search makes its vector.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search");
        let mut requests = Vec::new();
        for set in ["queries", "heldout", "fresh", "fresh2"] {
            let text = std::fs::read_to_string(dir.join(format!("{set}.json"))).expect("requests");
            let json: serde_json::Value = serde_json::from_str(&text).expect("requests json");
            let list = json
                .get("queries")
                .unwrap_or(&json)
                .as_array()
                .cloned()
                .unwrap_or_default();
            requests.extend(list.iter().filter_map(|q| q["query"].as_str().map(str::to_owned)));
        }
        let mut took: Vec<f64> = Vec::new();
        for _ in 0..3 {
            for r in &requests {
                let t0 = std::time::Instant::now();
                std::hint::black_box(model.embed_now(std::hint::black_box(r)));
                took.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        took.sort_by(f64::total_cmp);
        eprintln!(
            "{} requests, embed_now: p50 {:.0} us, p90 {:.0} us",
            requests.len(),
            took[took.len() / 2],
            took[took.len() * 9 / 10]
        );
    }
}
