//! Complete JSON values, one after another, out of a body read in chunks: what a
//! Streamable HTTP server answers a POST with when it does not answer with SSE. That is
//! one JSON-RPC message (compact or pretty-printed), or, from servers that stream
//! without SSE (the reference everything-server's `subscriptions/listen`), one message a
//! line (NDJSON). Each value is handed on as soon as its last byte has arrived, so a
//! stream that never ends still delivers its messages.
//!
//! Values are found by counting brackets outside strings, each byte looked at once
//! (inside a string, `memchr` skips to the next quote or backslash), so a value of any
//! size costs one pass; each value, not the whole body, is bounded by `max`. A value
//! that arrives within one chunk is a slice of it (no copy).

use bytes::{Bytes, BytesMut};

/// A value (or what precedes it) is longer than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong;

/// The framing state of one body.
pub struct Values {
    /// The value being read, from its first byte, when it began in an earlier chunk.
    pending: BytesMut,
    /// Open brackets of the value being read (0: between values).
    depth: usize,
    in_string: bool,
    /// The chunk ended right after a backslash within a string.
    escaped: bool,
    /// Something other than an object or array stood between values: the rest is kept
    /// whole for [`Values::finish`] (which reports what it is).
    raw: bool,
    max: usize,
    /// How long the body says it is, if it says: room for a value that is most of it is
    /// reserved once (not grown by doubling, which holds up to twice its size).
    expected: Option<usize>,
}

impl Values {
    pub fn new(max: usize, expected: Option<u64>) -> Values {
        Values {
            pending: BytesMut::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            raw: false,
            max,
            expected: expected.and_then(|n| usize::try_from(n).ok()).map(|n| n.min(max)),
        }
    }

    /// The values that `chunk` completes, in order.
    pub fn feed(&mut self, chunk: &Bytes) -> Result<Vec<Bytes>, TooLong> {
        let mut out = Vec::new();
        if self.raw {
            return self.keep(chunk, 0).map(|()| out);
        }
        let b = &chunk[..];
        // Where the value being read began in this chunk (`None`: in an earlier one, its
        // bytes so far in `pending`, or no value is being read).
        let mut from: Option<usize> = None;
        let mut i = 0;
        if self.escaped && !b.is_empty() {
            self.escaped = false;
            i = 1;
        }
        while i < b.len() {
            if self.in_string {
                match memchr::memchr2(b'"', b'\\', &b[i..]) {
                    None => break,
                    Some(k) => {
                        i += k;
                        if b[i] == b'\\' {
                            if i + 1 == b.len() {
                                self.escaped = true;
                            }
                            i += 2;
                        } else {
                            self.in_string = false;
                            i += 1;
                        }
                        continue;
                    }
                }
            }
            let c = b[i];
            if self.depth == 0 {
                match c {
                    b' ' | b'\t' | b'\r' | b'\n' => {}
                    b'{' | b'[' => {
                        self.depth = 1;
                        from = Some(i);
                    }
                    _ => {
                        self.raw = true;
                        self.keep(chunk, i)?;
                        return Ok(out);
                    }
                }
            } else {
                match c {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            let value = match from.take() {
                                Some(f) => chunk.slice(f..=i),
                                None => {
                                    self.check(i + 1)?;
                                    self.pending.extend_from_slice(&b[..=i]);
                                    std::mem::take(&mut self.pending).freeze()
                                }
                            };
                            if value.len() > self.max {
                                return Err(TooLong);
                            }
                            out.push(value);
                        }
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        if self.depth > 0 {
            self.keep(chunk, from.unwrap_or(0))?;
        }
        Ok(out)
    }

    /// What is left when the body ends: bytes that are not (or not yet) a whole value,
    /// `None` when only whitespace is.
    pub fn finish(self) -> Option<Bytes> {
        let rest = self.pending.freeze();
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }

    /// Keeps `chunk[from..]` for a value that goes on in the next chunk.
    fn keep(&mut self, chunk: &Bytes, from: usize) -> Result<(), TooLong> {
        let more = chunk.len() - from;
        self.check(more)?;
        if self.pending.is_empty() {
            if let Some(n) = self.expected.take() {
                self.pending.reserve(n.max(more));
            }
        }
        self.pending.extend_from_slice(&chunk[from..]);
        Ok(())
    }

    fn check(&self, more: usize) -> Result<(), TooLong> {
        if self.pending.len().saturating_add(more) > self.max {
            Err(TooLong)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of `body` fed in pieces of `size` bytes.
    fn framed(body: &str, size: usize, max: usize) -> Result<(Vec<String>, Option<String>), TooLong> {
        let mut v = Values::new(max, None);
        let mut out = Vec::new();
        for piece in body.as_bytes().chunks(size) {
            out.extend(v.feed(&Bytes::copy_from_slice(piece))?);
        }
        let rest = v.finish().map(|r| String::from_utf8_lossy(&r).into_owned());
        Ok((
            out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect(),
            rest,
        ))
    }

    #[test]
    fn one_answer_compact_or_pretty_printed_is_one_value_however_it_is_cut() {
        let compact = r#"{"jsonrpc":"2.0","id":1,"result":{"a":[1,{"b":"}{]["}],"s":"\"}\\"}}"#;
        let pretty = "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1,\n  \"result\": {\n    \"x\": \"a\\\\\\\"}\"\n  }\n}\n";
        for body in [compact, pretty] {
            for size in 1..=body.len() {
                let (values, rest) = framed(body, size, 1 << 20).expect("fits");
                assert_eq!(values, vec![body.trim_end().to_owned()], "cut every {size} bytes");
                assert_eq!(rest, None);
                serde_json::from_str::<serde_json::Value>(&values[0]).expect("a whole value");
            }
        }
    }

    #[test]
    fn ndjson_gives_each_line_as_it_completes() {
        let body =
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/resources/updated\",\"params\":{\"uri\":\"a\\\\\"}}\n\
                    {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\r\n\
                    [{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}]\n{\"jsonrpc\":";
        for size in 1..=body.len() {
            let (values, rest) = framed(body, size, 1 << 20).expect("fits");
            assert_eq!(values.len(), 3, "cut every {size} bytes");
            assert!(values[0].ends_with("\"a\\\\\"}}"));
            assert!(values[2].starts_with('['));
            assert_eq!(rest.as_deref(), Some("{\"jsonrpc\":"), "the unfinished value is left");
        }
    }

    #[test]
    fn a_value_within_one_chunk_is_a_slice_of_it() {
        let chunk = Bytes::from_static(b"{\"id\":1}\n");
        let mut v = Values::new(1024, None);
        let out = v.feed(&chunk).expect("fits");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ptr(), chunk.as_ptr(), "no copy");
    }

    #[test]
    fn each_value_is_bounded_not_the_body() {
        let line = "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n";
        let body = line.repeat(100);
        let (values, _) = framed(&body, 7, line.len()).expect("each line fits");
        assert_eq!(values.len(), 100);
        assert_eq!(framed(&body, 7, line.len() - 3).err(), Some(TooLong));
        // A value that never closes is refused once it is over the limit, not read on.
        let open = format!("{{\"a\":\"{}", "x".repeat(100));
        assert_eq!(framed(&open, 10, 50).err(), Some(TooLong));
    }

    #[test]
    fn what_is_no_object_or_array_is_kept_whole_for_the_caller() {
        let (values, rest) = framed("{\"a\":1} 42 {\"b\":2}", 3, 1024).expect("fits");
        assert_eq!(values, vec!["{\"a\":1}".to_owned()]);
        assert_eq!(rest.as_deref(), Some("42 {\"b\":2}"));
        let (values, rest) = framed("not json", 4, 1024).expect("fits");
        assert!(values.is_empty());
        assert_eq!(rest.as_deref(), Some("not json"));
        assert_eq!(framed("  \n", 1, 1024).expect("fits"), (vec![], None));
    }
}
