//! An incremental parser for `text/event-stream` (the WHATWG event stream format), as
//! downstream HTTP servers send it. Pure: feed it bytes, take events out.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Event {
    /// `event:`; empty means `message`.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// `id:` of this event, if it set one.
    pub id: Option<String>,
    /// `retry:` in milliseconds, if the event carried one.
    pub retry: Option<u64>,
}

/// An event (or a line of one) longer than the parser's limit: how long it had grown,
/// and the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TooLong(pub usize, pub usize);

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an SSE event of more than {} bytes, over the gateway's limit of {} (gateway.max_line)",
            self.0, self.1
        )
    }
}

/// Parses an event stream chunk by chunk.
pub struct Parser {
    buf: Vec<u8>,
    /// How far into `buf` no line end was found (a lone CR at its end excepted): the next
    /// chunk is searched from there, so a long line costs its length once, not once per
    /// chunk.
    scanned: usize,
    current: Event,
    has_data: bool,
    /// The longest line, and the most data of one event, accepted.
    max: usize,
    /// The last event id seen, for `Last-Event-ID` on reconnect.
    pub last_id: Option<String>,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser::with_limit(usize::MAX)
    }
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// A parser that refuses a line, or an event's data, over `max` bytes.
    pub fn with_limit(max: usize) -> Parser {
        Parser {
            buf: Vec::new(),
            scanned: 0,
            current: Event::default(),
            has_data: false,
            max,
            last_id: None,
        }
    }

    /// Feeds bytes; returns every event completed by them, or how long the line or event
    /// that went over the limit had grown (the stream is then to be dropped).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLong> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        let mut from = self.scanned.min(self.buf.len());
        loop {
            let Some(pos) = memchr::memchr2(b'\n', b'\r', &self.buf[from..]) else {
                from = self.buf.len();
                break;
            };
            let end = from + pos;
            // A lone '\r' at the end of the buffer may be the first half of "\r\n".
            if self.buf[end] == b'\r' && end + 1 == self.buf.len() {
                from = end;
                break;
            }
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            let skip = if self.buf[end] == b'\r' && self.buf.get(end + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            start = end + skip;
            from = start;
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
            if self.current.data.len() > self.max {
                return Err(TooLong(self.current.data.len(), self.max));
            }
        }
        self.buf.drain(..start);
        self.scanned = from - start;
        if self.buf.len() > self.max {
            return Err(TooLong(self.buf.len(), self.max));
        }
        Ok(out)
    }

    /// The stream ended: a lone CR it ended with ends its line (and so may complete an
    /// event); an unfinished line or event is dropped, as the format says.
    pub fn finish(&mut self) -> Vec<Event> {
        if self.buf.last() != Some(&b'\r') {
            return Vec::new();
        }
        self.buf.pop();
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        self.scanned = 0;
        self.line(&line).into_iter().collect()
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let mut ev = std::mem::take(&mut self.current);
            let had = std::mem::take(&mut self.has_data);
            if ev.id.is_some() {
                self.last_id = ev.id.clone();
            }
            if !had {
                // An event without data is not dispatched, but its id and retry still count.
                return ev.retry.map(|r| Event {
                    retry: Some(r),
                    id: ev.id.take(),
                    ..Event::default()
                });
            }
            return Some(ev);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.current.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.current.id = Some(value.to_owned()),
            "retry" => self.current.retry = value.parse().ok(),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_across_chunks_and_line_endings() {
        let mut p = Parser::new();
        let mut evs = p.feed(b"event: endpoint\r\ndata: /messages?s=1\r").unwrap();
        evs.extend(
            p.feed(b"\n\r\n: comment\n\nid: 7\nretry: 3000\ndata: {\"a\":\n")
                .unwrap(),
        );
        evs.extend(p.feed(b"data: 1}\n\n").unwrap());
        assert_eq!(evs.len(), 2, "{evs:?}");
        assert_eq!(evs[0].event, "endpoint");
        assert_eq!(evs[0].data, "/messages?s=1");
        assert_eq!(evs[1].data, "{\"a\":\n1}");
        assert_eq!(evs[1].id.as_deref(), Some("7"));
        assert_eq!(evs[1].retry, Some(3000));
        assert_eq!(p.last_id.as_deref(), Some("7"));
    }

    #[test]
    fn a_long_line_in_small_chunks_is_found_once_and_bounded() {
        let mut p = Parser::with_limit(1 << 20);
        let line = format!("data: {}\n", "x".repeat(300_000));
        let mut evs = Vec::new();
        for c in line.as_bytes().chunks(1000) {
            evs.extend(p.feed(c).unwrap());
        }
        // \r then \n in two chunks: one line end.
        evs.extend(p.feed(b"\r").unwrap());
        evs.extend(p.feed(b"\n").unwrap());
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data.len(), 300_000);
        // Over the limit: a line, and an event's data over many lines.
        let mut p = Parser::with_limit(1000);
        assert_eq!(p.feed(&[b'a'; 600]), Ok(vec![]));
        assert_eq!(p.feed(&[b'a'; 600]), Err(TooLong(1200, 1000)));
        let mut p = Parser::with_limit(1000);
        let many = "data: 0123456789\n".repeat(100);
        assert!(matches!(p.feed(many.as_bytes()), Err(TooLong(n, 1000)) if n > 1000));
    }

    #[test]
    fn a_lone_cr_that_ends_the_stream_ends_its_event() {
        let mut p = Parser::new();
        assert_eq!(p.feed(b"data: {}\r\r"), Ok(vec![]));
        let evs = p.finish();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "{}");
        // An unfinished line is dropped.
        let mut p = Parser::new();
        assert_eq!(
            p.feed(b"data: {}\n\ndata: x"),
            Ok(vec![Event {
                data: "{}".into(),
                ..Event::default()
            }])
        );
        assert!(p.finish().is_empty());
    }

    #[test]
    fn priming_event_sets_id_without_data() {
        let mut p = Parser::new();
        let evs = p.feed(b"id: abc\ndata:\n\n").unwrap();
        // `data:` with an empty value is still data.
        assert_eq!(evs.len(), 1);
        assert_eq!(p.last_id.as_deref(), Some("abc"));
        let evs = p.feed(b"id: def\nretry: 10\n\n").unwrap();
        assert_eq!(
            evs,
            vec![Event {
                retry: Some(10),
                id: Some("def".into()),
                ..Event::default()
            }]
        );
    }
}
