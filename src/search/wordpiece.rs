//! BERT's WordPiece tokenizer, as HuggingFace `tokenizers` runs it for a BERT model's
//! `tokenizer.json` (all-MiniLM-L6-v2's and the like): the same ids for the same text.
//!
//! The steps, each as HF's Rust source does it:
//! 1. The added tokens that are matched before normalization (`normalized: false`, as
//!    BERT's `[CLS]`, `[SEP]`, `[UNK]`, `[PAD]`, `[MASK]` are) are cut out of the raw text,
//!    leftmost-longest, and stand for their own id; the text between them goes on alone.
//! 2. `BertNormalizer`: `clean_text` drops U+0000, U+FFFD and the control characters
//!    (general category Cc, Cf, Co; `\t`, `\n`, `\r` are whitespace); `handle_chinese_chars`
//!    puts spaces around CJK ideographs (HF's ranges: its Extension E starts at 0x2B920);
//!    `strip_accents` (when null, as `lowercase`) is NFD then dropping the nonspacing marks
//!    (Mn); `lowercase` is Rust's `char::to_lowercase`.
//! 3. `BertPreTokenizer`: words split at whitespace, and each punctuation character (ASCII
//!    punctuation, or general category P*) a word of its own.
//! 4. `WordPiece`: a word longer than `max_input_chars_per_word` characters is `[UNK]`;
//!    otherwise the longest vocabulary entry from the start, then from where it ended the
//!    longest with the continuing prefix (`##`), and so on; a word with a position where no
//!    entry starts is `[UNK]` whole.
//! 5. The post-processor's `[CLS]` … `[SEP]`, with truncation to `max_len` ids in all: the
//!    pieces are cut (the middle of a word too), `[SEP]` stays last.
//!
//! The general categories come from tables of the `unicode_categories` crate that HF links
//! (Unicode 8/9, so a newer character may be told apart differently than a newer Unicode
//! would); NFD is the `unicode-normalization` crate's (HF has a fork of an older release:
//! the two differ on 21 characters of recent scripts). Nothing is allocated per character:
//! a word is gathered in one buffer and looked up, piece by piece, through another.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use unicode_normalization::UnicodeNormalization;

type Vocab = HashMap<Box<str>, u32, foldhash::fast::FixedState>;

/// A BERT WordPiece tokenizer: text to the model's input ids.
pub struct WordPiece {
    vocab: Vocab,
    /// The added tokens matched in the raw text, longest first.
    added: Vec<(Box<str>, u32)>,
    /// The bytes that start one of `added`.
    added_first: Box<[u8]>,
    /// The continuing subword prefix (`##`).
    prefix: Box<str>,
    /// The longest entry (in bytes), and the longest continuing one without its prefix: a
    /// piece is looked for from no further than these.
    longest: usize,
    longest_continuing: usize,
    max_word_chars: usize,
    unk: u32,
    cls: u32,
    sep: u32,
    clean_text: bool,
    chinese: bool,
    strip_accents: bool,
    lowercase: bool,
}

/// The parts of a tokenizer.json read here (the vocabulary is parsed once its model type
/// is known).
#[derive(Deserialize)]
struct TokenizerJson<'a> {
    #[serde(borrow)]
    model: ModelJson<'a>,
    normalizer: Option<NormalizerJson>,
    pre_tokenizer: Option<TypeJson>,
    post_processor: Option<PostJson>,
    #[serde(default)]
    added_tokens: Vec<AddedJson>,
}

#[derive(Deserialize)]
struct ModelJson<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    vocab: Option<&'a RawValue>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    max_input_chars_per_word: Option<usize>,
}

/// HF's defaults where a field is missing.
#[derive(Deserialize)]
struct NormalizerJson {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default = "yes")]
    clean_text: bool,
    #[serde(default = "yes")]
    handle_chinese_chars: bool,
    #[serde(default)]
    strip_accents: Option<bool>,
    #[serde(default = "yes")]
    lowercase: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct TypeJson {
    #[serde(rename = "type")]
    kind: String,
}

/// The post-processor: BERT's (`[CLS]` … `[SEP]`, as TemplateProcessing or
/// BertProcessing), or RoBERTa's as MPNet uses it (`<s>` … `</s>`, its `cls` and `sep`).
#[derive(Deserialize)]
struct PostJson {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    cls: Option<(String, u32)>,
    #[serde(default)]
    sep: Option<(String, u32)>,
}

#[derive(Deserialize)]
struct AddedJson {
    id: u32,
    content: String,
    #[serde(default)]
    normalized: bool,
}

/// Per-call buffers: the word being gathered (and its length in characters), and the
/// continuing piece being looked up (the prefix, then the piece).
struct Scratch {
    word: String,
    word_chars: usize,
    piece: String,
}

impl WordPiece {
    /// Reads a HuggingFace tokenizer.json of a BERT WordPiece model: `model.vocab`,
    /// `model.unk_token`, `model.continuing_subword_prefix`, `model.max_input_chars_per_word`,
    /// the `BertNormalizer`'s `lowercase`, `strip_accents` (null: as `lowercase`, as HF does),
    /// `handle_chinese_chars` and `clean_text`, and the added tokens matched before
    /// normalization. An error (naming what is wrong) when the model is not WordPiece, the
    /// normalizer not BertNormalizer, the pre-tokenizer not BertPreTokenizer, the
    /// post-processor neither TemplateProcessing nor BertProcessing, or `[CLS]`, `[SEP]` or
    /// the unknown token is not in the vocabulary. (Added tokens matched after normalization,
    /// which BERT models have none of, are not matched.)
    pub fn from_tokenizer_json(text: &str) -> Result<WordPiece, String> {
        let json: TokenizerJson = serde_json::from_str(text).map_err(|e| format!("not a tokenizer.json: {e}"))?;
        let model = json.model;
        match model.kind.as_deref() {
            Some("WordPiece") => {}
            Some(other) => {
                return Err(format!(
                    "model.type is {other:?}: only \"WordPiece\" (BERT) models are read"
                ))
            }
            None => return Err("model.type is missing: only \"WordPiece\" (BERT) models are read".into()),
        }
        let vocab: Vocab = match model.vocab {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|e| format!("model.vocab: {e}"))?,
            None => return Err("model.vocab is missing".into()),
        };
        let (clean_text, chinese, strip_accents, lowercase) = match json.normalizer {
            None => (false, false, false, false),
            Some(n) if n.kind == "BertNormalizer" => (
                n.clean_text,
                n.handle_chinese_chars,
                n.strip_accents.unwrap_or(n.lowercase),
                n.lowercase,
            ),
            Some(n) => {
                return Err(format!(
                    "normalizer.type is {:?}: only \"BertNormalizer\" is read",
                    n.kind
                ))
            }
        };
        match json.pre_tokenizer {
            Some(p) if p.kind == "BertPreTokenizer" => {}
            Some(p) => {
                return Err(format!(
                    "pre_tokenizer.type is {:?}: only \"BertPreTokenizer\" is read",
                    p.kind
                ))
            }
            None => return Err("pre_tokenizer is missing: only \"BertPreTokenizer\" is read".into()),
        }
        let frame = match json.post_processor {
            Some(p) if p.kind == "TemplateProcessing" => None,
            Some(p) if matches!(p.kind.as_str(), "BertProcessing" | "RobertaProcessing") => p.cls.zip(p.sep),
            Some(p) => {
                let kind = p.kind;
                return Err(format!(
                    "post_processor.type is {kind:?}: only BERT's [CLS] ... [SEP] (or RoBERTa's <s> ... </s>) is read"
                ));
            }
            None => return Err("post_processor is missing: the model's input is framed as [CLS] ... [SEP]".into()),
        };
        let added = json
            .added_tokens
            .into_iter()
            .filter(|a| !a.normalized)
            .map(|a| (a.content, a.id))
            .collect();
        let mut tokenizer = WordPiece::new(
            vocab,
            added,
            [
                model.unk_token.as_deref().unwrap_or("[UNK]"),
                frame.as_ref().map_or("[CLS]", |((cls, _), _)| cls.as_str()),
                frame.as_ref().map_or("[SEP]", |(_, (sep, _))| sep.as_str()),
            ],
            model.continuing_subword_prefix.as_deref().unwrap_or("##"),
            model.max_input_chars_per_word.unwrap_or(100),
            [clean_text, chinese, strip_accents, lowercase],
        )?;
        // The post-processor's own ids frame the input (RoBERTa's `<s>` is 0 whatever
        // the vocabulary says).
        if let Some(((_, cls), (_, sep))) = frame {
            tokenizer.cls = cls;
            tokenizer.sep = sep;
        }
        Ok(tokenizer)
    }

    /// Reads a plain vocab.txt (one token a line, the id its line's number, trailing
    /// whitespace trimmed as HF does), for models that ship no tokenizer.json: BERT's
    /// normalizer with `lowercase` as given (accents stripped when lowercasing), `[UNK]`,
    /// `##`, 100 characters a word, and BERT's special tokens (`[PAD]`, `[UNK]`, `[CLS]`,
    /// `[SEP]`, `[MASK]`, those in the vocabulary) matched in the raw text, as
    /// `transformers`' `BertTokenizerFast` sets them up.
    pub fn from_vocab_txt(text: &str, lowercase: bool) -> Result<WordPiece, String> {
        let mut vocab = Vocab::default();
        for (id, line) in text.lines().enumerate() {
            let id = u32::try_from(id).map_err(|_| "vocab.txt: more than 2^32 lines".to_string())?;
            vocab.insert(line.trim_end().into(), id);
        }
        let added = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            .into_iter()
            .filter_map(|t| vocab.get(t).map(|&id| (t.to_string(), id)))
            .collect();
        WordPiece::new(
            vocab,
            added,
            ["[UNK]", "[CLS]", "[SEP]"],
            "##",
            100,
            [true, true, lowercase, lowercase],
        )
    }

    fn new(
        vocab: Vocab,
        mut added: Vec<(String, u32)>,
        [unk, cls, sep]: [&str; 3],
        prefix: &str,
        max_word_chars: usize,
        [clean_text, chinese, strip_accents, lowercase]: [bool; 4],
    ) -> Result<WordPiece, String> {
        let id = |token: &str, what: &str| {
            vocab
                .get(token)
                .copied()
                .ok_or_else(|| format!("the vocabulary has no {what} token {token:?}"))
        };
        let (unk, cls, sep) = (id(unk, "unknown")?, id(cls, "class")?, id(sep, "separator")?);
        let longest = vocab.keys().map(|k| k.len()).max().unwrap_or(0);
        let longest_continuing = vocab
            .keys()
            .filter_map(|k| k.strip_prefix(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        added.retain(|(t, _)| !t.is_empty());
        // Longest first, so that the first one matching at a position is the longest there.
        added.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        let mut added_first: Vec<u8> = added
            .iter()
            .filter_map(|(t, _)| t.as_bytes().first().copied())
            .collect();
        added_first.sort_unstable();
        added_first.dedup();
        Ok(WordPiece {
            vocab,
            added: added.into_iter().map(|(t, id)| (t.into_boxed_str(), id)).collect(),
            added_first: added_first.into_boxed_slice(),
            prefix: prefix.into(),
            longest,
            longest_continuing,
            max_word_chars,
            unk,
            cls,
            sep,
            clean_text,
            chinese,
            strip_accents,
            lowercase,
        })
    }

    /// The ids of `text`: `[CLS]`, the word pieces, `[SEP]`, truncated so that at most
    /// `max_len` ids come out in all (the pieces are cut, `[SEP]` stays last), as HF's
    /// truncation does. (A `max_len` below 2 cuts nothing, as in HF, where `[CLS]` and `[SEP]`
    /// alone would be more.)
    pub fn encode(&self, text: &str, max_len: usize) -> Vec<u32> {
        // The pieces stop at `cap` ids, [CLS] included.
        let cap = max_len.checked_sub(2).map_or(usize::MAX, |n| n + 1);
        let mut ids = Vec::with_capacity(cap.min(text.len() / 3 + 8).saturating_add(1));
        ids.push(self.cls);
        let mut scratch = Scratch {
            word: String::with_capacity(32),
            word_chars: 0,
            piece: String::with_capacity(self.prefix.len() + 32),
        };
        scratch.piece.push_str(&self.prefix);
        let mut rest = text;
        while ids.len() < cap {
            match self.find_added(rest) {
                Some((at, len, id)) => {
                    self.segment(&rest[..at], &mut ids, cap, &mut scratch);
                    if ids.len() < cap {
                        ids.push(id);
                    }
                    rest = &rest[at + len..];
                }
                None => {
                    self.segment(rest, &mut ids, cap, &mut scratch);
                    break;
                }
            }
        }
        ids.truncate(cap);
        ids.push(self.sep);
        ids
    }

    /// The leftmost added token in `text` (the longest of those there): its byte offset,
    /// length and id.
    fn find_added(&self, text: &str) -> Option<(usize, usize, u32)> {
        let bytes = text.as_bytes();
        let mut from = 0;
        while let Some(n) = self.next_added_first(&bytes[from..]) {
            let at = from + n;
            let tail = &bytes[at..];
            if let Some((t, id)) = self.added.iter().find(|(t, _)| tail.starts_with(t.as_bytes())) {
                return Some((at, t.len(), *id));
            }
            from = at + 1;
        }
        None
    }

    /// Where the first byte that starts an added token is.
    fn next_added_first(&self, haystack: &[u8]) -> Option<usize> {
        match *self.added_first {
            [] => None,
            [a] => memchr::memchr(a, haystack),
            [a, b] => memchr::memchr2(a, b, haystack),
            [a, b, c] => memchr::memchr3(a, b, c, haystack),
            ref any => haystack.iter().position(|b| any.contains(b)),
        }
    }

    /// Normalizes a stretch of text without added tokens and appends its pieces, until
    /// there are `cap` ids.
    ///
    /// Runs of ASCII go byte by byte, and NFD only over the rest: NFD leaves an ASCII
    /// character as it is and reorders no marks across it, so decomposing the text between two
    /// kept ASCII characters by itself is decomposing the whole. (The ASCII characters that
    /// `clean_text` drops go with the run around them, as they are not there for NFD.)
    fn segment(&self, text: &str, ids: &mut Vec<u32>, cap: usize, scratch: &mut Scratch) {
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let ascii = bytes[at..]
                .iter()
                .position(|b| !b.is_ascii())
                .map_or(bytes.len(), |n| at + n);
            for &b in &bytes[at..ascii] {
                let c = char::from(b);
                if !(self.clean_text && is_dropped(c)) {
                    self.push_char(if self.lowercase { c.to_ascii_lowercase() } else { c }, ids, scratch);
                    if ids.len() >= cap {
                        return;
                    }
                }
            }
            if ascii == bytes.len() {
                break;
            }
            // Up to the next kept ASCII character: a char boundary.
            let end = bytes[ascii..]
                .iter()
                .position(|&b| b.is_ascii() && !(self.clean_text && is_dropped(char::from(b))))
                .map_or(bytes.len(), |n| ascii + n);
            let clean = self.clean_text;
            let kept = text[ascii..end].chars().filter(move |&c| !clean || !is_dropped(c));
            let full = if self.strip_accents {
                self.words(kept.nfd().filter(|&c| !is_nonspacing_mark(c)), ids, cap, scratch)
            } else {
                self.words(kept, ids, cap, scratch)
            };
            if full {
                return;
            }
            at = end;
        }
        self.end_word(ids, scratch);
    }

    /// Lower-cases normalized characters, splits them into words (the last one left open) and
    /// appends the words' pieces; whether there are `cap` ids. The CJK ideographs are split
    /// here as punctuation is: HF's spaces around them are put before NFD, which maps an
    /// ideograph to an ideograph and nothing else to one.
    fn words(&self, chars: impl Iterator<Item = char>, ids: &mut Vec<u32>, cap: usize, scratch: &mut Scratch) -> bool {
        for c in chars {
            if self.lowercase {
                for l in c.to_lowercase() {
                    self.push_char(l, ids, scratch);
                }
            } else {
                self.push_char(c, ids, scratch);
            }
            if ids.len() >= cap {
                return true;
            }
        }
        false
    }

    /// Takes one normalized character: the end of a word, a word of its own, or part of one.
    #[inline]
    fn push_char(&self, c: char, ids: &mut Vec<u32>, scratch: &mut Scratch) {
        let alone = if c.is_ascii() {
            // `char::is_whitespace`'s ASCII (with U+000B, which `is_ascii_whitespace` lacks).
            if matches!(c, ' ' | '\t'..='\r') {
                return self.end_word(ids, scratch);
            }
            c.is_ascii_punctuation()
        } else {
            if c.is_whitespace() {
                return self.end_word(ids, scratch);
            }
            is_punctuation(c) || (self.chinese && is_chinese(c))
        };
        if alone {
            self.end_word(ids, scratch);
            scratch.word.push(c);
            scratch.word_chars = 1;
            self.end_word(ids, scratch);
        } else {
            scratch.word.push(c);
            scratch.word_chars += 1;
        }
    }

    /// Appends the pieces of the word gathered so far, and starts the next.
    fn end_word(&self, ids: &mut Vec<u32>, scratch: &mut Scratch) {
        if !scratch.word.is_empty() {
            self.pieces(&scratch.word, scratch.word_chars, ids, &mut scratch.piece);
            scratch.word.clear();
            scratch.word_chars = 0;
        }
    }

    /// Appends the pieces of one word (`chars` characters), or `[UNK]`.
    fn pieces(&self, word: &str, chars: usize, ids: &mut Vec<u32>, piece: &mut String) {
        if chars > self.max_word_chars {
            ids.push(self.unk);
            return;
        }
        let first = ids.len();
        let mut start = 0;
        while start < word.len() {
            let rest = &word[start..];
            let mut end = rest.len().min(if start == 0 {
                self.longest
            } else {
                self.longest_continuing
            });
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            let found = loop {
                if end == 0 {
                    break None;
                }
                let candidate = &rest[..end];
                let id = if start == 0 {
                    self.vocab.get(candidate)
                } else {
                    piece.truncate(self.prefix.len());
                    piece.push_str(candidate);
                    self.vocab.get(piece.as_str())
                };
                if let Some(&id) = id {
                    break Some(id);
                }
                end -= 1;
                while !rest.is_char_boundary(end) {
                    end -= 1;
                }
            };
            match found {
                Some(id) => {
                    ids.push(id);
                    start += end;
                }
                None => {
                    ids.truncate(first);
                    ids.push(self.unk);
                    return;
                }
            }
        }
    }
}

/// What `clean_text` drops: U+0000, U+FFFD, and HF's control characters (Cc, Cf, Co, but
/// not `\t`, `\n`, `\r`).
fn is_dropped(c: char) -> bool {
    if c.is_ascii() {
        (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || c == '\x7f'
    } else {
        c == '\u{fffd}' || in_table(OTHER, c)
    }
}

/// BERT's punctuation: ASCII punctuation (`$`, `+`, `<`, `=`, `>`, `^`, `` ` ``, `|`, `~`
/// too), or general category P*.
fn is_punctuation(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_punctuation()
    } else {
        in_table(PUNCTUATION, c)
    }
}

fn is_nonspacing_mark(c: char) -> bool {
    !c.is_ascii() && in_table(NONSPACING_MARK, c)
}

/// HF's "Chinese characters": the CJK Unified Ideographs blocks, as `tokenizers` writes
/// them (its Extension E starts at 0x2B920 where Google's BERT has 0x2B820).
fn is_chinese(c: char) -> bool {
    matches!(
        u32::from(c),
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Whether `c` is in a table of half-open ranges `[start, end)`, flattened and sorted:
/// inside one when an odd number of bounds are at or below it.
fn in_table(table: &[u32], c: char) -> bool {
    table.partition_point(|&bound| bound <= u32::from(c)) % 2 == 1
}

// The tables: the general categories of the `unicode_categories` crate (0.1.1) that HF's
// normalizer and pre-tokenizer call, from U+0080 on, as `[start, end)` pairs. Made by
// running, over every char from U+0080, `c.is_punctuation()`, `c.is_mark_nonspacing()` and
// `c.is_other()` (Cc | Cf | Co) and printing each run of chars where it holds.

/// General category P* (152 ranges).
const PUNCTUATION: &[u32] = &[
    0xA1, 0xA2, 0xA7, 0xA8, 0xAB, 0xAC, 0xB6, 0xB8, 0xBB, 0xBC, 0xBF, 0xC0, 0x37E, 0x37F, 0x387, 0x388, 0x55A, 0x560,
    0x589, 0x58B, 0x5BE, 0x5BF, 0x5C0, 0x5C1, 0x5C3, 0x5C4, 0x5C6, 0x5C7, 0x5F3, 0x5F5, 0x609, 0x60B, 0x60C, 0x60E,
    0x61B, 0x61C, 0x61E, 0x620, 0x66A, 0x66E, 0x6D4, 0x6D5, 0x700, 0x70E, 0x7F7, 0x7FA, 0x830, 0x83F, 0x85E, 0x85F,
    0x964, 0x966, 0x970, 0x971, 0xAF0, 0xAF1, 0xDF4, 0xDF5, 0xE4F, 0xE50, 0xE5A, 0xE5C, 0xF04, 0xF13, 0xF14, 0xF15,
    0xF3A, 0xF3E, 0xF85, 0xF86, 0xFD0, 0xFD5, 0xFD9, 0xFDB, 0x104A, 0x1050, 0x10FB, 0x10FC, 0x1360, 0x1369, 0x1400,
    0x1401, 0x166D, 0x166F, 0x169B, 0x169D, 0x16EB, 0x16EE, 0x1735, 0x1737, 0x17D4, 0x17D7, 0x17D8, 0x17DB, 0x1800,
    0x180B, 0x1944, 0x1946, 0x1A1E, 0x1A20, 0x1AA0, 0x1AA7, 0x1AA8, 0x1AAE, 0x1B5A, 0x1B61, 0x1BFC, 0x1C00, 0x1C3B,
    0x1C40, 0x1C7E, 0x1C80, 0x1CC0, 0x1CC8, 0x1CD3, 0x1CD4, 0x2010, 0x2028, 0x2030, 0x2044, 0x2045, 0x2052, 0x2053,
    0x205F, 0x207D, 0x207F, 0x208D, 0x208F, 0x2308, 0x230C, 0x2329, 0x232B, 0x2768, 0x2776, 0x27C5, 0x27C7, 0x27E6,
    0x27F0, 0x2983, 0x2999, 0x29D8, 0x29DC, 0x29FC, 0x29FE, 0x2CF9, 0x2CFD, 0x2CFE, 0x2D00, 0x2D70, 0x2D71, 0x2E00,
    0x2E2F, 0x2E30, 0x2E43, 0x3001, 0x3004, 0x3008, 0x3012, 0x3014, 0x3020, 0x3030, 0x3031, 0x303D, 0x303E, 0x30A0,
    0x30A1, 0x30FB, 0x30FC, 0xA4FE, 0xA500, 0xA60D, 0xA610, 0xA673, 0xA674, 0xA67E, 0xA67F, 0xA6F2, 0xA6F8, 0xA874,
    0xA878, 0xA8CE, 0xA8D0, 0xA8F8, 0xA8FB, 0xA8FC, 0xA8FD, 0xA92E, 0xA930, 0xA95F, 0xA960, 0xA9C1, 0xA9CE, 0xA9DE,
    0xA9E0, 0xAA5C, 0xAA60, 0xAADE, 0xAAE0, 0xAAF0, 0xAAF2, 0xABEB, 0xABEC, 0xFD3E, 0xFD40, 0xFE10, 0xFE1A, 0xFE30,
    0xFE53, 0xFE54, 0xFE62, 0xFE63, 0xFE64, 0xFE68, 0xFE69, 0xFE6A, 0xFE6C, 0xFF01, 0xFF04, 0xFF05, 0xFF0B, 0xFF0C,
    0xFF10, 0xFF1A, 0xFF1C, 0xFF1F, 0xFF21, 0xFF3B, 0xFF3E, 0xFF3F, 0xFF40, 0xFF5B, 0xFF5C, 0xFF5D, 0xFF5E, 0xFF5F,
    0xFF66, 0x10100, 0x10103, 0x1039F, 0x103A0, 0x103D0, 0x103D1, 0x1056F, 0x10570, 0x10857, 0x10858, 0x1091F, 0x10920,
    0x1093F, 0x10940, 0x10A50, 0x10A59, 0x10A7F, 0x10A80, 0x10AF0, 0x10AF7, 0x10B39, 0x10B40, 0x10B99, 0x10B9D,
    0x11047, 0x1104E, 0x110BB, 0x110BD, 0x110BE, 0x110C2, 0x11140, 0x11144, 0x11174, 0x11176, 0x111C5, 0x111CA,
    0x111CD, 0x111CE, 0x111DB, 0x111DC, 0x111DD, 0x111E0, 0x11238, 0x1123E, 0x112A9, 0x112AA, 0x114C6, 0x114C7,
    0x115C1, 0x115D8, 0x11641, 0x11644, 0x1173C, 0x1173F, 0x12470, 0x12475, 0x16A6E, 0x16A70, 0x16AF5, 0x16AF6,
    0x16B37, 0x16B3C, 0x16B44, 0x16B45, 0x1BC9F, 0x1BCA0, 0x1DA87, 0x1DA8C,
];

/// General category Mn (266 ranges).
const NONSPACING_MARK: &[u32] = &[
    0x300, 0x370, 0x483, 0x488, 0x591, 0x5BE, 0x5BF, 0x5C0, 0x5C1, 0x5C3, 0x5C4, 0x5C6, 0x5C7, 0x5C8, 0x610, 0x61B,
    0x64B, 0x660, 0x670, 0x671, 0x6D6, 0x6DD, 0x6DF, 0x6E5, 0x6E7, 0x6E9, 0x6EA, 0x6EE, 0x711, 0x712, 0x730, 0x74B,
    0x7A6, 0x7B1, 0x7EB, 0x7F4, 0x816, 0x81A, 0x81B, 0x824, 0x825, 0x828, 0x829, 0x82E, 0x859, 0x85C, 0x8E3, 0x903,
    0x93A, 0x93B, 0x93C, 0x93D, 0x941, 0x949, 0x94D, 0x94E, 0x951, 0x958, 0x962, 0x964, 0x981, 0x982, 0x9BC, 0x9BD,
    0x9C1, 0x9C5, 0x9CD, 0x9CE, 0x9E2, 0x9E4, 0xA01, 0xA03, 0xA3C, 0xA3D, 0xA41, 0xA43, 0xA47, 0xA49, 0xA4B, 0xA4E,
    0xA51, 0xA52, 0xA70, 0xA72, 0xA75, 0xA76, 0xA81, 0xA83, 0xABC, 0xABD, 0xAC1, 0xAC6, 0xAC7, 0xAC9, 0xACD, 0xACE,
    0xAE2, 0xAE4, 0xB01, 0xB02, 0xB3C, 0xB3D, 0xB3F, 0xB40, 0xB41, 0xB45, 0xB4D, 0xB4E, 0xB56, 0xB57, 0xB62, 0xB64,
    0xB82, 0xB83, 0xBC0, 0xBC1, 0xBCD, 0xBCE, 0xC00, 0xC01, 0xC3E, 0xC41, 0xC46, 0xC49, 0xC4A, 0xC4E, 0xC55, 0xC57,
    0xC62, 0xC64, 0xC81, 0xC82, 0xCBC, 0xCBD, 0xCBF, 0xCC0, 0xCC6, 0xCC7, 0xCCC, 0xCCE, 0xCE2, 0xCE4, 0xD01, 0xD02,
    0xD41, 0xD45, 0xD4D, 0xD4E, 0xD62, 0xD64, 0xDCA, 0xDCB, 0xDD2, 0xDD5, 0xDD6, 0xDD7, 0xE31, 0xE32, 0xE34, 0xE3B,
    0xE47, 0xE4F, 0xEB1, 0xEB2, 0xEB4, 0xEBA, 0xEBB, 0xEBD, 0xEC8, 0xECE, 0xF18, 0xF1A, 0xF35, 0xF36, 0xF37, 0xF38,
    0xF39, 0xF3A, 0xF71, 0xF7F, 0xF80, 0xF85, 0xF86, 0xF88, 0xF8D, 0xF98, 0xF99, 0xFBD, 0xFC6, 0xFC7, 0x102D, 0x1031,
    0x1032, 0x1038, 0x1039, 0x103B, 0x103D, 0x103F, 0x1058, 0x105A, 0x105E, 0x1061, 0x1071, 0x1075, 0x1082, 0x1083,
    0x1085, 0x1087, 0x108D, 0x108E, 0x109D, 0x109E, 0x135D, 0x1360, 0x1712, 0x1715, 0x1732, 0x1735, 0x1752, 0x1754,
    0x1772, 0x1774, 0x17B4, 0x17B6, 0x17B7, 0x17BE, 0x17C6, 0x17C7, 0x17C9, 0x17D4, 0x17DD, 0x17DE, 0x180B, 0x180E,
    0x18A9, 0x18AA, 0x1920, 0x1923, 0x1927, 0x1929, 0x1932, 0x1933, 0x1939, 0x193C, 0x1A17, 0x1A19, 0x1A1B, 0x1A1C,
    0x1A56, 0x1A57, 0x1A58, 0x1A5F, 0x1A60, 0x1A61, 0x1A62, 0x1A63, 0x1A65, 0x1A6D, 0x1A73, 0x1A7D, 0x1A7F, 0x1A80,
    0x1AB0, 0x1ABE, 0x1B00, 0x1B04, 0x1B34, 0x1B35, 0x1B36, 0x1B3B, 0x1B3C, 0x1B3D, 0x1B42, 0x1B43, 0x1B6B, 0x1B74,
    0x1B80, 0x1B82, 0x1BA2, 0x1BA6, 0x1BA8, 0x1BAA, 0x1BAB, 0x1BAE, 0x1BE6, 0x1BE7, 0x1BE8, 0x1BEA, 0x1BED, 0x1BEE,
    0x1BEF, 0x1BF2, 0x1C2C, 0x1C34, 0x1C36, 0x1C38, 0x1CD0, 0x1CD3, 0x1CD4, 0x1CE1, 0x1CE2, 0x1CE9, 0x1CED, 0x1CEE,
    0x1CF4, 0x1CF5, 0x1CF8, 0x1CFA, 0x1DC0, 0x1DF6, 0x1DFC, 0x1E00, 0x20D0, 0x20DD, 0x20E1, 0x20E2, 0x20E5, 0x20F1,
    0x2CEF, 0x2CF2, 0x2D7F, 0x2D80, 0x2DE0, 0x2E00, 0x302A, 0x302E, 0x3099, 0x309B, 0xA66F, 0xA670, 0xA674, 0xA67E,
    0xA69E, 0xA6A0, 0xA6F0, 0xA6F2, 0xA802, 0xA803, 0xA806, 0xA807, 0xA80B, 0xA80C, 0xA825, 0xA827, 0xA8C4, 0xA8C5,
    0xA8E0, 0xA8F2, 0xA926, 0xA92E, 0xA947, 0xA952, 0xA980, 0xA983, 0xA9B3, 0xA9B4, 0xA9B6, 0xA9BA, 0xA9BC, 0xA9BD,
    0xA9E5, 0xA9E6, 0xAA29, 0xAA2F, 0xAA31, 0xAA33, 0xAA35, 0xAA37, 0xAA43, 0xAA44, 0xAA4C, 0xAA4D, 0xAA7C, 0xAA7D,
    0xAAB0, 0xAAB1, 0xAAB2, 0xAAB5, 0xAAB7, 0xAAB9, 0xAABE, 0xAAC0, 0xAAC1, 0xAAC2, 0xAAEC, 0xAAEE, 0xAAF6, 0xAAF7,
    0xABE5, 0xABE6, 0xABE8, 0xABE9, 0xABED, 0xABEE, 0xFB1E, 0xFB1F, 0xFE00, 0xFE10, 0xFE20, 0xFE30, 0x101FD, 0x101FE,
    0x102E0, 0x102E1, 0x10376, 0x1037B, 0x10A01, 0x10A04, 0x10A05, 0x10A07, 0x10A0C, 0x10A10, 0x10A38, 0x10A3B,
    0x10A3F, 0x10A40, 0x10AE5, 0x10AE7, 0x11001, 0x11002, 0x11038, 0x11047, 0x1107F, 0x11082, 0x110B3, 0x110B7,
    0x110B9, 0x110BB, 0x11100, 0x11103, 0x11127, 0x1112C, 0x1112D, 0x11135, 0x11173, 0x11174, 0x11180, 0x11182,
    0x111B6, 0x111BF, 0x111CA, 0x111CD, 0x1122F, 0x11232, 0x11234, 0x11235, 0x11236, 0x11238, 0x112DF, 0x112E0,
    0x112E3, 0x112EB, 0x11300, 0x11302, 0x1133C, 0x1133D, 0x11340, 0x11341, 0x11366, 0x1136D, 0x11370, 0x11375,
    0x114B3, 0x114B9, 0x114BA, 0x114BB, 0x114BF, 0x114C1, 0x114C2, 0x114C4, 0x115B2, 0x115B6, 0x115BC, 0x115BE,
    0x115BF, 0x115C1, 0x115DC, 0x115DE, 0x11633, 0x1163B, 0x1163D, 0x1163E, 0x1163F, 0x11641, 0x116AB, 0x116AC,
    0x116AD, 0x116AE, 0x116B0, 0x116B6, 0x116B7, 0x116B8, 0x1171D, 0x11720, 0x11722, 0x11726, 0x11727, 0x1172C,
    0x16AF0, 0x16AF5, 0x16B30, 0x16B37, 0x16F8F, 0x16F93, 0x1BC9D, 0x1BC9F, 0x1D167, 0x1D16A, 0x1D17B, 0x1D183,
    0x1D185, 0x1D18C, 0x1D1AA, 0x1D1AE, 0x1D242, 0x1D245, 0x1DA00, 0x1DA37, 0x1DA3B, 0x1DA6D, 0x1DA75, 0x1DA76,
    0x1DA84, 0x1DA85, 0x1DA9B, 0x1DAA0, 0x1DAA1, 0x1DAB0, 0x1E8D0, 0x1E8D7, 0xE0100, 0xE01F0,
];

/// General categories Cc, Cf and Co (21 ranges).
const OTHER: &[u32] = &[
    0x80, 0xA0, 0xAD, 0xAE, 0x600, 0x606, 0x61C, 0x61D, 0x6DD, 0x6DE, 0x70F, 0x710, 0x180E, 0x180F, 0x200B, 0x2010,
    0x202A, 0x202F, 0x2060, 0x2065, 0x2066, 0x2070, 0xE000, 0xF900, 0xFEFF, 0xFF00, 0xFFF9, 0xFFFC, 0x110BD, 0x110BE,
    0x1BCA0, 0x1BCA4, 0x1D173, 0x1D17B, 0xE0001, 0xE0002, 0xE0020, 0xE0080, 0xF0000, 0xFFFFE, 0x100000, 0x10FFFE,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// The model the tests read: `MCP_GATEWAY_SEARCH_MODEL`, or what scripts/setup-test-deps
    /// installs.
    fn model_dir() -> PathBuf {
        let dir = std::env::var_os("MCP_GATEWAY_SEARCH_MODEL").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/models/all-MiniLM-L6-v2"),
            Into::into,
        );
        assert!(
            dir.join("tokenizer.json").exists(),
            "no search model's tokenizer.json in {} (scripts/setup-test-deps installs the model; or set \
             MCP_GATEWAY_SEARCH_MODEL to its folder)",
            dir.display()
        );
        dir
    }

    fn tokenizer_json() -> String {
        std::fs::read_to_string(model_dir().join("tokenizer.json")).expect("read tokenizer.json")
    }

    #[derive(Deserialize)]
    struct Case {
        text: String,
        max_len: usize,
        ids: Vec<u32>,
    }

    /// HF's ids (scripts/search-model-reference).
    fn reference() -> Vec<Case> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search/wordpiece.json");
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read wordpiece.json")).expect("wordpiece.json")
    }

    fn assert_all_match(tokenizer: &WordPiece, cases: &[Case]) {
        let wrong: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                let ids = tokenizer.encode(&c.text, c.max_len);
                (ids != c.ids).then(|| {
                    format!(
                        "{:?} (max_len {}):\n  got  {ids:?}\n  want {:?}",
                        c.text, c.max_len, c.ids
                    )
                })
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {} texts differ from HF's ids:\n{}",
            wrong.len(),
            cases.len(),
            wrong.join("\n")
        );
    }

    #[test]
    fn ids_are_hf_tokenizers_ids() {
        let tokenizer = WordPiece::from_tokenizer_json(&tokenizer_json()).expect("tokenizer.json");
        let cases = reference();
        assert!(cases.len() >= 40, "{} texts", cases.len());
        // The reference reaches truncation at 16 and 256, and the words HF gives [UNK].
        assert!(cases.iter().any(|c| c.max_len == 16 && c.ids.len() == 16));
        assert!(cases.iter().any(|c| c.max_len == 256 && c.ids.len() == 256));
        assert!(cases.iter().any(|c| c.ids.contains(&tokenizer.unk)));
        assert_all_match(&tokenizer, &cases);
    }

    /// The same vocabulary as a vocab.txt, lower-casing: the same ids.
    #[test]
    fn a_vocab_txt_gives_the_same_ids() {
        let json: serde_json::Value = serde_json::from_str(&tokenizer_json()).expect("json");
        let vocab = json["model"]["vocab"].as_object().expect("model.vocab");
        let mut lines = vec![""; vocab.len()];
        for (token, id) in vocab {
            let id = usize::try_from(id.as_u64().expect("id")).expect("id");
            lines[id] = token.as_str();
        }
        let tokenizer = WordPiece::from_vocab_txt(&(lines.join("\n") + "\n"), true).expect("vocab.txt");
        assert_all_match(&tokenizer, &reference());
        // Without lower-casing, accents and capitals stay (and are no pieces of this model).
        let cased = WordPiece::from_vocab_txt(&lines.join("\r\n"), false).expect("vocab.txt");
        assert_eq!(cased.encode("the Café", 16), [101, 1996, 100, 102]);
    }

    #[test]
    fn other_models_and_broken_files_are_errors_naming_what_is_wrong() {
        let err = |text: &str| WordPiece::from_tokenizer_json(text).err().expect("an error");
        let bpe = r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel"}, "post_processor": null, "added_tokens": []}"#;
        let e = err(bpe);
        assert!(e.contains("model.type is \"BPE\"") && e.contains("WordPiece"), "{e}");
        let unigram = r#"{"model": {"type": "Unigram", "vocab": [["a", -1.0]]}}"#;
        assert!(err(unigram).contains("\"Unigram\""), "{}", err(unigram));
        assert!(err("{}").contains("not a tokenizer.json"));
        assert!(err("not json").contains("not a tokenizer.json"));
        let bert = |vocab: &str, pre: &str| {
            format!(
                r#"{{"model": {{"type": "WordPiece", "vocab": {vocab}}}, "normalizer": {{"type": "BertNormalizer"}},
                "pre_tokenizer": {{"type": "{pre}"}}, "post_processor": {{"type": "TemplateProcessing"}}}}"#
            )
        };
        let e = err(&bert(r#"{"[UNK]": 0, "[SEP]": 1, "a": 2}"#, "BertPreTokenizer"));
        assert!(e.contains("\"[CLS]\""), "{e}");
        let e = err(&bert(r#"{"[CLS]": 0, "[SEP]": 1, "a": 2}"#, "BertPreTokenizer"));
        assert!(e.contains("\"[UNK]\""), "{e}");
        let e = err(&bert(r#"{"[CLS]": 0, "[UNK]": 1, "a": 2}"#, "BertPreTokenizer"));
        assert!(e.contains("\"[SEP]\""), "{e}");
        let e = err(&bert(r#"{"[CLS]": 0, "[SEP]": 1, "[UNK]": 2}"#, "Whitespace"));
        assert!(e.contains("pre_tokenizer.type is \"Whitespace\""), "{e}");
        let e = err(&bert(r#"["[CLS]"]"#, "BertPreTokenizer"));
        assert!(e.contains("model.vocab"), "{e}");
        let e = WordPiece::from_vocab_txt("[CLS]\n[SEP]\nhello\n", true)
            .err()
            .expect("no [UNK]");
        assert!(e.contains("\"[UNK]\""), "{e}");
        // A small model of its own: defaults where the file says nothing.
        let small = WordPiece::from_tokenizer_json(&bert(
            r###"{"[CLS]": 0, "[SEP]": 1, "[UNK]": 2, "un": 3, "##aff": 4, "##able": 5, "!": 6}"###,
            "BertPreTokenizer",
        ))
        .expect("small model");
        assert_eq!(small.encode("Unaffable!", 10), [0, 3, 4, 5, 6, 1]);
        assert_eq!(small.encode("unaffablex", 10), [0, 2, 1]);
        assert_eq!(small.encode("UNAFFABLE unaffable", 4), [0, 3, 4, 1]);
    }

    /// The tables are sorted `[start, end)` pairs, and hold what they should.
    #[test]
    fn the_category_tables_are_well_formed() {
        for table in [PUNCTUATION, NONSPACING_MARK, OTHER] {
            assert!(table.len() % 2 == 0 && table.windows(2).all(|w| w[0] < w[1]));
        }
        for c in [
            '¡', '§', '«', '»', '¿', '·', '\u{2010}', '—', '“', '”', '…', '‰', '※', '、', '。', '「', '・', '！', '（',
            '｝',
        ] {
            assert!(is_punctuation(c), "{c:?} is punctuation");
        }
        for c in ['a', 'é', '€', '©', '°', '⁄', '⁒', '→', '中', 'ー', '🚀', '＄', '＋'] {
            assert!(!is_punctuation(c), "{c:?} is not punctuation");
        }
        for c in ['\u{300}', '\u{301}', '\u{36f}', '\u{3099}', '\u{94d}', '\u{fe0f}'] {
            assert!(is_nonspacing_mark(c), "{c:?} is Mn");
        }
        for c in ['e', '\u{20dd}', '\u{903}'] {
            assert!(!is_nonspacing_mark(c), "{c:?} is not Mn");
        }
        for c in [
            '\0', '\x07', '\x7f', '\u{85}', '\u{ad}', '\u{200b}', '\u{200d}', '\u{feff}', '\u{e000}', '\u{fffd}',
        ] {
            assert!(is_dropped(c), "{c:?} is dropped");
        }
        for c in ['\t', '\n', '\r', ' ', 'a', '\u{a0}', '\u{3000}', '\u{2028}'] {
            assert!(!is_dropped(c), "{c:?} is kept");
        }
    }

    /// Rough speed: `cargo test --lib wordpiece::tests::speed -- --ignored --nocapture`
    /// (with the dev profile, much slower than a release build).
    #[test]
    #[ignore]
    fn speed() {
        let tokenizer = WordPiece::from_tokenizer_json(&tokenizer_json()).expect("tokenizer.json");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search/servers");
        let mut texts = Vec::new();
        for entry in std::fs::read_dir(dir).expect("servers") {
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(entry.expect("entry").path()).expect("read"))
                    .expect("json");
            for tool in json["tools"].as_array().expect("tools") {
                texts.push(tool["description"].as_str().unwrap_or("").to_string());
            }
        }
        let queries = [
            "open a ticket about the login crash",
            "which payments did Jane make last week",
        ];
        let all: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (ascii, other): (Vec<&str>, Vec<&str>) = all.iter().partition(|t| t.is_ascii());
        for (what, texts, max_len) in [
            ("tool description", all, 256),
            ("ASCII tool description", ascii, 256),
            ("non-ASCII tool description", other, 256),
            ("query", queries.to_vec(), 256),
        ] {
            let rounds = 20_000 / texts.len() + 1;
            let mut ids = 0;
            let start = std::time::Instant::now();
            for _ in 0..rounds {
                for t in &texts {
                    ids += std::hint::black_box(tokenizer.encode(t, max_len)).len();
                }
            }
            let n = (rounds * texts.len()) as f64;
            let ns = start.elapsed().as_nanos() as f64 / n;
            eprintln!(
                "{what}: {ns:.0} ns each, {:.0} ids on average, {} texts",
                ids as f64 / n,
                texts.len()
            );
        }
    }
}
