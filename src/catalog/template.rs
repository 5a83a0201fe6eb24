//! URI templates of `resources/templates/list`: which server a URI belongs to.

/// An RFC 6570 URI template, enough of it to decide whether a URI belongs to it.
#[derive(Debug, Clone)]
pub struct Template {
    pub source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    /// `{x}`: one or more characters, no `/`, `?` or `#`.
    Simple,
    /// `{+x}` / `{#x}`: anything, including `/`.
    Reserved,
    /// `{/x}`, `{.x}`, `{;x}`: the operator character then a value (possibly absent).
    Prefixed(char),
    /// `{?x}` / `{&x}`: an optional query part, to the end.
    Query,
}

impl Template {
    pub fn parse(s: &str) -> Template {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                parts.push(Part::Literal(rest[open..].to_owned()));
                rest = "";
                break;
            };
            let expr = &rest[open + 1..open + close];
            parts.push(match expr.chars().next() {
                Some('+') | Some('#') => Part::Reserved,
                Some(c @ ('/' | '.' | ';')) => Part::Prefixed(c),
                Some('?') | Some('&') => Part::Query,
                _ => Part::Simple,
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Template {
            source: s.to_owned(),
            parts,
        }
    }

    pub fn matches(&self, uri: &str) -> bool {
        // Without the memo, adjacent variables (`{a}{b}{c}…`) try every split of the URI
        // between them: exponential in their count. No allocation until a state fails.
        match_parts(&self.parts, uri, &mut std::collections::HashSet::new())
    }
}

/// Whether `s` matches `parts`. A state is (parts left, bytes left): both are suffixes of
/// the template's parts and of the URI, so `failed` remembers states known not to match
/// and each is explored once.
fn match_parts(parts: &[Part], s: &str, failed: &mut std::collections::HashSet<(usize, usize)>) -> bool {
    let Some((first, rest)) = parts.split_first() else {
        return s.is_empty();
    };
    if failed.contains(&(parts.len(), s.len())) {
        return false;
    }
    let matched = match first {
        Part::Literal(l) => s.strip_prefix(l.as_str()).is_some_and(|r| match_parts(rest, r, failed)),
        Part::Query => s.is_empty() || s.starts_with('?') || s.starts_with('&'),
        Part::Simple | Part::Reserved | Part::Prefixed(_) => {
            let (body, min) = match first {
                Part::Prefixed(c) => match s.strip_prefix(*c) {
                    Some(b) => (b, 0),
                    None => return match_parts(rest, s, failed),
                },
                _ => (s, 1),
            };
            let stop = |c: char| matches!(first, Part::Simple | Part::Prefixed(_)) && matches!(c, '/' | '?' | '#');
            let limit = body.find(stop).unwrap_or(body.len());
            // Try the longest value first, then shorter ones (backtracking).
            (min..=limit)
                .rev()
                .any(|n| body.is_char_boundary(n) && match_parts(rest, &body[n..], failed))
        }
    };
    if !matched {
        failed.insert((parts.len(), s.len()));
    }
    matched
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match() {
        let t = Template::parse("mock://a/items/{id}");
        assert!(t.matches("mock://a/items/42"));
        assert!(!t.matches("mock://a/items/"));
        assert!(!t.matches("mock://a/items/4/2"));
        assert!(!t.matches("mock://b/items/42"));
        assert!(Template::parse("file:///{+path}").matches("file:///a/b/c.txt"));
        assert!(Template::parse("api://x{/id}{?q}").matches("api://x/7?q=1"));
        assert!(Template::parse("test://template/{id}/data").matches("test://template/5/data"));
        // Adjacent variables: each needs a character; no exponential backtracking.
        let many = Template::parse(&"{v}".repeat(40));
        assert!(many.matches(&"x".repeat(40)) && !many.matches(&"x".repeat(39)));
        // Exponential without the memo; a few hundred tries with it.
        let t = std::time::Instant::now();
        assert!(!Template::parse(&format!("{}!", "{v}".repeat(10))).matches(&"x".repeat(36)));
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
    }
}
