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

/// Parses an event stream chunk by chunk.
#[derive(Default)]
pub struct Parser {
    buf: Vec<u8>,
    current: Event,
    has_data: bool,
    /// The last event id seen, for `Last-Event-ID` on reconnect.
    pub last_id: Option<String>,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Feeds bytes; returns every event completed by them.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n' || b == b'\r') {
            let end = start + pos;
            // A lone '\r' at the end of the buffer may be the first half of "\r\n".
            if self.buf[end] == b'\r' && end + 1 == self.buf.len() {
                break;
            }
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            let skip = if self.buf[end] == b'\r' && self.buf.get(end + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            start = end + skip;
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
        }
        self.buf.drain(..start);
        out
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
        let mut evs = p.feed(b"event: endpoint\r\ndata: /messages?s=1\r");
        evs.extend(p.feed(b"\n\r\n: comment\n\nid: 7\nretry: 3000\ndata: {\"a\":\n"));
        evs.extend(p.feed(b"data: 1}\n\n"));
        assert_eq!(evs.len(), 2, "{evs:?}");
        assert_eq!(evs[0].event, "endpoint");
        assert_eq!(evs[0].data, "/messages?s=1");
        assert_eq!(evs[1].data, "{\"a\":\n1}");
        assert_eq!(evs[1].id.as_deref(), Some("7"));
        assert_eq!(evs[1].retry, Some(3000));
        assert_eq!(p.last_id.as_deref(), Some("7"));
    }

    #[test]
    fn priming_event_sets_id_without_data() {
        let mut p = Parser::new();
        let evs = p.feed(b"id: abc\ndata:\n\n");
        // `data:` with an empty value is still data.
        assert_eq!(evs.len(), 1);
        assert_eq!(p.last_id.as_deref(), Some("abc"));
        let evs = p.feed(b"id: def\nretry: 10\n\n");
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
